//! Which group is active: the primary group (level 0) or a backup level, per `backup_switch`.

use std::{collections::BTreeSet, time::Duration};

use tokio::time::Instant;

use super::BackupSwitch;

/// The active level and the instants `RetryAfter` needs.
#[derive(Clone, Debug, Default)]
pub(super) struct LevelState {
    /// 0 = primary group.
    pub level: u32,
    /// When `level` was entered; set at the first step.
    pub since: Option<Instant>,
    /// Last time lower levels were tried (`RetryAfter`); `None` on the primary group.
    pub last_retry: Option<Instant>,
}

/// Why the active level changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Why {
    /// The level we were on has no usable server.
    Failed,
    /// A lower level is usable again (`TryPrimaryEachFlow`).
    Recovered,
    /// A lower level was usable when the `RetryAfter` try came due.
    Retried(Duration),
}

impl LevelState {
    /// Moves to the level `switch` wants, given the levels with a usable server; returns
    /// why when the level changed. With no usable level, nothing changes; nor while the
    /// active level has no usable server but one whose verdicts are `pending`.
    pub fn step(
        &mut self,
        usable: &BTreeSet<u32>,
        pending: &BTreeSet<u32>,
        switch: BackupSwitch,
        now: Instant,
    ) -> Option<Why> {
        self.since.get_or_insert(now);
        let current_usable = usable.contains(&self.level);
        if !current_usable && pending.contains(&self.level) {
            return None;
        }
        let lowest = usable.first().copied();
        let (to, why) = if !current_usable {
            let next = match switch {
                // Cyclic: the next higher usable level, else wrap to the lowest (0 first).
                BackupSwitch::Permanent => {
                    usable.range(self.level + 1..).next().copied().or(lowest)
                }
                _ => lowest,
            };
            (next?, Why::Failed)
        } else {
            match switch {
                BackupSwitch::TryPrimaryEachFlow => (lowest?, Why::Recovered),
                BackupSwitch::Permanent => return None,
                BackupSwitch::RetryAfter(d) => {
                    if self.level == 0 || now < self.retry_at(d) {
                        return None;
                    }
                    self.last_retry = Some(now);
                    (lowest?, Why::Retried(d))
                }
            }
        };
        if to == self.level {
            return None;
        }
        self.level = to;
        self.since = Some(now);
        // Entering a backup level counts as a try of the levels below it.
        self.last_retry = (to != 0).then_some(now);
        Some(why)
    }

    /// When the next `RetryAfter(d)` try is due (only meaningful on a backup level).
    pub fn retry_at(&self, d: Duration) -> Instant {
        let base = self
            .last_retry
            .or(self.since)
            .expect("set by the first step");
        base + d
    }

    /// When a computation must run even without input changes.
    pub fn recheck_at(&self, switch: BackupSwitch) -> Option<Instant> {
        match switch {
            BackupSwitch::RetryAfter(d) if self.level != 0 => Some(self.retry_at(d)),
            _ => None,
        }
    }
}
