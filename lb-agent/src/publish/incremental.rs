//! The incremental path of [`Publisher::apply`]: a want that differs from the last one
//! only in backends' roles or MACs (health verdicts, membership) touches only those
//! backends' entries and, if the set taking new flows changed, rewrites the live table's changed slots.
//! [`Publisher::apply_backends`] takes the changed backends alone (the agent after a
//! membership update), without a pass over the service's description.
use super::plan::{backend_entry, takes_new_flows};
use super::state::PublishedService;
use super::write::{stage_entry, write_deferred};
use super::{
    DesiredBackend, DesiredService, PublishError, PublishReport, Publisher,
    failover::{Whole, slot_writes},
};
use std::collections::HashSet;

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
            || last.tunnel != want.tunnel
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

/// Toggles in one publish up to which the slot-by-slot path is always taken: a single
/// verdict, or a few dozen, never pay for the whole table.
const BATCH_ALWAYS_INCREMENTAL: usize = 64;

/// Whether `toggled` backends starting or stopping at once, in a set of `set` backends
/// taking new flows (the larger of before and after), are cheaper computed whole. Each
/// departure re-walks the slots it holds, and every departure still to come lengthens
/// those walks, so the slot-by-slot cost of a batch grows faster than its size, while a
/// whole pass grows with the table (one pass over 262,147 slots at 10,000 backends:
/// 3–17 ms for 3,000 to 9,000 leaving at once; docs/internals/publish.md, "Storms").
/// Beyond an eighth of the set at once — a rack, a zone, a probe network failing — the
/// whole table is cheaper.
fn batch_is_whole(toggled: usize, set: usize) -> bool {
    toggled > BATCH_ALWAYS_INCREMENTAL && toggled * 8 > set
}

/// The sorted set `active` after `toggled` (each id once; `true`: it enters): a few
/// toggles in place, a batch in one pass (it may toggle thousands of backends).
fn changed_set(active: &[u32], toggled: &[(u32, bool)]) -> Vec<u32> {
    let mut set = active.to_vec();
    if toggled.len() <= BATCH_ALWAYS_INCREMENTAL {
        for &(id, enters) in toggled {
            match set.binary_search(&id) {
                Err(at) if enters => set.insert(at, id),
                Ok(at) if !enters => {
                    set.remove(at);
                }
                _ => {}
            }
        }
        return set;
    }
    let leaving: HashSet<u32> = toggled.iter().filter(|t| !t.1).map(|t| t.0).collect();
    set.retain(|id| !leaving.contains(id));
    set.extend(toggled.iter().filter(|t| t.1).map(|t| t.0));
    set.sort_unstable();
    set
}

impl PublishedService {
    /// Publishes the live table for the new set `active`, which differs from the last by
    /// `toggled` (id, now active): only the slots that change, written in place
    /// ([`Dataplane::write_slots`]), when the walk state allows; else the whole table.
    fn publish_changed_slots<D: Dataplane>(
        &mut self,
        active: Vec<u32>,
        toggled: &[(u32, bool)],
        dp: &mut D,
        report: &mut PublishReport,
    ) -> Result<(), PublishError> {
        if batch_is_whole(toggled.len(), self.active.len().max(active.len())) {
            return self.publish_whole(active, dp, report);
        }
        let Some((writes, before)) = self.changed_slots(&active, toggled) else {
            return self.publish_whole(active, dp, report);
        };
        self.live_version += 1;
        self.live_slots = Default::default();
        if !writes.is_empty() {
            self.table_stale = true;
            if let Err(e) = dp.write_slots(self.id, &writes) {
                // `live` stays what the maps hold (status counts slots from it); the
                // stale flag makes the next publish of this service whole.
                for (slot, was) in before {
                    self.live[slot as usize] = was;
                }
                return Err(e.into());
            }
            self.table_stale = false;
        }
        self.active = active;
        report.tables_published += 1;
        report.slots_written += writes.len();
        Ok(())
    }

    /// Updates `live` for `toggled` through the walk state and returns the slots to
    /// write with their new owner, and every slot it changed with its owner before;
    /// `None` (state dropped) when the table must be computed whole: no state, nothing
    /// active afterwards, a walk out of steps.
    #[allow(clippy::type_complexity)]
    fn changed_slots(
        &mut self,
        active: &[u32],
        toggled: &[(u32, bool)],
    ) -> Option<(Vec<(u32, u32)>, Vec<(u32, u32)>)> {
        let mut walks = self.failover.take()?;
        if active.is_empty() || self.table_stale {
            return None;
        }
        let mut changed = Vec::new();
        // Returns first, then departures one by one, each against the set after it (the
        // departures still to come count as active): every step is then the change from
        // one valid set to the next, as `Failover` requires, and no step empties the set.
        for &(id, _) in toggled.iter().filter(|t| t.1) {
            walks.enter(id, &self.home, &mut self.live, &mut changed);
        }
        // The departures not walked yet, found in O(1) (a batch may hold thousands).
        let mut later: HashSet<u32> = toggled.iter().filter(|t| !t.1).map(|t| t.0).collect();
        for &(id, _) in toggled.iter().filter(|t| !t.1) {
            later.remove(&id);
            let still = |b: u32| active.binary_search(&b).is_ok() || later.contains(&b);
            if let Err(Whole) = walks.leave(id, &self.home, &mut self.live, still, &mut changed) {
                return None;
            }
        }
        self.failover = Some(walks);
        let mut before = changed.clone();
        before.sort_by_key(|&(slot, _)| slot); // stable: each slot's first record first
        before.dedup_by_key(|&mut (slot, _)| slot);
        Some((slot_writes(changed, &self.live), before))
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
    /// Cost: a lookup per given backend, the changed entries, and the changed table
    /// slots if the set taking new flows changed — not the service's size.
    pub fn apply_backends<D: Dataplane>(
        &mut self,
        service: &str,
        backends: &[DesiredBackend],
        dp: &mut D,
    ) -> Result<Option<PublishReport>, PublishError> {
        let start = std::time::Instant::now();
        let mut report = PublishReport {
            services_given: 1,
            ..PublishReport::default()
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
        report: &mut PublishReport,
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
        // Backends that start (`true`) or stop taking new flows, by id, against
        // `svc.active` (which must keep saying what the published table holds until the
        // new one is written; each backend is in `changed` once).
        let mut toggled: Vec<(u32, bool)> = Vec::new();
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
            if takes_new_flows(&last.backends[i]) != now_active
                && svc.active.binary_search(&published.id).is_ok() != now_active
            {
                toggled.push((published.id, now_active));
            }
            last.backends[i] = b.clone();
        }
        if !toggled.is_empty() {
            let active = changed_set(&svc.active, &toggled);
            svc.publish_changed_slots(active, &toggled, dp, report)?;
        }
        write_deferred(after_table, &mut svc.backends, dp, report)?;
        svc.last_want = Some(last);
        Ok(())
    }
}
