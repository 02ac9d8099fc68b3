//! Http probes through the real agent, under steady client traffic (one new connection
//! every 20 ms): a killed backend leaves traffic within TR7's `fails × (interval +
//! timeout)` and returns within `passes × interval`; a backend that answers 500 leaves
//! without waiting for the timeout; a server added at runtime, behind an essential probe
//! or a plain one, gets no connection before its probe passes. Each bound gets [`MARGIN`] (1 s).

use std::{
    net::SocketAddr,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{api::Api, daemon::Agent},
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{
            self, HealthServers, MARGIN, Probe, event_time, secs, wait_all_probed_up, wait_event,
            with_health,
        },
    },
    traffic::pacer::{Attempt, Outcome, PaceConfig, Pacer, summary, wall_now},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// One new client connection this often.
const PACE: Duration = Duration::from_millis(20);
/// Bound of one client connect and greeting.
const CONNECT: Duration = Duration::from_secs(1);
/// Upper bound on a whole scenario's client traffic.
const TRAFFIC_LIMIT: Duration = Duration::from_secs(30);
/// Wait for the agent's first verdicts on every server.
const FIRST_VERDICTS: Duration = Duration::from_secs(15);
/// A connection that failed this soon after its backend was killed may have been
/// accepted by the dying listener (reset instead of refused).
const DYING: f64 = 0.5;

/// A topology with `n` backends, a testserver on each, and the agent serving "web" over
/// all but the last `spare_hosts` backends with `probe` (passive checks off, so that
/// every verdict is the probe's).
///
/// Fields drop in order: the agent, then the servers, then the topology.
struct Setup {
    _agent: Agent,
    servers: HealthServers,
    api: Api,
    vip: SocketAddr,
    addrs: Vec<SocketAddr>,
    topo: Topology,
}

fn setup(forwarding: Forwarding, subnet: u8, n: usize, in_service: usize, probe: &Probe) -> Setup {
    let topo = Topology::builder()
        .backends(n)
        .forwarding(forwarding)
        .subnet(subnet)
        .build()
        .expect("building the topology");
    let roles: Vec<&str> = topo.backends().iter().map(|b| b.role.as_str()).collect();
    let servers = HealthServers::start(&topo, Path::new(TESTSERVER), &roles)
        .expect("starting lb-testserver on every backend");
    let addrs: Vec<SocketAddr> = topo
        .backends()
        .iter()
        .map(|b| SocketAddr::new(b.ipv4.into(), BACKEND_TCP_PORT))
        .collect();
    let weights = vec![1; in_service];
    let backends = balance::weighted(&topo, &weights);
    let svc = with_health(
        balance::tcp_service(&topo, &backends),
        &["max_fails = 0"],
        std::slice::from_ref(probe),
    );
    let vip = svc.vip;
    let agent = balance::start_agent(&topo, vec![svc], Some("native")).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    wait_all_probed_up(&api, "web", &addrs[..in_service], FIRST_VERDICTS)
        .expect("every configured server up after its first probes");
    Setup {
        _agent: agent,
        servers,
        api,
        vip,
        addrs,
        topo,
    }
}

impl Setup {
    fn pacer(&self, first_port: u16) -> Pacer {
        let client = self.topo.client();
        Pacer::start(
            &client.ns,
            PaceConfig {
                src: client.ipv4.into(),
                first_port,
                dst: self.vip,
                every: PACE,
                count: (TRAFFIC_LIMIT.as_millis() / PACE.as_millis()) as usize,
                limit: TRAFFIC_LIMIT,
                connect_timeout: CONNECT,
            },
        )
    }
}

/// Waits (at most `timeout`) until the pacer has a connection answered by `name` that
/// started after `after`.
fn wait_answered(pacer: &Pacer, name: &str, after: f64, timeout: Duration) {
    let start = Instant::now();
    while start.elapsed() < timeout
        && !pacer
            .attempts()
            .iter()
            .any(|a| a.start >= after && a.answered_by(name))
    {
        thread::sleep(Duration::from_millis(20));
    }
}

fn in_window(attempts: &[Attempt], from: f64, to: f64) -> Vec<&Attempt> {
    attempts
        .iter()
        .filter(|a| a.start >= from && a.start < to)
        .collect()
}

