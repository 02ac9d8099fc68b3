//! Passive failure counting: `max_fails` failures within `fail_timeout`.

use std::collections::VecDeque;

use tokio::time::Instant;

use super::PassivePolicy;

/// The recent passive failures of one server (at most `max_fails` kept).
#[derive(Debug, Clone)]
pub(super) struct PassiveWindow {
    policy: PassivePolicy,
    failures: VecDeque<Instant>,
}

impl PassiveWindow {
    pub(super) fn new(policy: PassivePolicy) -> Self {
        PassiveWindow {
            policy,
            failures: VecDeque::new(),
        }
    }

    pub(super) fn policy(&self) -> PassivePolicy {
        self.policy
    }

    /// Records a failure; `true` when it is the `max_fails`-th within `fail_timeout`
    /// (the window is then emptied). Always `false` with `max_fails = 0`.
    pub(super) fn failure(&mut self, now: Instant) -> bool {
        let max = self.policy.max_fails as usize;
        if max == 0 {
            return false;
        }
        while self
            .failures
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) >= self.policy.fail_timeout)
        {
            self.failures.pop_front();
        }
        self.failures.push_back(now);
        if self.failures.len() >= max {
            self.failures.clear();
            return true;
        }
        false
    }

    /// One success resets the count.
    pub(super) fn success(&mut self) {
        self.failures.clear();
    }
}
