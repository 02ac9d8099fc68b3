//! Failed handshakes and the client's port reuse, through the real agent and data plane
//! (docs/passive-signals.md, "Which SYN is a resend"). A fault makes new connections to
//! one backend fail — dsr: its server is killed, its RSTs go straight to the client;
//! nat: its link is down, the SYNs time out (the client gives up before its first
//! resend) — and leaves their flows waiting for a handshake that never completes. Then,
//! with the backend working again, the client opens new connections from exactly those
//! source ports (`bind()`), 20 s after their first use, as Linux clients reuse ports.
//! Each reused port's SYN carries a new ISN: a new connection, not a resend of the
//! failed one. Asserted for the reuse phase, in nat and dsr: no transition, no passive
//! event, no failed connection.

use std::{
    net::SocketAddr,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::api::{self, Api},
    net::topology::{Forwarding, HOST_IF, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{HealthServers, wait_state, with_health},
    },
    traffic::pacer::{Attempt, Outcome, PaceConfig, Pacer, summary, wall_now},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// One new connection every 20 ms, 100 of them (2 s), in each phase.
const PACE: Duration = Duration::from_millis(20);
const COUNT: usize = 100;
const FIRST_PORT: u16 = 21_000;
/// How long after its first use a port is used again: the low end of the 25–60 s a
/// Linux client was seen to take.
const REUSE_AFTER: f64 = 20.0;
const MAX_FAILS: u32 = 3;
const FAIL_TIMEOUT: &str = "3s";
/// Passive-event kinds of /metrics.
const SIGNALS: [&str; 3] = ["rst_on_syn", "icmp_unreachable", "syn_retransmit"];

fn passive_events(api: &Api) -> f64 {
    let text = api.metrics().expect("GET /metrics");
    SIGNALS
        .iter()
        .map(|kind| api::metric(&text, "lb_passive_events_total", &[("kind", kind)]).unwrap_or(0.0))
        .sum()
}

fn run_phase(topo: &Topology, vip: SocketAddr, connect_timeout: Duration) -> Vec<Attempt> {
    let client = topo.client();
    let limit = PACE * COUNT as u32 + Duration::from_secs(1);
    let pacer = Pacer::start(
        &client.ns,
        PaceConfig {
            src: client.ipv4.into(),
            first_port: FIRST_PORT,
            dst: vip,
            every: PACE,
            count: COUNT,
            limit,
            connect_timeout,
        },
    );
    // Every connection's outcome (each is bounded by twice `connect_timeout`: connect,
    // then the greeting), then the pacer stops.
    let started = Instant::now();
    while pacer.attempts().len() < COUNT && started.elapsed() < limit + 2 * connect_timeout {
        thread::sleep(Duration::from_millis(20));
    }
    pacer.finish()
}

fn is_failure(a: &Attempt) -> bool {
    !matches!(a.outcome, Outcome::Answered(_))
}

/// `fault` breaks b2 and returns a closure that repairs it.
fn reuse_after_fault(
    forwarding: Forwarding,
    subnet: u8,
    fault_timeout: Duration,
    fault: impl FnOnce(&Topology, &mut HealthServers) -> Box<dyn FnOnce(&mut HealthServers)>,
) {
    let mode = forwarding.as_str();
    let topo = Topology::builder()
        .backends(3)
        .forwarding(forwarding)
        .subnet(subnet)
        .build()
        .expect("building the topology");
    let mut servers = HealthServers::start(&topo, Path::new(TESTSERVER), &["b1", "b2", "b3"])
        .expect("starting lb-testserver on the backends");
    let backends = balance::weighted(&topo, &[1, 1, 1]);
    let svc = with_health(
        balance::tcp_service(&topo, &backends),
        &[
            &format!("max_fails = {MAX_FAILS}"),
            &format!("fail_timeout = \"{FAIL_TIMEOUT}\""),
        ],
        &[],
    );
    let vip = svc.vip;
    let _agent = balance::start_agent(&topo, vec![svc], Some("native")).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let b2 = SocketAddr::new(topo.backends()[1].ipv4.into(), BACKEND_TCP_PORT);
    wait_state(&api, "web", b2, "up", Duration::from_secs(5)).expect("b2 up at the start");
    // A port whose connection the client closed first is in the client's TIME_WAIT for
    // 60 s: let a new connection take it over (timestamps decide), as the failed ones
    // need no such help.
    topo.client()
        .ns
        .sysctl("net.ipv4.tcp_tw_reuse", "1")
        .expect("tcp_tw_reuse in the client namespace");

    let repair = fault(&topo, &mut servers);
    let fault_start = wall_now();
    let during = run_phase(&topo, vip, fault_timeout);
    repair(&mut servers);
    let failed_on_b2 = during.iter().filter(|a| is_failure(a)).count();

    // b2 may have been ejected during the fault; it is back (fail_timeout) long before
    // the reuse.
    wait_state(&api, "web", b2, "up", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{mode}: b2 should be up again before the reuse: {e}"));
    let wait = fault_start + REUSE_AFTER - wall_now();
    if wait > 0.0 {
        thread::sleep(Duration::from_secs_f64(wait));
    }
    let transitions_before = api.events().expect("GET /api/v1/events").len();
    let events_before = passive_events(&api);
    let reuse_start = wall_now();
    let reused = run_phase(&topo, vip, Duration::from_secs(3));
    // Events of the last SYNs reach the agent within milliseconds.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(500) {
        thread::sleep(Duration::from_millis(50));
    }
    let events = api.events().expect("GET /api/v1/events");
    let transitions: Vec<_> = events
        .iter()
        .skip(transitions_before)
        .filter(|e| e.server != "-")
        .collect();
    let new_events = passive_events(&api) - events_before;
    let failed = reused.iter().filter(|a| is_failure(a)).count();
    let on_b2 = reused.iter().filter(|a| a.answered_by("b2")).count();
    let reused_after: Vec<f64> = during
        .iter()
        .filter_map(|d| {
            let r = reused.iter().find(|r| r.port == d.port)?;
            Some(r.start - d.start)
        })
        .collect();
    let min_gap = reused_after.iter().copied().fold(f64::MAX, f64::min);
    println!(
        "{mode}: fault phase: {failed_on_b2} of {} connections failed ({}); reuse phase \
         {:.1} s after the fault began, every port again after >= {min_gap:.1} s: {} \
         ({on_b2} answered by b2); transitions: {}, passive events: {new_events}",
        during.len(),
        summary(&during),
        reuse_start - fault_start,
        summary(&reused),
        transitions.len()
    );
    assert!(
        failed_on_b2 >= 10,
        "{mode}: the fault should have failed the connections that went to b2 \
         ({failed_on_b2} failed)"
    );
    assert_eq!(reused.len(), COUNT, "{mode}: every port used again");
    assert!(
        min_gap >= REUSE_AFTER - 1.0,
        "{mode}: ports reused {min_gap:.1} s after their first use"
    );
    assert_eq!(
        failed,
        0,
        "{mode}: no connection on a reused port should fail: {}",
        summary(&reused)
    );
    assert!(on_b2 > 0, "{mode}: b2 takes its share of the reused ports");
    assert!(
        transitions.is_empty(),
        "{mode}: no transition while the ports are reused: {transitions:?}"
    );
    assert_eq!(
        new_events, 0.0,
        "{mode}: a reused port's SYN is a new connection, no passive event"
    );
}

#[test]
fn syn_port_reuse_after_refused_connections_dsr() {
    // dsr: b2's server killed; its RSTs go to the client, the balancer sees nothing.
    reuse_after_fault(
        Forwarding::Dsr,
        221,
        Duration::from_secs(1),
        |_, servers| {
            servers.kill("b2").expect("killing b2's server");
            Box::new(|servers: &mut HealthServers| {
                servers.restart("b2").expect("starting b2's server again");
            })
        },
    );
}

#[test]
fn syn_port_reuse_after_timed_out_connections_nat() {
    // nat: b2's link down; each SYN to it times out before the client's first resend
    // (1 s), so no flow reports anything: they just wait.
    reuse_after_fault(
        Forwarding::Nat,
        222,
        Duration::from_millis(800),
        |topo, _| {
            let ns = topo.backends()[1].ns.clone();
            ns.ip(&["link", "set", "dev", HOST_IF, "down"])
                .expect("taking b2's link down");
            Box::new(move |_: &mut HealthServers| {
                ns.ip(&["link", "set", "dev", HOST_IF, "up"])
                    .expect("bringing b2's link up");
            })
        },
    );
}
