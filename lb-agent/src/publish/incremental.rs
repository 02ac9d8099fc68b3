//! The incremental path of [`Publisher::apply`]: a want that differs from the last one
//! only in backends' roles or MACs (health verdicts, membership) touches only those
//! backends' entries and, if the set taking new flows changed, republishes the live table.

use super::{
    ApplyReport, DesiredService, PublishError, PublishedService, Publisher, backend_entry,
    live_table, stage_entry, takes_new_flows,
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
    /// Publishes `want` given the indices [`PublishedService::changes_since_last`] found:
    /// the changed backends' entries (liveness taken away only after the table), and the
    /// live table if the set of backends taking new flows changed. The home table, the
    /// ids and the VIP entry are unchanged by construction.
    pub(super) fn apply_changes<D: Dataplane>(
        &mut self,
        want: &DesiredService,
        changed: &[usize],
        dp: &mut D,
        report: &mut ApplyReport,
    ) -> Result<(), PublishError> {
        let svc = self
            .services
            .get_mut(&want.name)
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
        for &i in changed {
            let b = &want.backends[i];
            report.backends_examined += 1;
            let published = svc
                .backends
                .get_mut(&b.addr)
                .expect("every backend of the last want is published");
            stage_entry(
                published,
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
        for (id, entry) in after_table {
            dp.set_backend(id, &entry)?;
            report.backends_written += 1;
        }
        svc.last_want = Some(last);
        Ok(())
    }
}
