//! A late agent under paused time: after a stall the scheduler spreads the overdue probes
//! over the next interval instead of firing them in one burst, and a probe whose timer
//! fired later than its slack is a local fault, not a timeout held against the server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lb_agent::config::{ProbeConfig, ProbeKind, TcpCheck};
use lb_agent::probe::{
    OVERDUE, ProbeOutcome, ProbeReport, ProbeTask, Prober, ServerKey, SharedSignals, execute,
    first_run_offset, on_time_slack, spawn_with,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Passes at once, recording when each probe of each server started.
#[derive(Default)]
struct Recorder {
    starts: Mutex<Vec<(SocketAddr, Instant)>>,
}

impl Prober for Recorder {
    fn probe(
        &self,
        _cfg: &ProbeConfig,
        target: SocketAddr,
    ) -> impl Future<Output = ProbeOutcome> + Send {
        self.starts.lock().unwrap().push((target, Instant::now()));
        async { ProbeOutcome::pass(Duration::ZERO, "ok") }
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

const SERVERS: u32 = 100;

#[tokio::test(start_paused = true)]
async fn overdue_probes_after_a_stall_spread_over_the_next_interval() {
    let interval = Duration::from_secs(1);
    let mut cfg = ProbeConfig::new("tcp", ProbeKind::Tcp);
    cfg.interval = interval;
    cfg.timeout = Duration::from_millis(500);
    let cfg = Arc::new(cfg);
    let recorder = Arc::new(Recorder::default());
    let (tx, mut rx) = mpsc::channel::<ProbeReport>(100_000);
    let _tasks: Vec<ProbeTask> = (0..SERVERS)
        .map(|n| {
            spawn_with(
                recorder.clone(),
                key(n),
                0,
                cfg.clone(),
                Arc::new(SharedSignals::new(true)),
                tx.clone(),
            )
        })
        .collect();
    // Two normal intervals: every task once per interval.
    tokio::time::sleep(interval * 2).await;
    // A stall: the runtime does not run for 3 s (time jumps; every timer is overdue).
    recorder.starts.lock().unwrap().clear();
    tokio::time::advance(Duration::from_secs(3)).await;
    let resumed = Instant::now();
    tokio::time::sleep(interval).await;
    while rx.try_recv().is_ok() {}
    let starts = recorder.starts.lock().unwrap().clone();
    let after: Vec<_> = starts.iter().filter(|(_, at)| *at >= resumed).collect();
    assert_eq!(
        after.len(),
        SERVERS as usize,
        "each server probed once in the interval after the stall: {after:?}"
    );
    for (addr, at) in &after {
        let server = ServerKey {
            service: 0,
            addr: *addr,
        };
        // Deterministic: the server's own offset within the interval, from the wake-up.
        assert_eq!(
            *at - resumed,
            first_run_offset(server, 0, interval),
            "{addr} at its spread offset"
        );
    }
    // Not a burst: no 50 ms of the interval holds more than a tenth of the probes.
    for window in 0..20u32 {
        let from = resumed + Duration::from_millis(50) * window;
        let to = from + Duration::from_millis(50);
        let n = after
            .iter()
            .filter(|(_, at)| (from..to).contains(at))
            .count();
        assert!(n <= 10, "{n} probes in window {window}: a burst");
    }
    // Then the interval applies again from the spread phase.
    let before = recorder.starts.lock().unwrap().len();
    tokio::time::sleep(interval).await;
    assert_eq!(
        recorder.starts.lock().unwrap().len() - before,
        SERVERS as usize
    );
}

#[tokio::test(start_paused = true)]
async fn a_small_delay_does_not_move_a_probe() {
    let interval = Duration::from_secs(1);
    let mut cfg = ProbeConfig::new("tcp", ProbeKind::Tcp);
    cfg.interval = interval;
    let recorder = Arc::new(Recorder::default());
    let (tx, _rx) = mpsc::channel::<ProbeReport>(1000);
    let start = Instant::now();
    let _task = spawn_with(
        recorder.clone(),
        key(1),
        0,
        Arc::new(cfg),
        Arc::new(SharedSignals::new(true)),
        tx,
    );
    let offset = first_run_offset(key(1), 0, interval);
    // Just before the first tick, a stall of at most OVERDUE past it.
    tokio::time::sleep(offset.saturating_sub(Duration::from_millis(1))).await;
    tokio::time::advance(OVERDUE).await;
    tokio::task::yield_now().await;
    let starts = recorder.starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 1, "probed at its late wake-up");
    assert!(starts[0].1 - start <= offset + OVERDUE);
}

/// A tcp probe that waits for a reply from a listener that accepts and never answers.
fn silent_probe(timeout: Duration) -> (ProbeConfig, SocketAddr, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut cfg = ProbeConfig::new("tcp", ProbeKind::Tcp);
    cfg.tcp_check = TcpCheck::Connect;
    cfg.timeout = timeout;
    cfg.send = Some(b"ping\n".to_vec());
    cfg.expect = Some(regex::Regex::new("pong").unwrap());
    (cfg, addr, listener)
}

/// Runs the probe, stalls the runtime for `stall` once it has started, and returns its
/// outcome.
async fn run_with_stall(cfg: ProbeConfig, addr: SocketAddr, stall: Duration) -> ProbeOutcome {
    let probe = tokio::spawn(async move { execute(&cfg, addr).await });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::advance(stall).await;
    probe.await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_timeout_on_time_is_the_servers_and_a_late_one_is_a_local_fault() {
    let timeout = Duration::from_secs(1);
    let slack = on_time_slack(timeout);
    // On time (the timer fires when due, or within its slack): the server's timeout.
    for stall in [timeout, timeout + slack] {
        let (cfg, addr, _listener) = silent_probe(timeout);
        let out = run_with_stall(cfg, addr, stall).await;
        assert!(!out.ok && !out.local, "stall {stall:?}: {out:?}");
        assert_eq!(out.detail, "timeout");
    }
    // Any lateness past the slack — not only a half-second stall — is the agent's.
    for late in [slack + Duration::from_millis(1), Duration::from_millis(200)] {
        let (cfg, addr, _listener) = silent_probe(timeout);
        let out = run_with_stall(cfg, addr, timeout + late).await;
        assert!(!out.ok && out.local, "late {late:?}: {out:?}");
        assert!(out.detail.starts_with("local fault:"), "{}", out.detail);
    }
}

/// Connections the kernel established (and a reply it received) while the agent's only
/// thread was blocked past the timeout are read when the agent wakes: the runtime polls
/// the probe before its timer, so they pass instead of timing out (real time).
#[test]
fn an_answer_that_came_while_the_agent_was_blocked_passes() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts and says "pong" at once, for the probe with `expect`.
    let server = std::thread::spawn(move || {
        for _ in 0..2 {
            let (mut conn, _) = listener.accept().unwrap();
            let _ = std::io::Write::write_all(&mut conn, b"pong\n");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let timeout = Duration::from_millis(300);
    let mut connect = ProbeConfig::new("tcp", ProbeKind::Tcp);
    connect.tcp_check = TcpCheck::Connect;
    connect.timeout = timeout;
    let mut expect = connect.clone();
    expect.expect = Some(regex::Regex::new("pong").unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for cfg in [connect, expect] {
        let out = rt.block_on(async move {
            let probe = tokio::spawn(async move { execute(&cfg, addr).await });
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            // The agent starved for twice the timeout.
            std::thread::sleep(timeout * 2);
            probe.await.unwrap()
        });
        assert!(out.ok, "{out:?}");
    }
    server.join().unwrap();
}