fn describe(attempts: &[&Attempt]) -> String {
    attempts
        .iter()
        .take(8)
        .map(|a| format!("port {} at {:.3}: {}", a.port, a.start, a.outcome))
        .collect::<Vec<_>>()
        .join("; ")
}

fn dead_backend(forwarding: Forwarding, subnet: u8) {
    let mode = forwarding.as_str();
    let probe = Probe::http(Duration::from_secs(1), Duration::from_millis(500), 2, 2);
    let mut s = setup(forwarding, subnet, 3, 3, &probe);
    let b2 = s.addrs[1];
    let pacer = s.pacer(10_000);
    thread::sleep(Duration::from_secs(1));

    let t_kill = s.servers.kill("b2").expect("killing b2's server");
    let detect_bound = probe.detection_bound() + MARGIN;
    let down = wait_event(&s.api, b2, "unhealthy", t_kill, detect_bound + MARGIN)
        .unwrap_or_else(|e| panic!("{mode}: b2 should turn unhealthy after its server died: {e}"));
    let t_down = event_time(&down);
    // Traffic after the verdict: nothing may reach b2 any more.
    thread::sleep(Duration::from_secs(1));

    let t_restart = s.servers.restart("b2").expect("restarting b2's server");
    let recover_bound = probe.recovery_bound() + MARGIN;
    let up = wait_event(&s.api, b2, "up", t_restart, recover_bound + MARGIN)
        .unwrap_or_else(|e| panic!("{mode}: b2 should be up again after its restart: {e}"));
    let t_up = event_time(&up);
    wait_answered(&pacer, "b2", t_restart, recover_bound + MARGIN);
    thread::sleep(Duration::from_millis(500));
    let attempts = pacer.finish();

    let before = in_window(&attempts, 0.0, t_kill);
    let dead = in_window(&attempts, t_kill, t_restart);
    let after = in_window(&attempts, t_restart, f64::MAX);
    // Only b2's port refuses; a reset right at the kill is a connection its dying
    // listener had accepted. Anything else failed on a healthy backend.
    let (to_b2, others): (Vec<&Attempt>, Vec<&Attempt>) = dead.iter().partition(|a| {
        a.refused() || (!matches!(a.outcome, Outcome::Answered(_)) && a.start - t_kill < DYING)
    });
    let healthy_failed: Vec<&Attempt> = others
        .iter()
        .copied()
        .filter(|a| !matches!(a.outcome, Outcome::Answered(_)))
        .collect();
    let b2_answered_dead: Vec<&Attempt> = dead
        .iter()
        .copied()
        .filter(|a| a.answered_by("b2") && a.start - t_kill > 0.05)
        .collect();
    let last_b2 = to_b2.iter().map(|a| a.start - t_kill).fold(0.0, f64::max);
    let first_back = after
        .iter()
        .find(|a| a.answered_by("b2"))
        .map(|a| a.start - t_restart);
    let after_failed: Vec<&Attempt> = after
        .iter()
        .copied()
        .filter(|a| !matches!(a.outcome, Outcome::Answered(_)))
        .collect();

    println!(
        "{mode} dead backend (http probe interval 1 s, timeout 500 ms, fails 2, passes 2):\n  \
         before the kill: {}\n  \
         b2 killed -> unhealthy event after {} ({}); last new connection that reached b2 {} \
         after the kill; bound {} = 2 × (1 s + 500 ms) + 1 s\n  \
         connections to b2 that failed before detection: {}; failed on healthy backends: {}\n  \
         b2 restarted -> up event after {}, first new connection answered by b2 after {}; \
         bound {} = 2 × 1 s + 1 s\n  \
         whole run: {}",
        summary(&before.iter().copied().cloned().collect::<Vec<_>>()),
        secs(t_down - t_kill),
        down.cause,
        secs(last_b2),
        secs(detect_bound.as_secs_f64()),
        to_b2.len(),
        healthy_failed.len(),
        secs(t_up - t_restart),
        first_back.map_or("never".into(), secs),
        secs(recover_bound.as_secs_f64()),
        summary(&attempts),
    );

    assert!(
        before
            .iter()
            .all(|a| matches!(a.outcome, Outcome::Answered(_))),
        "{mode}: every connection before the kill should be answered: {}",
        describe(&before)
    );
    assert!(
        ["b1", "b2", "b3"]
            .iter()
            .all(|n| before.iter().any(|a| a.answered_by(n))),
        "{mode}: every backend should get connections before the kill: {}",
        summary(&before.iter().copied().cloned().collect::<Vec<_>>())
    );
    assert!(
        t_down - t_kill <= detect_bound.as_secs_f64(),
        "{mode}: b2 should be unhealthy within {detect_bound:?} of its kill, took {}",
        secs(t_down - t_kill)
    );
    assert!(
        last_b2 <= detect_bound.as_secs_f64(),
        "{mode}: the last new connection to b2 should start within {detect_bound:?} of the \
         kill; it started {} after: {}",
        secs(last_b2),
        describe(&to_b2)
    );
    assert!(
        healthy_failed.is_empty(),
        "{mode}: no connection to a healthy backend should fail, {} did: {}",
        healthy_failed.len(),
        describe(&healthy_failed)
    );
    assert!(
        b2_answered_dead.is_empty(),
        "{mode}: a killed server cannot answer: {}",
        describe(&b2_answered_dead)
    );
    assert!(
        t_up - t_restart <= recover_bound.as_secs_f64(),
        "{mode}: b2 should be up within {recover_bound:?} of its restart, took {}",
        secs(t_up - t_restart)
    );
    let first_back = first_back.unwrap_or_else(|| {
        panic!(
            "{mode}: b2 should get new connections after its restart: {}",
            summary(&after.iter().copied().cloned().collect::<Vec<_>>())
        )
    });
    assert!(
        first_back <= recover_bound.as_secs_f64(),
        "{mode}: b2 should get a new connection within {recover_bound:?} of its restart, \
         the first came after {}",
        secs(first_back)
    );
    assert!(
        after_failed.is_empty(),
        "{mode}: no connection should fail after b2's restart: {}",
        describe(&after_failed)
    );
}

