//! Transitions, membership notes and VIP announcement changes ([`Events`]): logged,
//! counted, and kept in the shared event log the API reads (`EventLog`, bounded by
//! `EVENT_LOG_LEN`; pending while a reader holds it).

use std::{collections::VecDeque, sync::Arc, time::SystemTime};

use tokio::sync::Mutex;
use tracing::info;

use super::{Agent, Neighbours};
use crate::{
    announce::Change,
    api::{EVENT_LOG_LEN, EventLog},
    dataplane::Dataplane,
    health::{HealthState, Transition},
    probe::Prober,
    view::Event,
};

/// The agent's side of the event log.
pub(super) struct Events {
    /// The log the API reads.
    log: EventLog,
    /// Events not yet in `log` (an API reader held it).
    pending: Vec<Event>,
    /// Server transitions so far (`lb_transitions_total`).
    transitions: u64,
}

impl Events {
    /// An empty log, and the handle the API reads it through.
    pub fn new() -> (Self, EventLog) {
        let log: EventLog = Arc::new(Mutex::new(VecDeque::new()));
        let events = Events {
            log: log.clone(),
            pending: Vec::new(),
            transitions: 0,
        };
        (events, log)
    }

    /// A server transition: counted, logged and in the event log.
    pub fn transition(&mut self, service: &str, server: &str, from: &str, to: &str, cause: &str) {
        self.transitions += 1;
        info!(service, server, from, to, cause, "transition");
        self.push(service, server, from, to, cause);
    }

    /// A membership change (spare running, backup level, cap, fail-open): logged and in
    /// the event log, but not a server transition (`lb_transitions_total`).
    pub fn note(&mut self, service: &str, note: &str) {
        info!(service, note, "membership");
        self.push(service, "-", "-", "-", note);
    }

    /// VIP announcement changes, into the event log.
    pub fn announcements(&mut self, changes: Vec<Change>) {
        for c in changes {
            let to = if c.announced {
                "announced"
            } else {
                "withdrawn"
            };
            self.push("-", &c.vip.to_string(), "-", to, c.reason);
        }
    }

    /// Server transitions so far.
    pub fn transitions(&self) -> u64 {
        self.transitions
    }

    fn push(&mut self, service: &str, server: &str, from: &str, to: &str, cause: &str) {
        let event = Event {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            service: service.to_string(),
            server: server.to_string(),
            from: from.to_string(),
            to: to.to_string(),
            cause: cause.to_string(),
        };
        self.pending.push(event);
        self.flush();
    }

    /// Moves pending events into the shared log unless a reader holds it right now.
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if let Ok(mut log) = self.log.try_lock() {
            for event in self.pending.drain(..) {
                if log.len() >= EVENT_LOG_LEN {
                    log.pop_front();
                }
                log.push_back(event);
            }
        }
    }
}

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    pub(super) fn record(&mut self, service: &str, server: &str, t: &Transition) {
        self.record_names(service, server, t.from.as_str(), t.to.as_str(), &t.cause);
    }

    /// Logs a transition; one into or out of `unavailable` changes the passive
    /// ejections kept across restarts. The deadlines it may move are taken in by the
    /// recompute that follows every transition (`recompute_services`).
    pub(super) fn record_names(
        &mut self,
        service: &str,
        server: &str,
        from: &str,
        to: &str,
        cause: &str,
    ) {
        let unavailable = HealthState::Unavailable.as_str();
        if from == unavailable || to == unavailable {
            self.persistence.ejections_changed();
        }
        self.events.transition(service, server, from, to, cause);
    }
}
