//! Health never breaks a working TCP connection, through the real agent and
//! data plane: b1, b2, b3 weighted 1:1:2, probed by `tcp` on a separate health listener,
//! a long-lived TCP connection on b1. b1's health listener stops: b1 turns `unhealthy`
//! and leaves the table (`active: false`), yet the connection pinned to it keeps echoing
//! (its backend keeps `BACKEND_F_LIVE`), and new connections avoid b1. When the listener
//! returns, b1 is `up` and the connection still works. In nat and in dsr.

use std::{path::Path, time::Duration};

use lb_tests::{
    net::topology::Forwarding,
    scenario::{
        pinned::{self, PinnedToB1, VERDICT_WAIT},
        redundancy::{self, SourcePorts},
    },
    traffic::clients,
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const NEW_CONNECTIONS: usize = 200;
const DEADLINE: Duration = Duration::from_secs(60);

fn unhealthy_backend_keeps_its_connection(forwarding: Forwarding, subnet: u8) {
    let mode = forwarding.as_str();
    let topo = pinned::topology(forwarding, subnet);
    let mut bed = PinnedToB1::start(&topo, Path::new(TESTSERVER));
    let vip = bed.vip;
    let [b1, b2, b3] = bed.members;
    let members = bed.members;
    let name = |a| redundancy::name_of(&members, a);
    let client = topo.client();
    let mut ports = SourcePorts::new();

    bed.backends
        .kill_health("b1")
        .expect("stopping b1's health listener");
    let (view, took) = bed
        .api
        .wait_service("web", "b1 unhealthy and out", VERDICT_WAIT, |s| {
            s.server(b1.addr())
                .is_some_and(|v| v.state == "unhealthy" && !v.active)
        })
        .unwrap_or_else(|e| panic!("{mode}: b1's probe fails without its listener: {e}"));
    println!(
        "keeps connections {mode}: b1 unhealthy after {took:.2?}\n{}",
        view.describe(name)
    );
    for i in 0..3 {
        bed.pinned
            .check_echo(&format!("while b1 is unhealthy {i}"))
            .unwrap_or_else(|e| {
                panic!("{mode}: the connection pinned to unhealthy b1 must keep working: {e}")
            });
        std::thread::sleep(Duration::from_millis(300));
    }
    let tally = clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        ports.take(NEW_CONNECTIONS),
        vip,
        NEW_CONNECTIONS,
        DEADLINE,
    )
    .expect("entering the client namespace");
    println!(
        "keeps connections {mode}: {NEW_CONNECTIONS} new connections while b1 is unhealthy:\n{}",
        tally.table(&redundancy::shares(&[&b2, &b3]))
    );
    assert!(
        tally.failures.is_empty(),
        "{mode}: new connections must not fail: {:?}",
        tally.failures
    );
    assert_eq!(
        tally.share("b1"),
        0.0,
        "{mode}: no new connection may reach unhealthy b1"
    );
    bed.pinned
        .check_echo("after the new connections")
        .unwrap_or_else(|e| panic!("{mode}: the connection pinned to b1: {e}"));

    bed.b1_health_returns(mode);
    let status = bed.agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(
        status.success(),
        "lb-agent should exit 0 on SIGTERM, got {status}"
    );
}

#[test]
fn unhealthy_backend_keeps_its_connection_nat() {
    unhealthy_backend_keeps_its_connection(Forwarding::Nat, 171);
}

#[test]
fn unhealthy_backend_keeps_its_connection_dsr() {
    unhealthy_backend_keeps_its_connection(Forwarding::Dsr, 172);
}
