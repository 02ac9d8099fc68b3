//! The probe scheduler: one task per (server, probe), never overlapping itself.
//!
//! A task first runs at a deterministic offset inside the first interval (so a restart
//! does not fire every probe at once), then every `interval` plus a random share of
//! `jitter`. The probe runs inline in the task's loop, so it cannot overlap its previous
//! run: a tick that passes while a probe is still running waits for it, and the next
//! probe starts as soon as that one ends (as `MissedTickBehavior::Delay`), never later.
//! Skipping to the next tick instead would make a probe whose `timeout` is at least its
//! `interval` start up to `interval` after a failure that ended by timeout, beyond the
//! recovery bound `check-config` prints (`config::bounds::detection_bounds`). `mode`
//! gates each tick on what [`ServerSignals`] says.
//!
//! A task that wakes more than [`OVERDUE`] after its tick (the agent did not get the CPU,
//! or was busy) does not probe at once: after a stall every task is overdue, and firing
//! them all in one burst would flood the targets' accept queues and the agent's own
//! receive path. It runs at its own offset within the next interval instead (the same
//! stable hash as the first run, so the probes of many servers spread evenly), and runs
//! then even if that wake-up is late too, so a continuously late agent still probes.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{ProbeOutcome, execute};
use crate::config::{ProbeConfig, ProbeMode};

/// The shortest interval a task accepts (a zero interval would spin; tokio's timer
/// counts whole milliseconds). `check-config` prints its bounds with it.
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// A task that wakes later than this after its tick re-schedules at its spread offset
/// within the next interval instead of probing at once (module docs).
pub const OVERDUE: Duration = Duration::from_millis(50);

/// Identifies the server a probe task reports for: an id chosen by the owner and the
/// server's address (the resolved address for `resolve = true` servers). The agent uses
/// a fresh id per server incarnation, so reports of probe tasks replaced by a reload are
/// recognised and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerKey {
    /// Owner-chosen id (the agent: one per server incarnation).
    pub service: usize,
    /// The server's address; probes go to its IP, and to its port unless the probe sets one.
    pub addr: SocketAddr,
}

impl fmt::Display for ServerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "service {} server {}", self.service, self.addr)
    }
}

/// One probe result, for the health state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeReport {
    pub server: ServerKey,
    /// Index of the probe in its service's `probes`.
    pub probe: usize,
    pub outcome: ProbeOutcome,
    /// When the verdict was known.
    pub at: Instant,
}

/// What the scheduler needs to know about a server to honour `mode`. Fed by the health
/// loop (health) and the data plane (traffic).
pub trait ServerSignals: Send + Sync + 'static {
    /// The server is up (usable); `onfail` probes run only while this is false.
    fn healthy(&self) -> bool;
    /// When client traffic to the server was last seen; `None` if never.
    fn last_traffic(&self) -> Option<Instant>;
}

/// A ready [`ServerSignals`]: a flag and a timestamp that the owners set.
#[derive(Debug)]
pub struct SharedSignals {
    healthy: AtomicBool,
    last_traffic: Mutex<Option<Instant>>,
}

impl SharedSignals {
    pub fn new(healthy: bool) -> Self {
        SharedSignals {
            healthy: AtomicBool::new(healthy),
            last_traffic: Mutex::new(None),
        }
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Client traffic was seen at `at` (later than any earlier call, or ignored).
    pub fn note_traffic(&self, at: Instant) {
        let mut last = self.last_traffic.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t < at) {
            *last = Some(at);
        }
    }
}

