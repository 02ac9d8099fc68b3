//! The probe scheduler under paused time, with a fake prober standing in for servers:
//! non-overlap, first-run spreading, jitter, `onfail` / `idle` gating, and the TR7
//! detection and recovery bounds through the health state machine.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lb_agent::config::{ProbeConfig, ProbeKind, ProbeMode, detection_bounds};
use lb_agent::health::{HealthState, PassivePolicy, ServerHealth, StartState};
use lb_agent::probe::{
    PROMPT_SPREAD, ProbeOutcome, ProbeReport, ProbeTask, Prober, ServerKey, ServerSignals,
    SharedSignals, first_run_offset, spawn_spread, spawn_with,
};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, timeout};

/// How the fake server answers probes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    /// Passes after this long.
    Pass(Duration),
    /// Never answers: the probe fails at its timeout.
    Silent,
    /// Refuses: the probe fails at once.
    Refuse,
}

/// A fake prober recording when each probe started and how many ran at once.
struct Fake {
    answer: Mutex<Answer>,
    starts: Mutex<Vec<Instant>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
}

impl Fake {
    fn new(answer: Answer) -> Arc<Self> {
        Arc::new(Fake {
            answer: Mutex::new(answer),
            starts: Mutex::new(Vec::new()),
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
        })
    }

    fn set(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    fn starts(&self) -> Vec<Instant> {
        self.starts.lock().unwrap().clone()
    }
}

impl Prober for Fake {
    fn probe(
        &self,
        cfg: &ProbeConfig,
        _target: SocketAddr,
    ) -> impl Future<Output = ProbeOutcome> + Send {
        let timeout = cfg.timeout;
        async move {
            self.starts.lock().unwrap().push(Instant::now());
            let n = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_running.fetch_max(n, Ordering::SeqCst);
            let answer = *self.answer.lock().unwrap();
            let outcome = match answer {
                Answer::Pass(d) if d < timeout => {
                    sleep(d).await;
                    ProbeOutcome::pass(d, "status 200")
                }
                Answer::Pass(_) | Answer::Silent => {
                    sleep(timeout).await;
                    ProbeOutcome::timed_out(timeout)
                }
                Answer::Refuse => ProbeOutcome::fail(Duration::ZERO, "connection refused"),
            };
            self.running.fetch_sub(1, Ordering::SeqCst);
            outcome
        }
    }
}

fn key(n: u32) -> ServerKey {
    ServerKey {
        service: 0,
        addr: SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(10, 0, (n >> 8) as u8, n as u8)),
            80,
        ),
    }
}

