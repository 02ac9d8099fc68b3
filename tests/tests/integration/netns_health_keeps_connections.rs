//! Health never breaks a working TCP connection (issue 8, 3), through the real agent and
//! data plane: b1, b2, b3 weighted 1:1:2, probed by `tcp` on a separate health listener,
//! a long-lived TCP connection on b1. b1's health listener stops: b1 turns `unhealthy`
//! and leaves the table (`active: false`), yet the connection pinned to it keeps echoing
//! (its backend keeps `BACKEND_F_LIVE`), and new connections avoid b1. When the listener
//! returns, b1 is `up` and the connection still works. In nat and in dsr.

use std::{path::Path, time::Duration};

use lb_tests::{
    agent::api::Api,
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::WEIGHTS,
        redundancy::{self, Backends, HEALTH_PORT, Member, SourcePorts, TcpProbe},
    },
    traffic::clients,
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const VERDICT_WAIT: Duration = Duration::from_secs(15);
const NEW_CONNECTIONS: usize = 200;
const DEADLINE: Duration = Duration::from_secs(60);

fn unhealthy_backend_keeps_its_connection(forwarding: Forwarding, subnet: u8) {
    let mode = forwarding.as_str();
    let topo = Topology::builder()
        .backends(3)
        .forwarding(forwarding)
        .subnet(subnet)
        .build()
        .expect("building the topology");
    let h = topo.backends();
    let b1 = Member::primary("b1", &h[0], WEIGHTS[0]);
    let b2 = Member::primary("b2", &h[1], WEIGHTS[1]);
    let b3 = Member::primary("b3", &h[2], WEIGHTS[2]);
    let members = [b1, b2, b3];
    let mut backends = Backends::start(Path::new(TESTSERVER), &members, true)
        .expect("starting a testserver and a health listener per member");
    let probe = TcpProbe::fast().on_port(HEALTH_PORT);
    let service = redundancy::service(&topo, "web", &members, &probe, &[]);
    let vip = service.vip;
    let agent = lb_tests::scenario::balance::start_agent(&topo, vec![service], Some("native"))
        .expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let name = |a| redundancy::name_of(&members, a);
    let client = topo.client();
    let mut ports = SourcePorts::new();
    api.wait_service("web", "every server up", VERDICT_WAIT, |s| {
        s.servers.iter().all(|v| v.state == "up" && v.active)
    })
    .unwrap_or_else(|e| panic!("{mode}: all three servers should be up after start: {e}"));

    let mut pinned = redundancy::echo_on(&client.ns, client.ipv4.into(), vip, "b1", 60)
        .unwrap_or_else(|e| panic!("{mode}: a long-lived connection to b1: {e}"));
    pinned
        .check_echo("before b1 fails")
        .unwrap_or_else(|e| panic!("{mode}: long-lived connection on b1: {e}"));

    backends
        .kill_health("b1")
        .expect("stopping b1's health listener");
    let (view, took) = api
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
        pinned
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
    pinned
        .check_echo("after the new connections")
        .unwrap_or_else(|e| panic!("{mode}: the connection pinned to b1: {e}"));

    backends
        .restart_health("b1")
        .expect("starting b1's health listener");
    api.wait_service("web", "b1 up again", VERDICT_WAIT, |s| {
        s.server(b1.addr())
            .is_some_and(|v| v.state == "up" && v.active)
    })
    .unwrap_or_else(|e| panic!("{mode}: b1 returns once its probe passes: {e}"));
    pinned
        .check_echo("after b1 recovered")
        .unwrap_or_else(|e| panic!("{mode}: the connection pinned to b1: {e}"));
    let status = agent.stop(STOP_GRACE).expect("stopping lb-agent");
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
