//! The SYN engine's schedule: every SYN-check (server, probe) entry, when it runs next
//! and when its run times out, on one [`Wheel`], with the semantics of a probe task
//! (docs/probes.md): the first run at [`first_run_offset`] within `min(spread,
//! interval)`, then every `interval` plus a random share of `jitter`, never overlapping
//! its own run (ticks passed during a run are skipped, the phase kept), `mode` gating,
//! and nothing started or reported once its [`EntryFlags::cancelled`] is set.
//!
//! The clock is the caller's (`now` arguments), so the logic is tested without waiting.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::engine::{EntryFlags, Spec};
use super::wheel::Wheel;
use crate::probe::schedule::{Jitter, MIN_INTERVAL, mode_allows};
use crate::probe::{ProbeOutcome, ProbeReport, first_run_offset};

/// (target, our source port): a SYN in flight.
pub(super) type FlightKey = (SocketAddr, u16);

/// What the wheel holds: an entry's next tick or timeout (valid while the entry's stamp
/// is `stamp`), or the timeout of a one-off probe's SYN.
pub(super) enum Timer {
    Entry { id: u32, stamp: u32 },
    Once { key: FlightKey, isn: u32 },
}

/// What came due.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Due {
    /// Entry `id` starts a run now: send its SYN (or [`Plan::settle`] why not).
    Start { id: u32, stamp: u32 },
    /// Entry `id`'s run timed out; its SYN (if sent) is `flight`.
    TimedOut {
        id: u32,
        stamp: u32,
        flight: Option<(FlightKey, u32)>,
    },
    /// A one-off probe's SYN timed out (its caller gave up already).
    OnceExpired { key: FlightKey, isn: u32 },
}

enum State {
    /// Its next tick is `next`.
    Waiting,
    /// A run started at `started` is in flight (SYN `flight`, once sent).
    Running {
        started: Instant,
        flight: Option<(FlightKey, u32)>,
    },
    /// Its run ended; the report waits to be handed to the channel.
    Reporting,
}

struct Entry {
    spec: Spec,
    flags: Arc<EntryFlags>,
    interval: Duration,
    jitter: Jitter,
    /// The current tick (while waiting: the next one).
    next: Instant,
    state: State,
}

struct Slot {
    /// Bumped at every (re)arm: timers and flights of an earlier one are stale.
    stamp: u32,
    entry: Option<Entry>,
}

/// Every scheduled entry and the wheel of their timers.
pub(super) struct Plan {
    slots: Vec<Slot>,
    free: Vec<u32>,
    wheel: Wheel<Timer>,
    live: usize,
}

impl Plan {
    pub(super) fn new(epoch: Instant) -> Self {
        Plan {
            slots: Vec::new(),
            free: Vec::new(),
            wheel: Wheel::new(epoch),
            live: 0,
        }
    }