#[test]
fn health_http_dead_backend_nat() {
    dead_backend(Forwarding::Nat, 61);
}

#[test]
fn health_http_dead_backend_dsr() {
    dead_backend(Forwarding::Dsr, 62);
}

/// A wrong status fails at once: the server leaves within `fails × interval` even with
/// a 3 s timeout, while its service port keeps answering (only health says no).
#[test]
fn health_http_500_leaves_without_waiting_for_the_timeout() {
    let probe = Probe::http(Duration::from_secs(1), Duration::from_secs(3), 2, 2);
    let s = setup(Forwarding::Nat, 63, 3, 3, &probe);
    let b2 = s.addrs[1];
    let pacer = s.pacer(10_000);
    thread::sleep(Duration::from_secs(1));

    let t_switch = s.servers.control("b2", "http 500 failing");
    let bound = probe.immediate_bound() + MARGIN;
    let down = wait_event(&s.api, b2, "unhealthy", t_switch, bound + MARGIN)
        .unwrap_or_else(|e| panic!("b2 answering 500 should turn unhealthy: {e}"));
    let t_down = event_time(&down);
    thread::sleep(Duration::from_secs(1));
    let attempts = pacer.finish();

    let last_b2 = attempts
        .iter()
        .filter(|a| a.start >= t_switch && a.answered_by("b2"))
        .map(|a| a.start - t_switch)
        .fold(0.0, f64::max);
    let failed: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| !matches!(a.outcome, Outcome::Answered(_)))
        .collect();
    println!(
        "http 500 (interval 1 s, timeout 3 s, fails 2): unhealthy event {} after the switch \
         ({}); last new connection to b2 {} after it; bound {} = 2 × 1 s + 1 s (a silent \
         server's bound would be {}); {}",
        secs(t_down - t_switch),
        down.cause,
        secs(last_b2),
        secs(bound.as_secs_f64()),
        secs(probe.detection_bound().as_secs_f64() + MARGIN.as_secs_f64()),
        summary(&attempts)
    );
    assert!(
        down.cause.contains("status 500"),
        "the transition should name the status: {down:?}"
    );
    assert!(
        t_down - t_switch <= bound.as_secs_f64(),
        "b2 should be unhealthy within {bound:?} of answering 500 (not wait for the 3 s \
         timeout), took {}",
        secs(t_down - t_switch)
    );
    assert!(
        last_b2 <= bound.as_secs_f64(),
        "the last new connection to b2 should start within {bound:?} of the switch, \
         started {} after",
        secs(last_b2)
    );
    assert!(
        failed.is_empty(),
        "b2's service port still answers: no connection should fail: {}",
        describe(&failed)
    );
}

