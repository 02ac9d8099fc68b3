//! Time-driven work: the next instant something is due (health expiry, membership
//! recheck, a departing backend's end, a publish retry), cached between changes, and the
//! tick that runs it.

use tokio::time::Instant;

use super::{Agent, Neighbours, ServiceRt, publishing::Publishing};
use crate::{dataplane::Dataplane, probe::Prober, publish::PublishError};

/// The next deadline as last computed. A deadline can only move earlier through a
/// transition (`unavailable` sets its expiry) or a membership computation
/// (`recheck_at`), so the recompute that follows either clears or lowers it; the run
/// loop asks every turn, and a scan of every server each time would be O(servers).
#[derive(Debug, Default)]
pub(super) struct DeadlineCache {
    /// `None`: stale, the next ask scans.
    next: Option<Option<Instant>>,
}

impl DeadlineCache {
    /// The cached deadline, or `scan`'s, which is cached.
    pub fn get_or_scan(&mut self, scan: impl FnOnce() -> Option<Instant>) -> Option<Instant> {
        *self.next.get_or_insert_with(scan)
    }

    /// Something moved deadlines in ways only a scan finds.
    pub fn clear(&mut self) {
        self.next = None;
    }

    /// A deadline at `at` may have appeared (a server updated alone): the cached next
    /// deadline becomes at most `at`, without a scan of every server. A cached deadline
    /// that is early (one that went away) only costs an `on_tick` that finds nothing due,
    /// and that rescans.
    pub fn lower(&mut self, at: Option<Instant>) {
        if let (Some(at), Some(cached)) = (at, self.next.as_mut()) {
            *cached = Some(cached.map_or(at, |c| c.min(at)));
        }
    }
}

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// The next instant something time-driven is due (health expiry, membership recheck,
    /// a departing backend's end, a publish retry).
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let Agent {
            deadlines,
            services,
            publishing,
            ..
        } = self;
        deadlines.get_or_scan(|| scan(services, publishing))
    }

    /// Runs what is due at `now`.
    pub fn on_tick(&mut self, now: Instant) -> Result<(), PublishError> {
        let started = std::time::Instant::now();
        // A due deadline may end without a transition (an `unavailable` server waiting
        // for its probes' confirmation): the cached deadline must not stay in the past.
        self.deadlines.clear();
        let mut changed = false;
        let mut records = Vec::new();
        for svc in &mut self.services {
            changed |= svc.tick(now, &mut records);
        }
        changed |= self.publishing.retry().due().is_some_and(|at| at <= now);
        for (s, a, t) in records {
            self.record(&s, &a, &t);
        }
        if changed {
            self.recompute_marked(now, started)?;
        }
        Ok(())
    }
}

/// The earliest deadline of `services` and the publish retry.
fn scan(services: &[ServiceRt], publishing: &Publishing) -> Option<Instant> {
    services
        .iter()
        .filter_map(ServiceRt::next_deadline)
        .chain(publishing.retry().due())
        .min()
}