    /// Entries scheduled (not yet removed).
    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// Schedules `spec`: its first run at `spec.created` + its stable offset.
    pub(super) fn add(&mut self, spec: Spec, flags: Arc<EntryFlags>) -> u32 {
        let interval = spec.cfg.interval.max(MIN_INTERVAL);
        let spread = spec.spread.clamp(MIN_INTERVAL, interval);
        let next = spec.created + first_run_offset(spec.server, spec.probe, spread);
        let entry = Entry {
            jitter: Jitter::new(spec.cfg.jitter),
            spec,
            flags,
            interval,
            next,
            state: State::Waiting,
        };
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slots.push(Slot {
                    stamp: 0,
                    entry: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[id as usize];
        slot.stamp = slot.stamp.wrapping_add(1);
        slot.entry = Some(entry);
        self.live += 1;
        self.wheel.insert(
            next,
            Timer::Entry {
                id,
                stamp: slot.stamp,
            },
        );
        id
    }

    /// Files a one-off probe's SYN timeout.
    pub(super) fn once_timeout(&mut self, at: Instant, key: FlightKey, isn: u32) {
        self.wheel.insert(at, Timer::Once { key, isn });
    }

    /// Hands out what is due at `now` (starting the runs of due ticks that `mode` lets
    /// probe, skipping the others); drops cancelled entries on the way.
    pub(super) fn due(&mut self, now: Instant, expired: &mut Vec<Timer>, out: &mut Vec<Due>) {
        expired.clear();
        self.wheel.expire(now, expired);
        for timer in expired.drain(..) {
            let (id, stamp) = match timer {
                Timer::Once { key, isn } => {
                    out.push(Due::OnceExpired { key, isn });
                    continue;
                }
                Timer::Entry { id, stamp } => (id, stamp),
            };
            let slot = &mut self.slots[id as usize];
            let Some(entry) = slot.entry.as_mut().filter(|_| slot.stamp == stamp) else {
                continue;
            };
            if entry.flags.cancelled.load(Ordering::Acquire) {
                self.remove(id);
                continue;
            }
            match entry.state {
                State::Waiting => {
                    let tokio_now = tokio::time::Instant::from_std(now);
                    let interval = entry.interval;
                    if mode_allows(
                        entry.spec.cfg.mode,
                        &*entry.spec.signals,
                        tokio_now,
                        interval,
                    ) {
                        entry.state = State::Running {
                            started: now,
                            flight: None,
                        };
                        let timeout = entry.spec.cfg.timeout;
                        self.wheel.insert(now + timeout, Timer::Entry { id, stamp });
                        out.push(Due::Start { id, stamp });
                    } else {
                        self.advance(id, now);
                    }
                }
                State::Running { flight, .. } => out.push(Due::TimedOut { id, stamp, flight }),
                State::Reporting => {}
            }
        }
    }

    /// The target, probe config and start of entry `id`'s run `stamp`, while it runs.
    pub(super) fn running(&self, id: u32, stamp: u32) -> Option<(SocketAddr, &Spec, Instant)> {
        let slot = self.slots.get(id as usize)?;
        let entry = slot.entry.as_ref().filter(|_| slot.stamp == stamp)?;
        match entry.state {
            State::Running { started, .. } => Some((entry.spec.target(), &entry.spec, started)),
            _ => None,
        }
    }

    /// Records the SYN that entry `id`'s run `stamp` sent.
    pub(super) fn sent(&mut self, id: u32, stamp: u32, key: FlightKey, isn: u32) {
        let slot = &mut self.slots[id as usize];
        if let Some(entry) = slot.entry.as_mut().filter(|_| slot.stamp == stamp)
            && let State::Running { flight, .. } = &mut entry.state
        {
            *flight = Some((key, isn));
        }
    }

    /// Ends entry `id`'s run `stamp` with `outcome`, known at `at`: the report to hand
    /// over, or `None` when the run is not current or the entry was cancelled (it is
    /// then removed).
    pub(super) fn settle(
        &mut self,
        id: u32,
        stamp: u32,
        outcome: ProbeOutcome,
        at: Instant,
    ) -> Option<ProbeReport> {
        let slot = &mut self.slots[id as usize];
        let entry = slot.entry.as_mut().filter(|_| slot.stamp == stamp)?;
        if !matches!(entry.state, State::Running { .. }) {
            return None;
        }
        if entry.flags.cancelled.load(Ordering::Acquire) {
            self.remove(id);
            return None;
        }
        entry.state = State::Reporting;
        Some(ProbeReport {
            server: entry.spec.server,
            probe: entry.spec.probe,
            outcome,
            at: tokio::time::Instant::from_std(at),
        })
    }

    /// The report channel of entry `id`'s run `stamp` (waiting to report), unless the
    /// entry was cancelled or the run is not current.
    pub(super) fn reporter(
        &self,
        id: u32,
        stamp: u32,
    ) -> Option<&tokio::sync::mpsc::Sender<ProbeReport>> {
        let entry = self.current(id, stamp)?;
        if entry.flags.cancelled.load(Ordering::Acquire) || !matches!(entry.state, State::Reporting)
        {
            return None;
        }
        Some(&entry.spec.reports)
    }

    /// Entry `id`'s report of run `stamp` was handed over at `now`: schedule its next
    /// tick.
    pub(super) fn reported(&mut self, id: u32, stamp: u32, now: Instant) {
        if self.current(id, stamp).is_some() {
            self.advance(id, now);
        }
    }

    /// Entry `id`'s report channel is closed: it ends ([`EntryFlags::finished`]).
    pub(super) fn closed(&mut self, id: u32, stamp: u32) {
        if let Some(entry) = self.current(id, stamp) {
            entry.flags.finished.store(true, Ordering::Release);
            self.remove(id);
        }
    }

    /// Removes entry `id` if `stamp` is its current run (it was cancelled meanwhile).
    pub(super) fn remove_run(&mut self, id: u32, stamp: u32) {
        if self.current(id, stamp).is_some() {
            self.remove(id);
        }
    }

    /// Entry `id`, if `stamp` is current.
    fn current(&self, id: u32, stamp: u32) -> Option<&Entry> {
        let slot = self.slots.get(id as usize)?;
        slot.entry.as_ref().filter(|_| slot.stamp == stamp)
    }

    /// Removes entry `id` (cancelled, or its report channel gone); its timers go stale.
    fn remove(&mut self, id: u32) {
        let slot = &mut self.slots[id as usize];
        if slot.entry.take().is_some() {
            slot.stamp = slot.stamp.wrapping_add(1);
            self.free.push(id);
            self.live -= 1;
        }
    }

    /// The next tick after the current one: `interval` + jitter later, past `now` (ticks
    /// that passed while the run lasted are skipped, the phase kept).
    fn advance(&mut self, id: u32, now: Instant) {
        let slot = &mut self.slots[id as usize];
        let Some(entry) = slot.entry.as_mut() else {
            return;
        };
        let interval = entry.interval;
        let mut next = entry.next + interval + entry.jitter.sample();
        if next < now {
            let behind = (now - next).as_nanos() / interval.as_nanos();
            next += interval.saturating_mul(u32::try_from(behind + 1).unwrap_or(u32::MAX));
        }
        entry.next = next;
        entry.state = State::Waiting;
        slot.stamp = slot.stamp.wrapping_add(1);
        self.wheel.insert(
            next,
            Timer::Entry {
                id,
                stamp: slot.stamp,
            },
        );
    }

    /// How long from `now` until the wheel may have something due; `None` if empty.
    pub(super) fn next_wait(&self, now: Instant) -> Option<Duration> {
        self.wheel.next_wait(now)
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;
    use crate::config::{ProbeConfig, ProbeKind, ProbeMode};
    use crate::probe::{ServerKey, ServerSignals, SharedSignals};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    struct Bed {
        t0: Instant,
        plan: Plan,
        expired: Vec<Timer>,
        rx: mpsc::Receiver<ProbeReport>,
        tx: mpsc::Sender<ProbeReport>,
    }

    impl Bed {
        fn new() -> Self {
            // The wheel's epoch a second before: tick boundaries fall on t0 + whole ms.
            let epoch = Instant::now();
            let t0 = epoch + Duration::from_secs(1);
            let (tx, rx) = mpsc::channel(100_000);
            Bed {
                t0,
                plan: Plan::new(epoch),
                expired: Vec::new(),
                rx,
                tx,
            }
        }

        fn add(
            &mut self,
            n: u16,
            cfg: ProbeConfig,
            spread: Duration,
            signals: Arc<dyn ServerSignals>,
        ) -> (u32, Arc<EntryFlags>) {
            let flags = Arc::new(EntryFlags::default());
            let spec = Spec {
                server: ServerKey {
                    service: 1,
                    addr: SocketAddr::from(([192, 0, 2, 1], n)),
                },
                probe: 0,
                cfg: Arc::new(cfg),
                signals,
                reports: self.tx.clone(),
                spread,
                created: self.t0,
            };
            (self.plan.add(spec, flags.clone()), flags)
        }

        fn due(&mut self, at: Duration) -> Vec<Due> {
            let mut out = Vec::new();
            self.plan.due(self.t0 + at, &mut self.expired, &mut out);
            out
        }

        /// Ends every started run with a pass at `at` and hands its report over.
        fn pass_all(&mut self, started: &[Due], at: Duration) -> usize {
            let mut n = 0;
            for d in started {
                if let Due::Start { id, stamp } = *d
                    && let Some(r) =
                        self.plan
                            .settle(id, stamp, ProbeOutcome::pass(ms(1), "ok"), self.t0 + at)
                {
                    self.tx.try_send(r).unwrap();
                    self.plan.reported(id, stamp, self.t0 + at);
                    n += 1;
                }
            }
            n
        }
    }

    fn cfg(interval: u64, jitter: u64, timeout: u64) -> ProbeConfig {
        let mut c = ProbeConfig::new("tcp", ProbeKind::Tcp);
        c.interval = ms(interval);
        c.jitter = ms(jitter);
        c.timeout = ms(timeout);
        c
    }

    fn up() -> Arc<dyn ServerSignals> {
        Arc::new(SharedSignals::new(true))
    }

    /// Runs `bed` millisecond by millisecond to `end`, passing every run at once;
    /// returns each entry's start times.
    fn run(bed: &mut Bed, entries: usize, end: u64) -> Vec<Vec<u64>> {
        let mut starts = vec![Vec::new(); entries];
        for t in 0..=end {
            let due = bed.due(ms(t));
            for d in &due {
                if let Due::Start { id, .. } = d {
                    starts[*id as usize].push(t);
                }
            }
            bed.pass_all(&due, ms(t));
        }
        starts
    }

    #[test]
    fn first_runs_fall_at_the_stable_offset_within_the_spread() {
        let mut bed = Bed::new();
        let n = 500;
        for i in 0..n {
            let spread = if i % 2 == 0 { ms(1000) } else { ms(250) };
            bed.add(i, cfg(1000, 0, 100), spread, up());
        }
        let starts = run(&mut bed, n as usize, 999);
        for (i, s) in starts.iter().enumerate() {
            let key = ServerKey {
                service: 1,
                addr: SocketAddr::from(([192, 0, 2, 1], i as u16)),
            };
            let spread = if i % 2 == 0 { ms(1000) } else { ms(250) };
            let offset = first_run_offset(key, 0, spread).as_millis() as u64;
            assert_eq!(s.first(), Some(&offset), "entry {i}");
            assert!(offset < spread.as_millis() as u64);
            assert_eq!(s.len(), 1, "one run in the first interval: {s:?}");
        }
        // Spread: no 100 ms window of the 1 s spread holds more than twice its share.
        let mut per_window = [0usize; 10];
        for s in starts.iter().step_by(2) {
            per_window[(s[0] / 100) as usize] += 1;
        }
        assert!(
            per_window.iter().all(|&c| c > 0 && c <= 50),
            "{per_window:?}"
        );
    }

    #[test]
    fn runs_repeat_every_interval_plus_at_most_the_jitter() {
        let mut bed = Bed::new();
        for i in 0..50 {
            bed.add(i, cfg(100, 30, 10), ms(100), up());
        }
        let starts = run(&mut bed, 50, 3000);
        let mut gaps = Vec::new();
        for s in &starts {
            assert!(s.len() >= 3000 / 130 - 1, "{s:?}");
            for w in s.windows(2) {
                gaps.push(w[1] - w[0]);
            }
        }
        // Whole milliseconds: the wheel rounds a tick up to the next one.
        assert!(gaps.iter().all(|&g| (100..=131).contains(&g)), "{gaps:?}");
        // The jitter is random, not a constant.
        assert!(gaps.iter().any(|&g| g >= 115) && gaps.iter().any(|&g| g < 115));
        let mut reports = 0;
        while bed.rx.try_recv().is_ok() {
            reports += 1;
        }
        assert_eq!(reports, starts.iter().map(Vec::len).sum::<usize>());
    }

    #[test]
    fn a_run_that_outlasts_ticks_skips_them_and_keeps_the_phase() {
        let mut bed = Bed::new();
        let (id, _flags) = bed.add(1, cfg(100, 0, 1000), ms(100), up());
        let first = first_run_offset(
            bed.plan.slots[0].entry.as_ref().unwrap().spec.server,
            0,
            ms(100),
        )
        .as_millis() as u64;
        let mut started = Vec::new();
        for t in 0..=first + 350 {
            let due = bed.due(ms(t));
            if due.iter().any(|d| matches!(d, Due::Start { .. })) {
                started.push((t, due));
            }
        }
        // Nothing overlaps: one run started, still in flight after 3.5 intervals.
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].0, first);
        // It ends at first + 350: the ticks at +100, +200, +300 were skipped; the next
        // is at +400, on the phase.
        let end = first + 350;
        assert_eq!(bed.pass_all(&started[0].1, ms(end)), 1);
        for t in end + 1..first + 400 {
            assert!(bed.due(ms(t)).is_empty(), "at {t}");
        }
        assert!(matches!(
            bed.due(ms(first + 400))[..],
            [Due::Start { id: i, .. }] if i == id
        ));
    }

    #[test]
    fn a_silent_target_times_out_after_the_timeout_and_the_next_tick_follows() {
        let mut bed = Bed::new();
        let (id, _flags) = bed.add(1, cfg(100, 0, 30), ms(1), up());
        // spread 1 ms: the first run is at 0.
        let Due::Start { stamp, .. } = bed.due(ms(0))[0] else {
            panic!("starts at 0")
        };
        let key = (SocketAddr::from(([192, 0, 2, 1], 1)), 40000);
        bed.plan.sent(id, stamp, key, 99);
        for t in 1..30 {
            assert!(bed.due(ms(t)).is_empty());
        }
        assert_eq!(
            bed.due(ms(30)),
            [Due::TimedOut {
                id,
                stamp,
                flight: Some((key, 99))
            }]
        );
        let report = bed
            .plan
            .settle(id, stamp, ProbeOutcome::timed_out(ms(30)), bed.t0 + ms(30))
            .expect("a report");
        assert!(!report.outcome.ok && report.outcome.detail == "timeout");
        bed.plan.reported(id, stamp, bed.t0 + ms(30));
        // A late reply to the timed-out run settles nothing.
        assert!(
            bed.plan
                .settle(
                    id,
                    stamp,
                    ProbeOutcome::pass(ms(31), "late"),
                    bed.t0 + ms(31)
                )
                .is_none()
        );
        for t in 31..100 {
            assert!(bed.due(ms(t)).is_empty(), "at {t}");
        }
        assert!(matches!(bed.due(ms(100))[..], [Due::Start { .. }]));
    }

    #[test]
    fn a_cancelled_entry_never_starts_nor_reports_again() {
        let mut bed = Bed::new();
        let (a, flags_a) = bed.add(1, cfg(100, 0, 50), ms(1), up());
        let (_b, flags_b) = bed.add(2, cfg(100, 0, 50), ms(1), up());
        let due = bed.due(ms(0));
        assert_eq!(due.len(), 2);
        // `a` is dropped while its SYN is in flight: its answer brings no report.
        flags_a.cancelled.store(true, Ordering::Release);
        let Due::Start { stamp, .. } = due
            .iter()
            .find(|d| matches!(d, Due::Start { id, .. } if *id == a))
            .unwrap()
        else {
            unreachable!()
        };
        assert!(
            bed.plan
                .settle(a, *stamp, ProbeOutcome::pass(ms(1), "ok"), bed.t0 + ms(1))
                .is_none()
        );
        assert_eq!(bed.plan.len(), 1);
        // `b` is dropped while waiting: its next tick starts nothing, and it is removed.
        bed.pass_all(&due, ms(1));
        flags_b.cancelled.store(true, Ordering::Release);
        for t in 2..=300 {
            assert!(bed.due(ms(t)).is_empty(), "at {t}");
        }
        assert_eq!(bed.plan.len(), 0);
        assert_eq!(
            bed.rx.try_recv().ok().map(|r| r.server.addr.port()),
            Some(2)
        );
        assert!(
            bed.rx.try_recv().is_err(),
            "b's one report before its drop, a's none"
        );
    }

    #[test]
    fn mode_gates_each_tick_on_the_signals() {
        let mut bed = Bed::new();
        let healthy = Arc::new(SharedSignals::new(true));
        let mut onfail = cfg(100, 0, 10);
        onfail.mode = ProbeMode::Onfail;
        bed.add(1, onfail, ms(1), healthy.clone());
        let idle_traffic = Arc::new(SharedSignals::new(true));
        let mut idle = cfg(100, 0, 10);
        idle.mode = ProbeMode::Idle;
        bed.add(2, idle, ms(1), idle_traffic.clone());
        // Healthy onfail: skipped; idle with traffic every millisecond: skipped.
        let mut started = vec![Vec::new(), Vec::new()];
        for t in 0..=300 {
            if t == 250 {
                // Unhealthy: both probe again, on their phase.
                healthy.set_healthy(false);
                idle_traffic.set_healthy(false);
            }
            idle_traffic.note_traffic(tokio::time::Instant::from_std(bed.t0 + ms(t)));
            let due = bed.due(ms(t));
            for d in &due {
                if let Due::Start { id, .. } = d {
                    started[*id as usize].push(t);
                }
            }
            bed.pass_all(&due, ms(t));
        }
        assert_eq!(started, [vec![300], vec![300]]);
    }
}
