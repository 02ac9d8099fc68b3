//! Failure signals counted over the whole agent for status and `/metrics`: passive
//! events from the data plane by kind, and probe runs without a verdict because of a
//! local fault (`local_faults.rs`).

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::local_faults::LocalFaults;
use crate::view::LocalFaultStatus;

/// The agent-wide failure tallies.
#[derive(Debug, Default)]
pub(super) struct Faults {
    /// Passive events seen, by kind name.
    passive: BTreeMap<String, u64>,
    /// Probes that could not run for a local reason (never held against a server).
    local: LocalFaults,
}

impl Faults {
    /// One passive event of kind `kind` from the data plane (the kind's name is
    /// allocated only the first time it is seen).
    pub fn passive_event(&mut self, kind: &str) {
        match self.passive.get_mut(kind) {
            Some(count) => *count += 1,
            None => {
                self.passive.insert(kind.to_string(), 1);
            }
        }
    }

    /// One probe of `server` in `service` could not run for a local reason at `at`
    /// (counted, and logged at a bounded rate).
    pub fn local_fault(&mut self, service: &str, server: &str, detail: &str, at: Instant) {
        self.local.record(service, server, detail, at);
    }

    /// Passive events seen so far, by kind name.
    pub fn passive_events(&self) -> &BTreeMap<String, u64> {
        &self.passive
    }

    /// The local faults as status shows them at `now`.
    pub fn local_status(&self, now: Instant, at: impl Fn(Instant) -> String) -> LocalFaultStatus {
        self.local.status(now, at)
    }
}
