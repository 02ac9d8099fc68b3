//! The incremental path of [`Publisher::apply`]: a want that differs from the last one
//! only in backends' roles or MACs (health verdicts, membership) touches only those
//! backends' entries and, if the set taking new flows changed, republishes the live table.
//! [`Publisher::apply_backends`] takes the changed backends alone (the agent after a
//! membership update), without a pass over the service's description.
use super::{
    ApplyReport, DesiredBackend, DesiredService, PublishError, PublishedService, Publisher,
    backend_entry, live_table, stage_entry, takes_new_flows, write_deferred,
};
use crate::dataplane::Dataplane;

impl PublishedService {
    /// Indices of the backends that changed since the last successful apply, if only
    /// roles or MACs changed (empty: nothing did); `None` when the full path is needed:
    /// nothing applied yet, or the service, its backend list or a weight changed.
    pub(super) fn changes_since_last(&self, want: &DesiredService) -> Option<Vec<usize>> {
        let last = self.last_want.as_ref()?;
        if last.name != want.name
            || last.vip != want.vip
            || last.proto != want.proto
            || last.nat != want.nat
            || last.maglev_size != want.maglev_size
            || last.backends.len() != want.backends.len()
        {
            return None;
        }
        let mut changed = Vec::new();
        for (i, (was, now)) in last.backends.iter().zip(&want.backends).enumerate() {
            if was == now {
                continue;
            }
            if was.addr != now.addr || was.weight != now.weight {
                return None;
            }
            changed.push(i);
        }
        Some(changed)
    }
}

impl Publisher {
    /// Publishes a change of some backends of `service` — roles or MACs, as a health
    /// verdict makes — without the service's whole description: `backends` are the new
    /// wants of the changed backends only. `None` when that is not enough (nothing
    /// published for the service yet or since a failed publish, a backend not in its
    /// last want, a weight changed, the full path forced): the caller then hands the
    /// whole description to [`Publisher::apply_some`]; nothing was written.
    ///
    /// Cost: a lookup per given backend, the changed entries, and the failover pass if
    /// the set taking new flows changed — not the service's size.
    pub fn apply_backends<D: Dataplane>(
        &mut self,
        service: &str,
        backends: &[DesiredBackend],
        dp: &mut D,
    ) -> Result<Option<ApplyReport>, PublishError> {
        let start = std::time::Instant::now();
        let mut report = ApplyReport {
            services_given: 1,
            ..ApplyReport::default()
        };
        let Some(svc) = self.services.get(service).filter(|_| self.incremental) else {
            return Ok(None);
        };
        let Some(last) = svc.last_want.as_ref() else {
            return Ok(None);
        };
        let mut changed = Vec::with_capacity(backends.len());
        for b in backends {
            let Some(i) = svc.backends.get(&b.addr).map(|p| p.want_index) else {
                return Ok(None);
            };
            match last.backends.get(i) {
                Some(was) if was.addr == b.addr && was.weight == b.weight => {
                    if was != b {
                        changed.push((i, b));
                    }
                }
                _ => return Ok(None),
            }
        }
        changed.sort_unstable_by_key(|&(i, _)| i);
        if changed.windows(2).any(|w| w[0].0 == w[1].0) {
            return Ok(None);
        }
        if !changed.is_empty() {
            self.apply_changes(service, &changed, dp, &mut report)?;
        }
        report.elapsed = start.elapsed();
        Ok(Some(report))
    }

    /// Publishes the changed backends `(index in the last want, new want)`, in index
    /// order, of a service whose backend list is otherwise as last published ([`PublishedService::changes_since_last`] or
    /// [`Publisher::apply_backends`] checked it):
    /// their entries (liveness taken away only after the table), and the live table if
    /// the set of backends taking new flows changed. The home table, the ids and the VIP
    /// entry are unchanged by construction.
    pub(super) fn apply_changes<D: Dataplane>(
        &mut self,
        service: &str,
        changed: &[(usize, &DesiredBackend)],
        dp: &mut D,
        report: &mut ApplyReport,
    ) -> Result<(), PublishError> {
        let svc = self
            .services
            .get_mut(service)
            .expect("the caller diffed against this service");
        // Until this apply succeeds, the next one must take the full path.
        let mut last = svc
            .last_want
            .take()
            .expect("the caller diffed against the last want");
        let mut after_table = Vec::new();
        // A copy, made on the first change: `svc.active` must keep saying what the
        // published table holds until the new one is written.
        let mut active: Option<Vec<u32>> = None;
        for &(i, b) in changed {
            report.backends_examined += 1;
            let published = svc
                .backends
                .get_mut(&b.addr)
                .expect("every backend of the last want is published");
            stage_entry(
                published,
                b.addr,
                backend_entry(b, svc.id),
                dp,
                &mut after_table,
                report,
            )?;
            let now_active = takes_new_flows(b);
            if takes_new_flows(&last.backends[i]) != now_active {
                let active = active.get_or_insert_with(|| svc.active.clone());
                match active.binary_search(&published.id) {
                    Err(at) if now_active => active.insert(at, published.id),
                    Ok(at) if !now_active => {
                        active.remove(at);
                    }
                    _ => {}
                }
            }
            last.backends[i] = b.clone();
        }
        if let Some(active) = active
            && active != svc.active
        {
            let live = live_table(&svc.home, &active);
            dp.publish_table(svc.id, &live)?;
            svc.live = live;
            svc.live_version += 1;
            svc.live_slots = Default::default();
            svc.active = active;
            report.tables_published += 1;
        }
        write_deferred(after_table, &mut svc.backends, dp, report)?;
        svc.last_want = Some(last);
        Ok(())
    }
}
