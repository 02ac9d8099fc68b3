//! Drain through the operator's CLI (DESIGN.md §8): b1, b2, b3 weighted 1:1:2, a
//! long-lived TCP connection on b1. `lb-agent server drain web <b1>` takes b1 out of the
//! table (`draining`, `active: false`) while the long-lived connection keeps echoing and
//! every new connection goes to b2:b3 = 1:2; `undrain` brings new connections back to
//! b1 at 1:1:2. In nat and in dsr.

use std::{path::Path, time::Duration};

use lb_tests::{
    agent::api::{self, Api},
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::WEIGHTS,
        redundancy::{self, Backends, Member, SourcePorts, TcpProbe},
    },
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Connections per phase: ±15 % of the smallest share (1/4) is 2.6 standard deviations
/// of a binomial share over 900; source ports and addresses are fixed, so a run's shares
/// repeat.
const CONNECTIONS: usize = 900;
const VERDICT_WAIT: Duration = Duration::from_secs(15);
const CLI_TIMEOUT: Duration = Duration::from_secs(20);

fn drain_keeps_pinned_flow(forwarding: Forwarding, subnet: u8) {
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
    let _backends = Backends::start(Path::new(TESTSERVER), &members, false)
        .expect("starting a testserver per member");
    let service = redundancy::service(&topo, "web", &members, &TcpProbe::fast(), &[]);
    let vip = service.vip;
    let agent = lb_tests::scenario::balance::start_agent(&topo, vec![service], Some("native"))
        .expect("starting lb-agent");
    let agent_bin = lb_tests::agent::daemon::locate_binary("lb-agent").expect("lb-agent binary");
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
        .check_echo("before drain")
        .unwrap_or_else(|e| panic!("{mode}: long-lived connection on b1: {e}"));

    let b1_addr = b1.addr().to_string();
    let socket = lb_tests::agent::daemon::socket_path(topo.dir())
        .display()
        .to_string();
    let drain = ["server", "drain", "web", &b1_addr, "--socket", &socket];
    let out = api::cli(&topo.lb().ns, &agent_bin, &drain, CLI_TIMEOUT)
        .unwrap_or_else(|e| panic!("{mode}: `lb-agent server drain web {b1_addr}`: {e}"));
    let (view, took) = api
        .wait_service("web", "b1 draining", VERDICT_WAIT, |s| {
            s.server(b1.addr())
                .is_some_and(|v| v.state == "draining" && !v.active)
        })
        .unwrap_or_else(|e| panic!("{mode}: after `drain`, b1 should be draining: {e}"));
    println!(
        "drain {mode}: `lb-agent server drain web {b1_addr}` said {:?}; API shows it after {took:.2?}\n{}",
        out.trim(),
        view.describe(name)
    );
    for i in 0..3 {
        pinned
            .check_echo(&format!("while drained {i}"))
            .unwrap_or_else(|e| {
                panic!(
                    "{mode}: the connection pinned to b1 should keep working while b1 drains: {e}"
                )
            });
    }
    redundancy::expect_shares(
        client,
        &mut ports,
        vip,
        CONNECTIONS,
        &[&b2, &b3],
        &format!("drain {mode}: {CONNECTIONS} new connections while b1 drains"),
        &format!("{mode}: while b1 drains new connections go to b2:b3 = 1:2 and none to b1"),
    );
    pinned
        .check_echo("after the new connections")
        .unwrap_or_else(|e| panic!("{mode}: the connection pinned to b1 while it drains: {e}"));

    let undrain = ["server", "undrain", "web", &b1_addr, "--socket", &socket];
    api::cli(&topo.lb().ns, &agent_bin, &undrain, CLI_TIMEOUT)
        .unwrap_or_else(|e| panic!("{mode}: `lb-agent server undrain web {b1_addr}`: {e}"));
    let (view, took) = api
        .wait_service("web", "b1 up and active", VERDICT_WAIT, |s| {
            s.server(b1.addr())
                .is_some_and(|v| v.state == "up" && v.active)
        })
        .unwrap_or_else(|e| panic!("{mode}: after `undrain`, b1 should be up again: {e}"));
    println!(
        "drain {mode}: undrained; API shows it after {took:.2?}\n{}",
        view.describe(name)
    );
    redundancy::expect_shares(
        client,
        &mut ports,
        vip,
        CONNECTIONS,
        &[&b1, &b2, &b3],
        &format!("drain {mode}: {CONNECTIONS} new connections after undrain"),
        &format!("{mode}: after undrain new connections go to b1:b2:b3 = 1:1:2 again"),
    );
    pinned
        .check_echo("at the end")
        .unwrap_or_else(|e| panic!("{mode}: the connection pinned to b1 after undrain: {e}"));

    let status = agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(
        status.success(),
        "lb-agent should exit 0 on SIGTERM, got {status}"
    );
}

#[test]
fn drain_nat_keeps_pinned_flow_and_undrain_restores() {
    drain_keeps_pinned_flow(Forwarding::Nat, 145);
}

#[test]
fn drain_dsr_keeps_pinned_flow_and_undrain_restores() {
    drain_keeps_pinned_flow(Forwarding::Dsr, 146);
}
