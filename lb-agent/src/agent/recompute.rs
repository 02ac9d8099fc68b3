//! From marked services to the maps: membership recomputed (for the changed servers
//! alone when that is all that changed, else over every server), the data-plane view
//! described (`desired.rs`) and handed to the [`crate::publish::Publisher`]; a failed
//! publish is retried on a spaced schedule (`publish_retry.rs`).

use tokio::time::Instant;

use super::desired::{desired_backend, desired_service};
use super::{Agent, MembershipWork, Neighbours, ServerRt};
use crate::{dataplane::Dataplane, probe::Prober, publish::PublishError};

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// Recomputes membership of every service and publishes what changed; `started` is
    /// when the event that triggered this was taken (propagation is measured from it).
    pub(super) fn recompute(
        &mut self,
        now: Instant,
        started: std::time::Instant,
    ) -> Result<(), PublishError> {
        // Every service is tried now, including those waiting for a retry.
        self.publishing.retry_mut().take_all();
        for svc in &mut self.services {
            svc.mark();
        }
        self.recompute_services(now, started, true)
    }

    /// Recomputes and publishes only the [marked](ServiceRt::marked) services: a verdict
    /// about one server costs its service's membership, not every service's.
    pub(super) fn recompute_marked(
        &mut self,
        now: Instant,
        started: std::time::Instant,
    ) -> Result<(), PublishError> {
        if let Some(due) = self.publishing.retry_mut().take_due(now) {
            if due.full {
                return self.recompute(now, started);
            }
            for svc in &mut self.services {
                if due.services.contains(&svc.cfg.name) {
                    svc.mark();
                }
            }
        }
        self.recompute_services(now, started, false)
    }

    /// `all`: every service is marked and the publisher also removes what is no longer
    /// wanted; otherwise the others stay as published.
    pub(super) fn recompute_services(
        &mut self,
        now: Instant,
        started: std::time::Instant,
        all: bool,
    ) -> Result<(), PublishError> {
        self.persistence.save_ejections(&self.services);
        let mut desired = Vec::new();
        // The earliest deadline of the servers updated alone; a computation over every
        // server makes the cached next deadline stale.
        let mut updated_deadline: Option<Instant> = None;
        let mut computed = false;
        // Services whose verdicts changed only some roles: (service, changed backends).
        let mut partial = Vec::new();
        let mut notes = Vec::new();
        let mut recomputed = Vec::new();
        let mut work = MembershipWork::default();
        let publishing = &self.publishing;
        let macs = self.macs.known();
        for (si, svc) in self
            .services
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.marked)
        {
            if !all && publishing.retry().holds(&svc.cfg.name) {
                // Its publish failed: the retry recomputes it over every server (the
                // verdicts stay in its servers' health until then).
                svc.unmark();
                continue;
            }
            recomputed.push(si);
            if let Some(moved) = svc.update_membership(now, &mut work) {
                for a in &svc.changed_health {
                    let at = svc.servers.get(a).and_then(|s| s.health.next_deadline());
                    updated_deadline = match (updated_deadline, at) {
                        (Some(x), Some(y)) => Some(x.min(y)),
                        (x, y) => x.or(y),
                    };
                }
                svc.unmark();
                let outcome = svc.outcome.as_ref().expect("updated above");
                let backends: Vec<_> = moved
                    .iter()
                    .map(|&i| desired_backend(svc, outcome.roles[i], macs))
                    .collect();
                if !backends.is_empty() {
                    partial.push((si, backends));
                }
                continue;
            }
            svc.unmark();
            computed = true;
            let inputs: Vec<_> = svc.servers.values().map(ServerRt::member_input).collect();
            work.inputs += inputs.len();
            work.computed += 1;
            let outcome = svc.membership.compute(&inputs, &svc.policy(), now);
            for change in &outcome.changes {
                notes.push((svc.cfg.name.clone(), change.clone()));
            }
            desired.push(desired_service(svc, &outcome, macs));
            svc.outcome = Some(outcome);
        }
        for (service, note) in notes {
            self.events.note(&service, &note);
        }
        self.publishing.set_membership_work(work);
        if computed {
            self.deadlines.clear();
        } else {
            self.deadlines.lower(updated_deadline);
        }
        let applied = self.publishing.publish(
            &mut self.dp,
            &self.services,
            self.macs.known(),
            desired,
            partial,
            all,
        );
        let report = match applied {
            Ok(report) => report,
            Err(e) => {
                // Not published: the retry takes these services again, over every
                // server (membership already took the verdicts in), on its schedule.
                let names = recomputed
                    .into_iter()
                    .map(|si| self.services[si].cfg.name.clone());
                self.publishing.failed(names, all, now, &e);
                self.deadlines.clear();
                self.snapshot.changed();
                return Err(e);
            }
        };
        self.publishing.succeeded(report);
        // After the tables: a VIP is announced only once the node can forward it.
        self.announce();
        self.publishing.observe_propagation(started);
        self.snapshot.changed();
        Ok(())
    }
}
