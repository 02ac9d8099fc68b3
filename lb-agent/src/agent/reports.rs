//! What comes in from probes and the data plane: probe reports routed to their server's
//! health state machine (`probing.rs`), passive failure events, and the per-backend
//! counters that reset passive counts and feed `idle` probes. A verdict marks its
//! service; `recompute.rs` publishes it.

use lb_common::{events::PassiveEvent, events::event_name};
use tokio::time::Instant;

use super::{Agent, Neighbours};
use crate::{
    dataplane::Dataplane,
    probe::{ProbeReport, Prober},
    publish::PublishError,
};

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// A probe finished.
    pub fn on_probe_report(&mut self, report: ProbeReport) -> Result<(), PublishError> {
        self.on_probe_reports([report])
    }

    /// Several probe results at once (what the report channel held): every transition
    /// is recorded, and membership is recomputed and published once for all of them, so
    /// a storm of verdicts (a rack going down) costs one publish, not one per server.
    pub fn on_probe_reports(
        &mut self,
        reports: impl IntoIterator<Item = ProbeReport>,
    ) -> Result<(), PublishError> {
        let mut earliest: Option<Instant> = None;
        let mut latest: Option<Instant> = None;
        let mut records = Vec::new();
        for report in reports {
            let Some((si, index)) = self.probing.route(&self.services, report.server) else {
                continue; // a report of probes replaced or removed since
            };
            let svc = &mut self.services[si];
            let Some(server) = svc.servers.at_mut(index) else {
                continue;
            };
            if !report.outcome.local {
                svc.probe_durations.observe(
                    &svc.cfg.probes,
                    report.probe,
                    report.outcome.duration.as_secs_f64(),
                );
            }
            if report.outcome.local {
                svc.local_faults.note(&report.outcome.detail, report.at);
                self.faults.local_fault(
                    &svc.cfg.name,
                    &server.addr.to_string(),
                    &report.outcome.detail,
                    report.at,
                );
                self.snapshot.changed();
            }
            let pending = server.health.verdicts_pending();
            let transition = server
                .health
                .on_probe(report.probe, &report.outcome, report.at);
            // A `checking` server whose probes all reached a verdict, still `checking`:
            // no transition, but membership may now switch levels (membership rule 4).
            let decided = pending && !server.health.verdicts_pending();
            let changed = transition.is_some() || decided;
            if let Some(t) = transition {
                server.signals.set_healthy(server.health.usable());
                records.push((svc.cfg.name.clone(), server.addr.to_string(), t));
            }
            if changed {
                let addr = server.addr;
                svc.mark_server(addr);
                earliest = Some(earliest.map_or(report.at, |e| e.min(report.at)));
                latest = Some(latest.map_or(report.at, |l| l.max(report.at)));
            }
        }
        for (service, server, t) in &records {
            self.record(service, server, t);
        }
        if let (Some(earliest), Some(latest)) = (earliest, latest) {
            // Propagation counts from the (earliest) verdict, including its wait in the
            // report channel.
            let started = std::time::Instant::now()
                .checked_sub(earliest.elapsed())
                .unwrap_or_else(std::time::Instant::now);
            self.recompute_marked(latest, started)?;
        }
        Ok(())
    }

    /// Passive failure signals from the data plane.
    pub fn on_passive_events(&mut self, events: &[PassiveEvent]) -> Result<(), PublishError> {
        let started = std::time::Instant::now();
        let now = Instant::now();
        self.snapshot.changed();
        let mut changed = false;
        for e in events {
            self.faults.passive_event(event_name(e.kind));
            let Some((service, addr)) = self.publishing.publisher().backend_by_id(e.backend_id)
            else {
                continue;
            };
            let Some(si) = self.services.iter().position(|s| s.cfg.name == service) else {
                continue;
            };
            let Some(server) = self.services[si].servers.get_mut(&addr) else {
                continue;
            };
            if let Some(mut t) = server.health.on_passive_failure(now) {
                server.signals.set_healthy(server.health.usable());
                t.cause = format!("{} ({})", t.cause, event_name(e.kind));
                self.services[si].mark_server(addr);
                self.record(&service, &addr.to_string(), &t);
                changed = true;
            }
        }
        if changed {
            self.recompute_marked(now, started)?;
        }
        Ok(())
    }

    /// Reads per-backend counters: new successful connections reset passive failure
    /// counts, new packets feed `idle` probe mode.
    pub fn poll_stats(&mut self) {
        let now = Instant::now();
        // One read for every backend: a syscall per backend would be most of this
        // call's time at thousands of backends.
        let Ok(all) = self
            .dp
            .backend_stats_below(self.publishing.publisher().backend_id_limit())
        else {
            return;
        };
        let total = all.iter().map(|s| s.packets).fold(0u64, u64::wrapping_add);
        self.announcement.saw_traffic(total, now);
        let publisher = self.publishing.publisher();
        for svc in &mut self.services {
            svc.absorb_counters(publisher, &all, now);
        }
    }
}