/// A server added through the API behind an essential probe starts `checking` and gets
/// no client connection until the probe passes; its health answers 503 for 3 s first,
/// so the gate is seen holding under traffic.
#[test]
fn health_http_essential_added_server_waits_for_its_probe() {
    let probe = Probe::http(Duration::from_secs(1), Duration::from_millis(500), 2, 2).essential();
    added_server_waits_for_its_probe(&probe, 64, "essential probe");
}

/// Azure and TR7 hold a new instance back until it passes: lb does so for every server
/// added at runtime, whether or not its probe is essential (docs/probes.md).
#[test]
fn health_http_plain_probe_holds_back_a_server_added_at_runtime() {
    let probe = Probe::http(Duration::from_secs(1), Duration::from_millis(500), 2, 2);
    added_server_waits_for_its_probe(&probe, 67, "plain probe");
}

/// b4 is added through the API while its health answers 503: it stays `checking` and
/// gets no connection; once it answers 200 it is up within `passes × interval` (+ 1 s)
/// and gets connections only after its `checking -> up` transition.
fn added_server_waits_for_its_probe(probe: &Probe, subnet: u8, what: &str) {
    let probe = probe.clone();
    let s = setup(Forwarding::Nat, subnet, 4, 3, &probe);
    let b4 = s.addrs[3];
    s.servers.control("b4", "http 503 warming up");
    let pacer = s.pacer(10_000);
    thread::sleep(Duration::from_millis(500));

    let t_add = wall_now();
    let body = format!("{{\"address\":\"{b4}\"}}");
    s.api
        .request_ok("POST", "/api/v1/services/web/servers", Some(&body))
        .expect("POST /api/v1/services/web/servers adding b4");
    health::wait_state(&s.api, "web", b4, "checking", Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("{what}: a server added at runtime starts checking: {e}"));

    thread::sleep(Duration::from_secs(3));
    let (state, probes) = health::server_health(&s.api, "web", b4).expect("b4's status");
    let early = pacer.attempts();
    assert_eq!(
        state, "checking",
        "{what}: b4 failing its probe (503) should stay checking: {probes:?}"
    );
    assert!(
        !early.iter().any(|a| a.answered_by("b4")),
        "{what}: b4 should get no connection while its probe fails: {}",
        summary(&early)
    );

    let t_ready = s.servers.control("b4", "http 200");
    let bound = probe.recovery_bound() + MARGIN;
    let up = wait_event(&s.api, b4, "up", t_ready, bound + MARGIN)
        .unwrap_or_else(|e| panic!("b4 should be up once its probe passes: {e}"));
    let t_up = event_time(&up);
    wait_answered(&pacer, "b4", t_ready, bound + MARGIN);
    thread::sleep(Duration::from_millis(500));
    let attempts = pacer.finish();

    let first_b4 = attempts.iter().find(|a| a.answered_by("b4"));
    let failed: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| !matches!(a.outcome, Outcome::Answered(_)))
        .collect();
    let checking_window = in_window(&attempts, t_add, t_up);
    println!(
        "{what}, b4 added at runtime: {} connections while b4 was checking, none to \
         b4; b4 up {} after its health turned 200 ({}; bound {} = 2 × 1 s + 1 s); first \
         connection answered by b4 started {} after the transition ({} after it was \
         answered); {}",
        checking_window.len(),
        secs(t_up - t_ready),
        up.cause,
        secs(bound.as_secs_f64()),
        first_b4.map_or("never".into(), |a| secs(a.start - t_up)),
        first_b4.map_or("never".into(), |a| secs(a.end - t_up)),
        summary(&attempts)
    );
    let first_b4 = first_b4
        .unwrap_or_else(|| panic!("b4 should get connections once up: {}", summary(&attempts)));
    assert!(
        first_b4.end >= t_up - 0.001,
        "b4's first connection (answered at {:.3}) must not come before its checking -> up \
         transition ({:.3})",
        first_b4.end,
        t_up
    );
    assert!(
        t_up - t_ready <= bound.as_secs_f64(),
        "b4 should be up within {bound:?} of passing, took {}",
        secs(t_up - t_ready)
    );
    assert!(
        failed.is_empty(),
        "no connection should fail while b4 is added: {}",
        describe(&failed)
    );
}
