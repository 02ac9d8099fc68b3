//! [`PublishRetry`]: services whose publish failed, tried again on a spaced schedule
//! (docs/internals/publish.md, *A publish that fails*).
//!
//! A failed publish holds its services: later batches of verdicts leave them alone (a
//! verdict about a held service is kept in its server's health, not published), and
//! the retry recomputes them over every server at `FIRST_RETRY`, then doubling up to
//! `LAST_RETRY` while it keeps failing. A reload (a full recompute) tries them at
//! once. Holding them keeps a failure that persists (more backends than the maps hold)
//! from costing a full membership and description of the largest services per batch of
//! verdicts.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::view::PublishStatus;

/// The first retry after a failure: a transient failure (a map update refused under
/// memory pressure) costs its verdicts at most this much extra delay.
pub const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between retries: a failure that persists costs one full recompute
/// of its services this often (at 100,000 servers about 0.1 s of one core: ≤ 2 %), and a
/// fix of its cause (e.g. backends removed) reaches the maps within it.
pub const LAST_RETRY: Duration = Duration::from_secs(5);

/// The held services and the schedule.
#[derive(Debug, Default)]
pub struct PublishRetry {
    /// Services (by name) waiting for the retry.
    held: BTreeSet<String>,
    /// A failed publish was a full one (it also removes what is no longer wanted): the
    /// retry is full too.
    full: bool,
    /// Failures in a row since the last publish that left nothing held.
    attempts: u32,
    due: Option<Instant>,
    /// Failed publishes so far (`lb_agent_publish_failures_total`).
    failures: u64,
    last_error: Option<String>,
}

/// What a due retry takes.
#[derive(Debug, PartialEq, Eq)]
pub struct DueRetry {
    pub services: BTreeSet<String>,
    pub full: bool,
}

impl PublishRetry {
    /// The wait before retry number `attempts` (1 = the first).
    pub fn backoff(attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(16);
        (FIRST_RETRY * (1u32 << doublings)).min(LAST_RETRY)
    }

    /// A publish of `services` (`full`: every service) failed at `now` with `error`.
    pub fn failed(
        &mut self,
        services: impl IntoIterator<Item = String>,
        full: bool,
        now: Instant,
        error: String,
    ) {
        self.held.extend(services);
        self.full |= full;
        self.attempts = self.attempts.saturating_add(1);
        self.failures += 1;
        self.due = Some(now + Self::backoff(self.attempts));
        self.last_error = Some(error);
    }

    /// A publish succeeded: with nothing held any more, the schedule starts over.
    pub fn succeeded(&mut self) {
        if self.held.is_empty() && !self.full {
            self.attempts = 0;
            self.due = None;
        }
    }

    /// Whether `service` waits for the retry (batches leave it alone).
    pub fn holds(&self, service: &str) -> bool {
        self.held.contains(service)
    }

    /// When the retry is due, if one waits.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Takes what is held when the retry is due at `now` (the caller recomputes it);
    /// the attempt count stays until a publish succeeds.
    pub fn take_due(&mut self, now: Instant) -> Option<DueRetry> {
        if self.due.is_none_or(|d| d > now) {
            return None;
        }
        self.due = None;
        Some(DueRetry {
            services: std::mem::take(&mut self.held),
            full: std::mem::take(&mut self.full),
        })
    }

    /// `service` is tried now (an operator's change): it is no longer held; the
    /// attempt count stays, so a new failure waits longer.
    pub fn release(&mut self, service: &str) {
        self.held.remove(service);
    }

    /// A full recompute is about to try every service: nothing stays held.
    pub fn take_all(&mut self) {
        self.held.clear();
        self.full = false;
        self.due = None;
    }

    /// For the snapshot (status and metrics).
    pub fn status(&self, now: Instant) -> PublishStatus {
        PublishStatus {
            failures: self.failures,
            held: self.held.iter().cloned().collect(),
            retry_in_seconds: self
                .due
                .map(|d| d.saturating_duration_since(now).as_secs_f64()),
            last_error: self.last_error.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_100_ms_to_5_s() {
        let waits: Vec<u64> = (1..=9)
            .map(|a| PublishRetry::backoff(a).as_millis() as u64)
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(PublishRetry::backoff(u32::MAX), LAST_RETRY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_is_due_once_and_the_schedule_restarts_after_a_success() {
        let t0 = Instant::now();
        let mut r = PublishRetry::default();
        r.failed(["a".to_string()], false, t0, "e1".into());
        assert!(r.holds("a") && !r.holds("b"));
        assert_eq!(r.due(), Some(t0 + FIRST_RETRY));
        assert_eq!(r.take_due(t0 + FIRST_RETRY / 2), None, "not yet");
        let due = r.take_due(t0 + FIRST_RETRY).expect("due");
        assert_eq!((due.services.len(), due.full), (1, false));
        assert!(!r.holds("a"), "taken for the retry");
        // It fails again: the next wait doubles.
        let t1 = t0 + FIRST_RETRY;
        r.failed(due.services, false, t1, "e2".into());
        assert_eq!(r.due(), Some(t1 + 2 * FIRST_RETRY));
        assert_eq!(r.status(t1).failures, 2);
        // A publish of another service succeeds: `a` is still held, the schedule stays.
        r.succeeded();
        assert_eq!(r.due(), Some(t1 + 2 * FIRST_RETRY));
        let t2 = t1 + 2 * FIRST_RETRY;
        r.take_due(t2).expect("due");
        r.succeeded();
        assert_eq!(r.due(), None);
        r.failed(["a".to_string()], true, t2, "e3".into());
        assert_eq!(
            r.due(),
            Some(t2 + FIRST_RETRY),
            "starts over at the first wait"
        );
        assert!(r.take_due(t2 + FIRST_RETRY).expect("due").full);
    }
}
