//! A UDP service through the real agent (nat, and dsr): every datagram is answered by a backend,
//! through the VIP (the client's socket is connected to it), with shares following the
//! weights, and one flow keeps its backend; the agent's start-up log says what passive
//! checks can see for the service.

use std::{
    net::{SocketAddr, UdpSocket},
    path::Path,
    time::Duration,
};

use lb_tests::{
    net::topology::Forwarding,
    scenario::balance::{self, SHARE_TOLERANCE, WEIGHTS},
    traffic::clients::{self, STEP_TIMEOUT},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const FLOWS: usize = 600;
const DEADLINE: Duration = Duration::from_secs(60);

fn udp_by_weight(forwarding: Forwarding, subnet: u8) {
    let mode = forwarding.as_str();
    let bed = balance::Testbed::start(forwarding, subnet, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let mut service = balance::udp_service(topo, &backends);
    // Written in the file: a warning is about what the operator wrote.
    service.extra.push("max_fails = 3".into());
    let vip = service.vip;
    let agent =
        balance::start_agent(topo, vec![service], Some("native")).expect("starting lb-agent");
    // Passive checks see only the servers' ICMP unreachables in nat and nothing in dsr:
    // the agent says so at start (docs/passive-signals.md), max_fails being set.
    let said = match forwarding {
        Forwarding::Nat => "counts only ICMP unreachables from the server",
        Forwarding::Dsr | Forwarding::Ipip | Forwarding::Gue => "has nothing to count",
    };
    let lines = agent.process().lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("passive checks: max_fails") && l.contains(said)),
        "udp {mode}: the start-up log should say passive checks {said:?}:\n{}",
        agent.process().tail(30)
    );

    let client = topo.client();
    let tally = clients::udp_names(&client.ns, client.ipv4.into(), 10_000, vip, FLOWS, DEADLINE)
        .expect("entering the client namespace");
    let expected = balance::expected(&backends);
    println!(
        "udp {mode} native, {FLOWS} flows of one datagram to {vip}:\n{}",
        tally.table(&expected)
    );
    if let Err(problems) = tally.check_shares(&expected, SHARE_TOLERANCE) {
        panic!(
            "udp {mode}: expected all {FLOWS} datagrams answered with shares 25/25/50 % ± {:.0} %:\n{problems}",
            100.0 * SHARE_TOLERANCE
        );
    }

    // One flow (one source port), many datagrams: always the same backend.
    let answers = client
        .ns
        .run(|| one_flow(SocketAddr::new(client.ipv4.into(), 18_000), vip, 20))
        .expect("entering the client namespace")
        .expect("exchanging datagrams on one flow");
    let first = answers[0].clone();
    assert!(
        answers.iter().all(|a| *a == first),
        "udp {mode}: every datagram of one flow should reach one backend, got {answers:?}"
    );
}

#[test]
fn udp_nat_answers_every_datagram_by_weight() {
    udp_by_weight(Forwarding::Nat, 21);
}

/// In dsr the backends answer from the VIP themselves (lb-testserver binds every local
/// address, the VIP on `lo` included).
#[test]
fn udp_dsr_answers_every_datagram_by_weight() {
    udp_by_weight(Forwarding::Dsr, 22);
}

fn one_flow(src: SocketAddr, dst: SocketAddr, count: usize) -> std::io::Result<Vec<String>> {
    let socket = UdpSocket::bind(src)?;
    socket.connect(dst)?;
    socket.set_read_timeout(Some(STEP_TIMEOUT))?;
    let mut answers = Vec::new();
    let mut buf = [0u8; 512];
    for i in 0..count {
        socket.send(format!("datagram {i}").as_bytes())?;
        let n = socket.recv(&mut buf)?;
        answers.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    Ok(answers)
}
