//! Local faults seen by probes (the agent's own host failed: descriptors, buffers, no
//! route, a starved runtime): counted and reported loudly — a rate-limited log line, a
//! metric and a status field — and never held against a server (docs/local-faults.md).

use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use crate::view::LocalFaultStatus;

/// At most one log line per this period; the others are counted in the next line.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// Status and metric say "local fault" while the last one is at most this old.
pub const ACTIVE_FOR: Duration = Duration::from_secs(30);

/// The agent's record of local faults.
#[derive(Debug, Default)]
pub(super) struct LocalFaults {
    total: u64,
    last: Option<Instant>,
    last_detail: String,
    logged_at: Option<Instant>,
    /// Faults since the last log line that were not logged.
    unlogged: u64,
}

impl LocalFaults {
    /// Counts one probe run without a verdict at `now`, without logging. O(1).
    pub fn note(&mut self, detail: &str, now: Instant) {
        self.total += 1;
        self.last = Some(now);
        detail.clone_into(&mut self.last_detail);
    }

    /// One probe of `server` in `service` could not run properly at `now`: counted and
    /// logged (at most one line per [`LOG_EVERY`]). O(1).
    pub fn record(&mut self, service: &str, server: &str, detail: &str, now: Instant) {
        self.note(detail, now);
        if self
            .logged_at
            .is_some_and(|t| now.saturating_duration_since(t) < LOG_EVERY)
        {
            self.unlogged += 1;
            return;
        }
        warn!(
            service,
            server,
            detail,
            not_logged_since_last = self.unlogged,
            total = self.total,
            "local fault: a probe could not run on this host; servers keep their last verdict"
        );
        self.logged_at = Some(now);
        self.unlogged = 0;
    }

    /// What status and metrics show; `at` renders an instant as RFC 3339.
    pub fn status(&self, now: Instant, at: impl Fn(Instant) -> String) -> LocalFaultStatus {
        LocalFaultStatus {
            total: self.total,
            active: self
                .last
                .is_some_and(|t| now.saturating_duration_since(t) <= ACTIVE_FOR),
            last: self.last.map(at),
            last_detail: (!self.last_detail.is_empty()).then(|| self.last_detail.clone()),
        }
    }
}