fn cfg(interval: Duration, timeout: Duration) -> ProbeConfig {
    let mut p = ProbeConfig::new("health", ProbeKind::Http);
    p.interval = interval;
    p.timeout = timeout;
    p
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn start(
    fake: &Arc<Fake>,
    server: ServerKey,
    cfg: &ProbeConfig,
    signals: Arc<dyn ServerSignals>,
) -> (ProbeTask, mpsc::Receiver<ProbeReport>) {
    let (tx, rx) = mpsc::channel(64);
    (
        spawn_with(fake.clone(), server, 0, Arc::new(cfg.clone()), signals, tx),
        rx,
    )
}

fn up() -> Arc<SharedSignals> {
    Arc::new(SharedSignals::new(true))
}

#[tokio::test(start_paused = true)]
async fn first_run_is_spread_over_the_first_interval() {
    let interval = secs(10.0);
    let t0 = Instant::now();
    let fake = Fake::new(Answer::Pass(Duration::ZERO));
    let (tx, mut rx) = mpsc::channel(256);
    let p = Arc::new(cfg(interval, secs(1.0)));
    let tasks: Vec<_> = (0..40)
        .map(|n| spawn_with(fake.clone(), key(n), 0, p.clone(), up(), tx.clone()))
        .collect();
    let mut first = std::collections::BTreeMap::new();
    while first.len() < tasks.len() {
        let r = rx.recv().await.unwrap();
        first.entry(r.server).or_insert(r.at);
    }
    let mut quarters = [0; 4];
    for (server, at) in &first {
        let offset = *at - t0;
        assert!(
            offset < interval,
            "{server} first ran at {offset:?}, after the first interval"
        );
        assert_eq!(
            offset,
            first_run_offset(*server, 0, interval),
            "{server}: the documented offset"
        );
        quarters[(offset.as_secs_f64() / 2.5) as usize] += 1;
    }
    assert!(
        quarters.iter().all(|&q| q >= 4),
        "40 servers spread over 4 quarters: {quarters:?}"
    );
    assert_eq!(
        first_run_offset(key(1), 0, interval),
        first_run_offset(key(1), 0, interval),
        "deterministic"
    );
    assert_ne!(
        first_run_offset(key(1), 0, interval),
        first_run_offset(key(1), 1, interval),
        "per probe"
    );
}

#[tokio::test(start_paused = true)]
async fn probe_runs_every_interval() {
    let fake = Fake::new(Answer::Pass(secs(0.1)));
    let (_task, mut rx) = start(&fake, key(1), &cfg(secs(2.0), secs(1.0)), up());
    for _ in 0..6 {
        rx.recv().await.unwrap();
    }
    let starts = fake.starts();
    for w in starts.windows(2) {
        assert_eq!(w[1] - w[0], secs(2.0), "one probe per interval: {starts:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn probes_never_overlap_and_a_missed_tick_runs_when_the_probe_ends() {
    // Each probe takes 2.5 intervals (its timeout is longer than the interval).
    let fake = Fake::new(Answer::Pass(secs(2.5)));
    let (_task, mut rx) = start(&fake, key(1), &cfg(secs(1.0), secs(5.0)), up());
    for _ in 0..6 {
        let r = rx.recv().await.unwrap();
        assert!(r.outcome.ok);
    }
    assert_eq!(
        fake.max_running.load(Ordering::SeqCst),
        1,
        "never two probes of one pair at once"
    );
    let starts = fake.starts();
    for w in starts.windows(2) {
        assert_eq!(
            w[1] - w[0],
            secs(2.5),
            "the tick that passed during a probe runs as soon as it ends: {starts:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn jitter_lengthens_intervals_within_its_bound() {
    let fake = Fake::new(Answer::Pass(Duration::ZERO));
    let mut p = cfg(secs(1.0), secs(0.5));
    p.jitter = secs(0.5);
    let (_task, mut rx) = start(&fake, key(1), &p, up());
    for _ in 0..30 {
        rx.recv().await.unwrap();
    }
    let starts = fake.starts();
    let gaps: Vec<_> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    for g in &gaps {
        assert!(
            (secs(1.0)..=secs(1.5)).contains(g),
            "gap {g:?} outside interval + [0, jitter]"
        );
    }
    assert!(
        gaps.iter().any(|g| *g != gaps[0]),
        "jitter varies the gaps: {gaps:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn onfail_probe_runs_only_while_server_is_not_healthy() {
    let fake = Fake::new(Answer::Pass(Duration::ZERO));
    let mut p = cfg(secs(1.0), secs(0.5));
    p.mode = ProbeMode::Onfail;
    let signals = up();
    let (_task, mut rx) = start(&fake, key(1), &p, signals.clone());
    assert!(
        timeout(secs(10.0), rx.recv()).await.is_err(),
        "no probe while healthy"
    );
    signals.set_healthy(false);
    let r = timeout(secs(1.1), rx.recv())
        .await
        .expect("probes within an interval once unhealthy");
    assert!(r.unwrap().outcome.ok);
    signals.set_healthy(true);
    while timeout(secs(1.0), rx.recv()).await.is_ok() {}
    assert!(
        timeout(secs(10.0), rx.recv()).await.is_err(),
        "stops once healthy again"
    );
}

#[tokio::test(start_paused = true)]
async fn idle_probe_runs_only_without_recent_traffic_or_when_unhealthy() {
    let fake = Fake::new(Answer::Pass(Duration::ZERO));
    let interval = secs(2.0);
    let mut p = cfg(interval, secs(0.5));
    p.mode = ProbeMode::Idle;
    let signals = up();
    signals.note_traffic(Instant::now());
    let (_task, mut rx) = start(&fake, key(1), &p, signals.clone());

    // Client traffic every 500 ms for 10 s: no probe.
    let traffic_until = Instant::now() + secs(10.0);
    while Instant::now() < traffic_until {
        signals.note_traffic(Instant::now());
        assert!(
            timeout(secs(0.5), rx.recv()).await.is_err(),
            "no probe while traffic flows"
        );
    }
    // Traffic stops: a probe comes once it has been idle for an interval.
    let stopped = Instant::now();
    let r = timeout(secs(5.0), rx.recv())
        .await
        .expect("probes when idle")
        .unwrap();
    assert!(
        r.at - stopped >= interval - secs(0.5),
        "idle for about an interval first"
    );
    assert!(
        r.at - stopped <= 2 * interval,
        "within two intervals of the last traffic"
    );

    // Unhealthy with traffic: probes anyway.
    signals.set_healthy(false);
    let _ = timeout(secs(0.1), rx.recv()).await;
    for _ in 0..3 {
        signals.note_traffic(Instant::now());
        timeout(interval + secs(0.1), rx.recv())
            .await
            .expect("probes while unhealthy despite traffic");
    }
}

#[tokio::test(start_paused = true)]
async fn dropping_the_handle_stops_the_task() {
    let fake = Fake::new(Answer::Pass(Duration::ZERO));
    let (task, mut rx) = start(&fake, key(1), &cfg(secs(1.0), secs(0.5)), up());
    rx.recv().await.unwrap();
    drop(task);
    // The aborted task drops its sender: the channel closes instead of yielding reports.
    let closed = timeout(secs(5.0), async { while rx.recv().await.is_some() {} }).await;
    assert!(
        closed.is_ok(),
        "the channel closes once the task is aborted"
    );
}

#[tokio::test(start_paused = true)]
async fn task_ends_when_its_report_channel_closes() {
    let fake = Fake::new(Answer::Pass(Duration::ZERO));
    let (task, rx) = start(&fake, key(1), &cfg(secs(1.0), secs(0.5)), up());
    drop(rx);
    sleep(secs(3.0)).await;
    assert!(task.is_finished(), "nobody listens: the task ends");
}

/// Starts one probe task and a health state machine for it; returns how long after the
/// server's answer changes to `after` (at `phase` past a passing report) the server
/// reaches `target`.
async fn time_to(
    p: &ProbeConfig,
    after: Answer,
    phase: Duration,
    target: HealthState,
    from_unhealthy: bool,
) -> Duration {
    let t0 = Instant::now();
    let fake = Fake::new(if from_unhealthy {
        Answer::Refuse
    } else {
        Answer::Pass(secs(0.001))
    });
    let (_task, mut rx) = start(&fake, key(1), p, up());
    let mut health = ServerHealth::new(
        std::slice::from_ref(p),
        PassivePolicy {
            max_fails: 0,
            fail_timeout: secs(10.0),
        },
        StartState::New,
        t0,
    );
    // Settle in the starting state, then wait for a report with the expected result.
    let want_ok = !from_unhealthy;
    loop {
        let r = rx.recv().await.unwrap();
        health.on_probe(r.probe, &r.outcome, r.at);
        let settled = if from_unhealthy {
            health.state() == HealthState::Unhealthy
        } else {
            health.usable()
        };
        if settled && r.outcome.ok == want_ok {
            break;
        }
    }
    sleep(phase).await;
    fake.set(after);
    let changed = Instant::now();
    loop {
        let r = timeout(secs(120.0), rx.recv())
            .await
            .expect("a transition within 2 min")
            .unwrap();
        if let Some(tr) = health.on_probe(r.probe, &r.outcome, r.at)
            && tr.to == target
        {
            return r.at - changed;
        }
    }
}

fn detection_probe() -> ProbeConfig {
    let mut p = cfg(secs(2.0), secs(1.0));
    p.fails = 3;
    p.passes = 2;
    p
}

#[tokio::test(start_paused = true)]
async fn silent_server_leaves_within_fails_times_interval_plus_timeout() {
    let p = detection_probe();
    let bound = p.fails * (p.interval + p.timeout);
    for phase in [0.0, 0.3, 1.0, 1.5, 1.999] {
        let silent = time_to(
            &p,
            Answer::Silent,
            secs(phase),
            HealthState::Unhealthy,
            false,
        )
        .await;
        assert!(
            silent <= bound,
            "silent, phase {phase}: {silent:?} > fails × (interval + timeout) = {bound:?}"
        );
        let refused = time_to(
            &p,
            Answer::Refuse,
            secs(phase),
            HealthState::Unhealthy,
            false,
        )
        .await;
        assert!(
            refused <= p.fails * p.interval,
            "refused, phase {phase}: {refused:?} > fails × interval: a refusal does not wait for the timeout"
        );
        assert!(
            refused < silent,
            "phase {phase}: refusing ({refused:?}) is detected before silent ({silent:?})"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn recovery_takes_between_passes_minus_one_and_passes_intervals() {
    let p = detection_probe();
    for phase in [0.0, 0.3, 1.0, 1.999] {
        let back = time_to(
            &p,
            Answer::Pass(secs(0.001)),
            secs(phase),
            HealthState::Up,
            true,
        )
        .await;
        let low = (p.passes - 1) * p.interval;
        let high = p.passes * p.interval + secs(0.001);
        assert!(
            (low..=high).contains(&back),
            "phase {phase}: recovery in {back:?}, outside [(passes − 1) × interval, passes × interval]"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_prompt_spread_puts_every_first_run_in_its_window_then_the_interval_applies() {
    let interval = secs(10.0);
    let t0 = Instant::now();
    let fake = Fake::new(Answer::Pass(Duration::ZERO));
    let (tx, mut rx) = mpsc::channel(256);
    let p = Arc::new(cfg(interval, secs(1.0)));
    let tasks: Vec<_> = (0..40)
        .map(|n| {
            spawn_spread(
                fake.clone(),
                key(n),
                0,
                p.clone(),
                up(),
                tx.clone(),
                PROMPT_SPREAD,
            )
        })
        .collect();
    let mut runs: std::collections::BTreeMap<ServerKey, Vec<Instant>> = Default::default();
    while runs.values().filter(|v| v.len() >= 2).count() < tasks.len() {
        let r = rx.recv().await.unwrap();
        runs.entry(r.server).or_default().push(r.at);
    }
    let firsts: Vec<Duration> = runs.values().map(|v| v[0] - t0).collect();
    assert!(
        firsts.iter().all(|d| *d < PROMPT_SPREAD),
        "every first run within {PROMPT_SPREAD:?}: {firsts:?}"
    );
    assert!(
        firsts.iter().any(|d| *d >= PROMPT_SPREAD / 2),
        "spread over the window, not all at once: {firsts:?}"
    );
    for v in runs.values() {
        assert_eq!(v[1] - v[0], interval, "then every interval");
    }
}

/// A probe whose timeout exceeds its interval: the server recovers just after a probe
/// started that will fail at its timeout. The next probe starts when that one ends, so
/// the server is back within the printed bound `max(interval, timeout) + (passes − 1) ×
/// interval`; skipping to the next tick brought it back up to an interval later.
#[tokio::test(start_paused = true)]
async fn recovery_with_timeout_above_interval_stays_within_the_printed_bound() {
    for (passes, t) in [(1, 1.5), (2, 1.5), (1, 2.0), (3, 3.7)] {
        let mut p = cfg(secs(1.0), secs(t));
        p.passes = passes;
        let bound = detection_bounds(&p).recover_max;
        assert_eq!(
            bound,
            secs(t) + (passes - 1) * p.interval,
            "max(interval, timeout) + (passes − 1) × interval"
        );
        let fake = Fake::new(Answer::Silent);
        let (_task, mut rx) = start(&fake, key(1), &p, up());
        let mut health = ServerHealth::new(
            std::slice::from_ref(&p),
            PassivePolicy {
                max_fails: 0,
                fail_timeout: secs(10.0),
            },
            StartState::New,
            Instant::now(),
        );
        // Unhealthy after the first timeout; then wait until a probe has just started.
        let r = rx.recv().await.unwrap();
        health.on_probe(r.probe, &r.outcome, r.at);
        assert_eq!(health.state(), HealthState::Unhealthy);
        let before = fake.starts().len();
        while fake.starts().len() == before {
            sleep(secs(0.001)).await;
        }
        // The server recovers 1 ms after that probe started; the probe still times out.
        fake.set(Answer::Pass(secs(0.001)));
        let recovered = Instant::now();
        let back = loop {
            let r = timeout(secs(60.0), rx.recv()).await.unwrap().unwrap();
            if let Some(tr) = health.on_probe(r.probe, &r.outcome, r.at)
                && tr.to == HealthState::Up
            {
                break r.at - recovered;
            }
        };
        // The passing probe itself takes 1 ms.
        assert!(
            back <= bound + secs(0.001),
            "passes {passes}, timeout {t}s: back after {back:?}, printed bound {bound:?}"
        );
        assert!(
            back + secs(0.5) > bound - secs(0.001),
            "passes {passes}, timeout {t}s: the worst case comes close to the bound ({back:?} vs {bound:?})"
        );
    }
}
