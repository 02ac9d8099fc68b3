//! When the operator's snapshot is rebuilt: at most every [`snapshot_interval`], spaced
//! by its own cost ([`SNAPSHOT_DUTY`]), at once after an admin change; `build.rs`
//! builds it, `readers.rs` answers who waits for it.

use tokio::time::Instant;

use super::SnapshotCache;

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

impl SnapshotCache {
    /// When a deferred rebuild is due (`None`: the snapshot is current).
    pub fn deadline(&self) -> Option<Instant> {
        self.dirty.then(|| {
            self.built
                .map_or_else(Instant::now, |built| built + snapshot_interval(self.cost))
        })
    }

    /// Whether state changed and the last build is at least [`snapshot_interval`] old at
    /// `now`.
    pub fn rebuild_due(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|due| due <= now)
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
