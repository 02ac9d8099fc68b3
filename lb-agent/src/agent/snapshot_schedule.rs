//! When the operator's snapshot is rebuilt: at most every [`snapshot_interval`], spaced
//! by its own cost ([`SNAPSHOT_DUTY`]), at once after an admin change; `snapshot.rs`
//! builds it, `snapshot_readers.rs` answers who waits for it.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Agent, Neighbors};
use crate::{dataplane::Dataplane, probe::Prober};

/// Shortest time between two snapshot rebuilds (a rebuild walks every server).
pub const SNAPSHOT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);
/// Deferred and periodic snapshot rebuilds are spaced by at least this many times the
/// last rebuild's cost, so they take at most 1/SNAPSHOT_DUTY of the agent's thread however
/// many servers there are (a rebuild is linear in them: ~14 ms at 10,000, ~0.6 s at
/// 100,000 on a loaded machine, which rebuilt every 100 ms would starve the loop).
pub const SNAPSHOT_DUTY: u32 = 10;

/// Shortest time between two deferred or periodic snapshot rebuilds, given what the last
/// one cost: [`SNAPSHOT_EVERY`], or [`SNAPSHOT_DUTY`] times the cost if that is longer.
pub fn snapshot_interval(last_cost: std::time::Duration) -> std::time::Duration {
    SNAPSHOT_EVERY.max(last_cost.saturating_mul(SNAPSHOT_DUTY))
}

impl<D: Dataplane, P: Prober, N: Neighbors> Agent<D, P, N> {
    /// Rebuilds the operator's snapshot now (`run` leaves it to readers:
    /// [`Agent::on_snapshot_request`]; tests and benchmarks call it directly).
    pub fn publish_snapshot(&mut self) {
        let started = std::time::Instant::now();
        self.flush_events();
        let snap = super::snapshot::build(self);
        let _ = self.snapshot_tx.send(Arc::new(snap));
        self.snapshot_dirty = false;
        self.snapshot_forced = false;
        self.snapshot_builds += 1;
        self.snapshot_built = Some(Instant::now());
        self.snapshot_cost = started.elapsed();
    }

    /// An admin change: the next read rebuilds the snapshot however recent it is.
    pub(super) fn snapshot_changed_by_admin(&mut self) {
        self.snapshot_dirty = true;
        self.snapshot_forced = true;
    }

    /// For a periodic counters tick (benchmarks; `run` builds on demand): rebuilds the snapshot unless the last rebuild was
    /// too recent for its cost ([`snapshot_interval`]); then it is due at
    /// [`Agent::snapshot_deadline`].
    pub fn refresh_snapshot(&mut self) {
        self.snapshot_dirty = true;
        self.flush_snapshot();
    }

    /// Rebuilds the snapshot if state changed and the last one is at least
    /// [`snapshot_interval`] old (call it after each event, off the verdict-to-maps path;
    /// [`Agent::snapshot_deadline`] says when a deferred rebuild is due).
    pub fn flush_snapshot(&mut self) {
        if self
            .snapshot_deadline()
            .is_some_and(|due| due <= Instant::now())
        {
            self.publish_snapshot();
        }
    }

    /// When a deferred snapshot rebuild is due (`None`: the snapshot is current).
    pub fn snapshot_deadline(&self) -> Option<Instant> {
        self.snapshot_dirty.then(|| {
            self.snapshot_built.map_or_else(Instant::now, |built| {
                built + snapshot_interval(self.snapshot_cost)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn snapshot_rebuilds_take_at_most_a_tenth_of_the_time() {
        assert_eq!(snapshot_interval(Duration::ZERO), SNAPSHOT_EVERY);
        assert_eq!(snapshot_interval(Duration::from_millis(9)), SNAPSHOT_EVERY);
        assert_eq!(
            snapshot_interval(Duration::from_millis(14)),
            Duration::from_millis(140)
        );
        assert_eq!(
            snapshot_interval(Duration::from_millis(650)),
            Duration::from_millis(6_500)
        );
    }
}
