//! Passive checks only (no probe; `max_fails = 3`, `fail_timeout = "3s"`) under steady
//! client traffic, through the real agent and data plane:
//! - nat: b2's port refuses; the data plane sees the RST answering each forwarded SYN
//!   (`rst_on_syn`), three of them make b2 `unavailable`, new connections avoid it, and
//!   after `fail_timeout` it is tried again (with a fresh count: `max_fails` more
//!   refusals put it back); once its server runs, the next try succeeds and it stays `up`.
//! - dsr: the backend's RST goes straight to the client, so a refusing port is invisible
//!   to the balancer (shown, not asserted as a feature); a backend that goes silent is
//!   seen through the client's SYN retransmission (`syn_retransmit`, ~1 s after the SYN),
//!   with the same unavailable / retry cycle.

use std::{
    net::SocketAddr,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{
        api::{self, Api},
        daemon::Agent,
    },
    net::topology::{Forwarding, HOST_IF, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{HealthServers, MARGIN, event_time, secs, wait_event, wait_state, with_health},
    },
    traffic::pacer::{Attempt, Outcome, PaceConfig, Pacer, summary, wall_now},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const PACE: Duration = Duration::from_millis(20);
const TRAFFIC_LIMIT: Duration = Duration::from_secs(40);
const MAX_FAILS: usize = 3;
const FAIL_TIMEOUT: f64 = 3.0;
/// Attempts that started this long after the agent's verdict can no longer have been
/// sent before the maps changed.
const IN_FLIGHT: f64 = 0.1;
/// Event times are cut to the millisecond: the connection that caused a transition may
/// start up to this much after the event's time.
const EVENT_RESOLUTION: f64 = 0.001;

/// Fields drop in order: traffic, the agent, the servers, the topology.
struct Setup {
    pacer: Option<Pacer>,
    _agent: Agent,
    servers: HealthServers,
    api: Api,
    b2: SocketAddr,
    /// Wall time just before the first client connection.
    traffic_start: f64,
    topo: Topology,
}

fn setup(forwarding: Forwarding, subnet: u8, start: &[&str], connect: Duration) -> Setup {
    let topo = Topology::builder()
        .backends(3)
        .forwarding(forwarding)
        .subnet(subnet)
        .build()
        .expect("building the topology");
    let servers = HealthServers::start(&topo, Path::new(TESTSERVER), start)
        .expect("starting lb-testserver on the backends");
    let backends = balance::weighted(&topo, &[1, 1, 1]);
    let svc = with_health(
        balance::tcp_service(&topo, &backends),
        &[
            &format!("max_fails = {MAX_FAILS}"),
            &format!("fail_timeout = \"{FAIL_TIMEOUT}s\""),
        ],
        &[],
    );
    let vip = svc.vip;
    let agent = balance::start_agent(&topo, vec![svc], Some("native")).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let b2 = SocketAddr::new(topo.backends()[1].ipv4.into(), BACKEND_TCP_PORT);
    wait_state(&api, "web", b2, "up", Duration::from_secs(5)).expect("b2 up at the start");
    let client = topo.client();
    let traffic_start = wall_now();
    let pacer = Pacer::start(
        &client.ns,
        PaceConfig {
            src: client.ipv4.into(),
            first_port: 10_000,
            dst: vip,
            every: PACE,
            count: (TRAFFIC_LIMIT.as_millis() / PACE.as_millis()) as usize,
            limit: TRAFFIC_LIMIT,
            connect_timeout: connect,
        },
    );
    Setup {
        pacer: Some(pacer),
        _agent: agent,
        servers,
        api,
        b2,
        traffic_start,
        topo,
    }
}

impl Setup {
    fn pacer(&self) -> &Pacer {
        self.pacer.as_ref().expect("traffic running")
    }

    fn finish(&mut self) -> Vec<Attempt> {
        self.pacer.take().expect("traffic running").finish()
    }

    fn passive_events(&self, kind: &str) -> f64 {
        let text = self.api.metrics().expect("GET /metrics");
        api::metric(&text, "lb_passive_events_total", &[("kind", kind)]).unwrap_or(0.0)
    }

    /// Waits (bounded) until b2 greeted a connection that started after `after`.
    fn wait_b2_answers(&self, after: f64, timeout: Duration) {
        let start = Instant::now();
        while start.elapsed() < timeout
            && !self
                .pacer()
                .attempts()
                .iter()
                .any(|a| a.start >= after && a.answered_by("b2"))
        {
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The attempts of `all` that started in `[from, to)` and match `pred`.
fn count(all: &[Attempt], from: f64, to: f64, pred: impl Fn(&Attempt) -> bool) -> usize {
    all.iter()
        .filter(|a| a.start >= from && a.start < to && pred(a))
        .count()
}

fn is_failure(a: &Attempt) -> bool {
    !matches!(a.outcome, Outcome::Answered(_))
}

/// The unavailable / retry / unavailable again / recovery cycle of b2, common to nat and dsr.
/// `hits` tells an attempt that reached the broken b2; `repair` makes b2 work again and
/// returns the wall time it did.
fn cycle(
    s: &mut Setup,
    mode: &str,
    signal: &str,
    broken_at: f64,
    hits: fn(&Attempt) -> bool,
    repair: impl FnOnce(&mut Setup) -> f64,
) {
    let b2 = s.b2;
    let unavailable = wait_event(
        &s.api,
        b2,
        "unavailable",
        broken_at,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("{mode}: b2 should become unavailable: {e}"));
    let t_unavailable = event_time(&unavailable);
    wait_state(&s.api, "web", b2, "unavailable", Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("{mode}: the API should show b2 unavailable: {e}"));
    let retry = wait_event(
        &s.api,
        b2,
        "up",
        t_unavailable,
        Duration::from_secs_f64(FAIL_TIMEOUT) + 2 * MARGIN,
    )
    .unwrap_or_else(|e| panic!("{mode}: b2 should be tried again after fail_timeout: {e}"));
    let t_retry = event_time(&retry);
    let again = wait_event(&s.api, b2, "unavailable", t_retry, Duration::from_secs(10))
        .unwrap_or_else(|e| {
            panic!("{mode}: b2, still broken, should be unavailable again after its retry: {e}")
        });
    let t_again = event_time(&again);
    let t_repair = repair(s);
    let back = wait_event(
        &s.api,
        b2,
        "up",
        t_again,
        Duration::from_secs_f64(FAIL_TIMEOUT) + 2 * MARGIN,
    )
    .unwrap_or_else(|e| panic!("{mode}: b2 should be up after its next fail_timeout: {e}"));
    let t_back = event_time(&back);
    s.wait_b2_answers(t_back, 2 * MARGIN);
    // Long enough for a fresh passive failure to show, were there one.
    thread::sleep(Duration::from_secs(2));
    let state_at_end = wait_state(&s.api, "web", b2, "up", Duration::from_millis(100));
    let events_seen = s.passive_events(signal);
    let attempts = s.finish();

    // With LB_TEST_VERBOSE, every connection that reached the broken b2, against the
    // transition times.
    if std::env::var_os("LB_TEST_VERBOSE").is_some() {
        for a in attempts.iter().filter(|a| hits(a)) {
            eprintln!(
                "hit port {} start {:.4} end {:.4}: {} (unavailable {:.4}, retry {:.4}, again {:.4})",
                a.port, a.start, a.end, a.outcome, t_unavailable, t_retry, t_again
            );
        }
    }
    let hits_before = count(&attempts, broken_at, t_unavailable + EVENT_RESOLUTION, hits);
    let avoided = count(&attempts, t_unavailable + IN_FLIGHT, t_retry, |a| {
        hits(a) || a.answered_by("b2")
    });
    let others_failed = count(&attempts, t_unavailable + IN_FLIGHT, t_retry, is_failure);
    let probation_hits = count(&attempts, t_retry, t_again + EVENT_RESOLUTION, hits);
    let b2_after = count(&attempts, t_back, f64::MAX, |a| a.answered_by("b2"));
    let failed_after = count(&attempts, t_back + IN_FLIGHT, f64::MAX, is_failure);
    let first_b2 = attempts
        .iter()
        .find(|a| a.start >= t_back - IN_FLIGHT && a.answered_by("b2"))
        .map(|a| a.start - t_back);
    println!(
        "{mode} passive (max_fails {MAX_FAILS}, fail_timeout {FAIL_TIMEOUT} s, signal {signal}):\n  \
         b2 broken -> unavailable {} later, after {hits_before} connections that reached it ({})\n  \
         unavailable for {}: {avoided} new connections reached b2, {others_failed} failed\n  \
         tried again ({}) -> {probation_hits} connection(s) reached it -> unavailable again \
         after {} ({})\n  \
         repaired, then up {} later (at the end of that unavailable period), first \
         connection answered by b2 {} after that; {b2_after} answered by b2 since, \
         {failed_after} failed\n  \
         {signal} events counted: {events_seen}; {}",
        secs(t_unavailable - broken_at),
        unavailable.cause,
        secs(t_retry - t_unavailable),
        retry.cause,
        secs(t_again - t_retry),
        again.cause,
        secs(t_back - t_repair),
        first_b2.map_or("never".into(), secs),
        summary(&attempts)
    );
    assert!(
        (MAX_FAILS..=MAX_FAILS + 1).contains(&hits_before),
        "{mode}: b2 should become unavailable after {MAX_FAILS} connections that reached it \
         (one more may be in flight), took {hits_before}"
    );
    assert!(
        unavailable.cause.contains(signal),
        "{mode}: the transition should name the passive signal {signal}: {unavailable:?}"
    );
    assert_eq!(
        avoided, 0,
        "{mode}: no new connection should reach b2 while it is unavailable"
    );
    assert_eq!(
        others_failed, 0,
        "{mode}: no connection should fail while b2 is out"
    );
    let out_for = t_retry - t_unavailable;
    assert!(
        (FAIL_TIMEOUT - 0.05..=FAIL_TIMEOUT + MARGIN.as_secs_f64()).contains(&out_for),
        "{mode}: b2 should be tried again after fail_timeout ({FAIL_TIMEOUT} s), was out for {}",
        secs(out_for)
    );
    assert!(
        probation_hits >= 1,
        "{mode}: a connection should reach b2 when it is tried again"
    );
    assert!(
        first_b2.is_some() && b2_after > 0,
        "{mode}: b2 should answer connections once repaired"
    );
    assert_eq!(
        failed_after, 0,
        "{mode}: no connection should fail once b2 is repaired and up"
    );
    state_at_end
        .unwrap_or_else(|e| panic!("{mode}: b2 should stay up once its connections succeed: {e}"));
    assert!(
        events_seen >= (MAX_FAILS + 1) as f64,
        "{mode}: /metrics should count the {signal} events ({events_seen})"
    );
}

#[test]
fn health_passive_nat_refused_port() {
    let mut s = setup(Forwarding::Nat, 81, &["b1", "b3"], Duration::from_secs(1));
    // b2's port has refused since the first connection.
    let broken_at = s.traffic_start;
    cycle(
        &mut s,
        "nat",
        "rst_on_syn",
        broken_at,
        Attempt::refused,
        |s| s.servers.restart("b2").expect("starting b2's server"),
    );
}

#[test]
fn health_passive_dsr_silent_backend() {
    // The client's first SYN retransmission comes after 1 s: wait a little longer.
    let mut s = setup(
        Forwarding::Dsr,
        82,
        &["b1", "b3"],
        Duration::from_millis(1500),
    );
    // A refusing port first: in dsr its RST bypasses the balancer.
    thread::sleep(Duration::from_secs(2));
    let refused = s.pacer().attempts().iter().filter(|a| a.refused()).count();
    let state = wait_state(&s.api, "web", s.b2, "up", Duration::from_millis(100));
    println!(
        "dsr: {refused} connections refused by b2 in 2 s; b2 is still {} \
         (rst_on_syn events: {}): a refusal is invisible to a dsr balancer",
        if state.is_ok() { "up" } else { "not up" },
        s.passive_events("rst_on_syn")
    );
    s.servers.restart("b2").expect("starting b2's server");

    // Now b2 goes silent: its link is down, SYNs vanish.
    let b2_ns = s.topo.backends()[1].ns.clone();
    let broken_at = wall_now();
    b2_ns
        .ip(&["link", "set", "dev", HOST_IF, "down"])
        .expect("taking b2's link down");
    let timed_out = |a: &Attempt| a.outcome == Outcome::TimedOut;
    cycle(
        &mut s,
        "dsr",
        "syn_retransmit",
        broken_at,
        timed_out,
        |_| {
            let at = wall_now();
            b2_ns
                .ip(&["link", "set", "dev", HOST_IF, "up"])
                .expect("bringing b2's link up");
            at
        },
    );
}
