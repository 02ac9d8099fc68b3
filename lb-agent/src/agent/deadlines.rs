//! Time-driven work: the next instant something is due (health expiry, membership
//! recheck, a departing backend's end, a publish retry), cached between changes, and the
//! tick that runs it.

use tokio::time::Instant;

use super::{Agent, Neighbors, departing};
use crate::{dataplane::Dataplane, probe::Prober, publish::PublishError};

impl<D: Dataplane, P: Prober, N: Neighbors> Agent<D, P, N> {
    /// The next instant something time-driven is due (health expiry, membership recheck).
    pub fn next_deadline(&self) -> Option<Instant> {
        if let Some(cached) = self.deadline_cache.get() {
            return cached;
        }
        let deadline = self.scan_deadlines();
        self.deadline_cache.set(Some(deadline));
        deadline
    }

    /// A deadline at `at` may have appeared (a server updated alone): the cached next
    /// deadline becomes at most `at`, without a scan of every server. A cached deadline
    /// that is early (one that went away) only costs an `on_tick` that finds nothing due,
    /// and that rescans.
    pub(super) fn lower_deadline(&self, at: Option<Instant>) {
        if let (Some(at), Some(cached)) = (at, self.deadline_cache.get()) {
            self.deadline_cache
                .set(Some(Some(cached.map_or(at, |c| c.min(at)))));
        }
    }

    pub(super) fn scan_deadlines(&self) -> Option<Instant> {
        self.services
            .iter()
            .flat_map(|s| {
                s.servers
                    .values()
                    .filter_map(|v| v.health.next_deadline())
                    .chain(s.outcome.as_ref().and_then(|o| o.recheck_at))
                    .chain(s.departing.values().map(departing::Departing::deadline))
            })
            .chain(self.publish_retry.due())
            .min()
    }

    /// Runs what is due at `now`.
    pub fn on_tick(&mut self, now: Instant) -> Result<(), PublishError> {
        let started = std::time::Instant::now();
        // A due deadline may end without a transition (an `unavailable` server waiting
        // for its probes' confirmation): the cached deadline must not stay in the past.
        self.deadline_cache.set(None);
        let mut changed = false;
        let mut records = Vec::new();
        for svc in &mut self.services {
            for server in svc.servers.values_mut() {
                if let Some(t) = server.health.tick(now) {
                    server.signals.set_healthy(server.health.usable());
                    records.push((svc.cfg.name.clone(), server.addr.to_string(), t));
                    svc.marked = true;
                    svc.changed_health.push(server.addr);
                }
            }
            if svc
                .outcome
                .as_ref()
                .and_then(|o| o.recheck_at)
                .is_some_and(|at| at <= now)
            {
                svc.mark();
            }
            let departing = svc.departing.len();
            svc.departing.retain(|_, d| d.deadline() > now);
            if svc.departing.len() != departing {
                svc.mark();
            }
            changed |= svc.marked;
        }
        changed |= self.publish_retry.due().is_some_and(|at| at <= now);
        for (s, a, t) in records {
            self.record(&s, &a, &t);
        }
        if changed {
            self.recompute_marked(now, started)?;
        }
        Ok(())
    }
}
