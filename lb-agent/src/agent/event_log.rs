//! Transitions, membership notes and VIP announcement changes: logged, counted, and kept
//! in the shared event log the API reads (`EventLog`, bounded by `EVENT_LOG_LEN`; pending
//! while a reader holds it).

use std::time::SystemTime;

use tracing::info;

use super::{Agent, Neighbors};
use crate::{
    api::EVENT_LOG_LEN, dataplane::Dataplane, health::Transition, probe::Prober, status::Event,
};

impl<D: Dataplane, P: Prober, N: Neighbors> Agent<D, P, N> {
    pub(super) fn record(&mut self, service: &str, server: &str, t: &Transition) {
        self.record_names(service, server, t.from.as_str(), t.to.as_str(), &t.cause);
    }

    /// Logs a transition. The deadlines it may move are taken in by the recompute that
    /// follows every transition (`recompute_services`).
    pub(super) fn record_names(
        &mut self,
        service: &str,
        server: &str,
        from: &str,
        to: &str,
        cause: &str,
    ) {
        self.transitions += 1;
        let unavailable = crate::health::HealthState::Unavailable.as_str();
        if from == unavailable || to == unavailable {
            self.passive_kept.mark();
        }
        info!(service, server, from, to, cause, "transition");
        self.log_event(service, server, from, to, cause);
    }

    /// A membership change (spare running, backup level, cap, fail-open): logged and in
    /// the event log, but not a server transition (`lb_transitions_total`).
    pub(super) fn record_note(&mut self, service: &str, note: &str) {
        info!(service, note, "membership");
        self.log_event(service, "-", "-", "-", note);
    }

    pub(super) fn log_announcements(&mut self, changes: Vec<crate::announce::Change>) {
        for c in changes {
            let to = if c.announced {
                "announced"
            } else {
                "withdrawn"
            };
            self.log_event("-", &c.vip.to_string(), "-", to, c.reason);
        }
    }

    fn log_event(&mut self, service: &str, server: &str, from: &str, to: &str, cause: &str) {
        let event = Event {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            service: service.to_string(),
            server: server.to_string(),
            from: from.to_string(),
            to: to.to_string(),
            cause: cause.to_string(),
        };
        self.pending_events.push(event);
        self.flush_events();
    }

    /// Moves pending events into the shared log unless a reader holds it right now.
    pub(super) fn flush_events(&mut self) {
        if self.pending_events.is_empty() {
            return;
        }
        if let Ok(mut log) = self.events.try_lock() {
            for event in self.pending_events.drain(..) {
                if log.len() >= EVENT_LOG_LEN {
                    log.pop_front();
                }
                log.push_back(event);
            }
        }
    }
}