impl ServerSignals for SharedSignals {
    fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    fn last_traffic(&self) -> Option<Instant> {
        *self.last_traffic.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs one probe execution; [`NetProber`] is the real one, tests substitute their own.
pub trait Prober: Send + Sync + 'static {
    fn probe(
        &self,
        cfg: &ProbeConfig,
        target: SocketAddr,
    ) -> impl Future<Output = ProbeOutcome> + Send;
}

/// Probes over the network with [`execute`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NetProber;

impl Prober for NetProber {
    fn probe(
        &self,
        cfg: &ProbeConfig,
        target: SocketAddr,
    ) -> impl Future<Output = ProbeOutcome> + Send {
        execute(cfg, target)
    }
}

/// A running (server, probe) task; dropping it stops the task.
#[derive(Debug)]
pub struct ProbeTask {
    handle: JoinHandle<()>,
}

impl ProbeTask {
    /// The task has ended (its report channel closed).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

impl Drop for ProbeTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Starts probing `server` with its probe number `probe` over the network; results go to
/// `reports`. The task ends when the returned handle is dropped or `reports` is closed.
/// Must be called inside a tokio runtime.
pub fn spawn(
    server: ServerKey,
    probe: usize,
    cfg: Arc<ProbeConfig>,
    signals: Arc<dyn ServerSignals>,
    reports: mpsc::Sender<ProbeReport>,
) -> ProbeTask {
    spawn_with(Arc::new(NetProber), server, probe, cfg, signals, reports)
}

/// [`spawn`] with another [`Prober`].
pub fn spawn_with<P: Prober>(
    prober: Arc<P>,
    server: ServerKey,
    probe: usize,
    cfg: Arc<ProbeConfig>,
    signals: Arc<dyn ServerSignals>,
    reports: mpsc::Sender<ProbeReport>,
) -> ProbeTask {
    let spread = cfg.interval;
    spawn_spread(prober, server, probe, cfg, signals, reports, spread)
}

/// How soon the first probes of a server waiting to be (re)admitted run: a server added
/// at runtime, or one a reload put back to `checking`, is out of traffic until they pass,
/// so they run within this window (spread over it) rather than over a whole interval.
pub const PROMPT_SPREAD: Duration = Duration::from_millis(250);

/// [`spawn_with`] whose first run falls in `[0, min(spread, interval))` (stable per server
/// and probe, as [`first_run_offset`]).
pub fn spawn_spread<P: Prober>(
    prober: Arc<P>,
    server: ServerKey,
    probe: usize,
    cfg: Arc<ProbeConfig>,
    signals: Arc<dyn ServerSignals>,
    reports: mpsc::Sender<ProbeReport>,
    spread: Duration,
) -> ProbeTask {
    let task = Task {
        prober,
        server,
        probe,
        cfg,
        signals,
        reports,
        spread,
    };
    ProbeTask {
        handle: tokio::spawn(task.run()),
    }
}

/// Where in `[0, interval)` the first run of (server, probe) falls, in whole milliseconds
/// (tokio's timer resolution): a stable hash, so the probes of many servers spread evenly
/// and a restart keeps the same pattern.
pub fn first_run_offset(server: ServerKey, probe: usize, interval: Duration) -> Duration {
    let millis = interval.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
    let mut h = Fnv::default();
    h.write_u64(server.service as u64);
    match server.addr {
        SocketAddr::V4(a) => h.write(&a.ip().octets()),
        SocketAddr::V6(a) => h.write(&a.ip().octets()),
    }
    h.write_u16(server.addr.port());
    h.write_u64(probe as u64);
    Duration::from_millis(splitmix(h.finish()) % millis)
}

struct Task<P> {
    /// The first run falls within this (at most the interval).
    spread: Duration,
    prober: Arc<P>,
    server: ServerKey,
    probe: usize,
    cfg: Arc<ProbeConfig>,
    signals: Arc<dyn ServerSignals>,
    reports: mpsc::Sender<ProbeReport>,
}

impl<P: Prober> Task<P> {
    async fn run(self) {
        let interval = self.cfg.interval.max(MIN_INTERVAL);
        let mut jitter = Jitter::new(self.cfg.jitter);
        let spread = self.spread.clamp(MIN_INTERVAL, interval);
        let mut next = Instant::now() + first_run_offset(self.server, self.probe, spread);
        // This wake-up was already moved once for being overdue: it runs however late.
        let mut respread = false;
        loop {
            tokio::time::sleep_until(next).await;
            let now = Instant::now();
            super::lag::note_late(now.saturating_duration_since(next));
            if !respread && now.saturating_duration_since(next) > OVERDUE {
                next = now + first_run_offset(self.server, self.probe, interval);
                respread = true;
                continue;
            }
            respread = false;
            if self.wanted(now, interval) {
                let outcome = self.prober.probe(&self.cfg, self.server.addr).await;
                let report = ProbeReport {
                    server: self.server,
                    probe: self.probe,
                    outcome,
                    at: Instant::now(),
                };
                if self.reports.send(report).await.is_err() {
                    return;
                }
            }
            next += interval + jitter.sample();
            // The probe outlasted its tick: the next one starts now, not a tick later.
            next = next.max(Instant::now());
        }
    }

    /// Does `mode` let this tick probe?
    fn wanted(&self, now: Instant, interval: Duration) -> bool {
        let healthy = self.signals.healthy();
        match self.cfg.mode {
            ProbeMode::Always => true,
            ProbeMode::Onfail => !healthy,
            ProbeMode::Idle => {
                !healthy
                    || self
                        .signals
                        .last_traffic()
                        .is_none_or(|t| now.saturating_duration_since(t) >= interval)
            }
        }
    }
}

/// Uniform random durations in `[0, max]` (splitmix64, seeded per task from the
/// process's random hasher keys).
struct Jitter {
    max: Duration,
    state: u64,
}

impl Jitter {
    fn new(max: Duration) -> Self {
        Jitter {
            max,
            state: RandomState::new().build_hasher().finish(),
        }
    }

    fn sample(&mut self) -> Duration {
        if self.max.is_zero() {
            return Duration::ZERO;
        }
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let span = self.max.as_nanos().min(u128::from(u64::MAX - 1)) as u64 + 1;
        Duration::from_nanos(splitmix(self.state) % span)
    }
}

/// splitmix64's finaliser: spreads every input bit over the output.
fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a, 64 bits: a hash whose value does not change between Rust releases.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}
