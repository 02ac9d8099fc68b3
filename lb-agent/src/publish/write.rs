//! Writing, the full path: makes the maps match a want — ids handed out, backend
//! entries written (those that take liveness away only once the new table no longer
//! points at them), home and live tables published whole, the VIP entry last; services
//! no longer wanted (and a previous run's leftovers) removed. The incremental path is
//! [`super::incremental`]; what to write is computed by [`super::plan`].

use std::{
    collections::{BTreeMap, HashSet},
    net::SocketAddr,
    time::Instant,
};

use lb_common::maps::Backend;

use super::plan::{
    backend_entry, retired, service_meta, takes_new_flows, vip_key, whole_live_table,
};
use super::state::{NOT_WANTED, PublishedBackend, PublishedService};
use super::{DesiredService, PublishError, PublishReport, Publisher};
use crate::{
    dataplane::Dataplane,
    maglev::{self, MaglevBackend},
};

impl Publisher {
    /// Makes the data plane match `desired`, writing only what changed.
    pub fn apply<D: Dataplane>(
        &mut self,
        desired: &[DesiredService],
        dp: &mut D,
    ) -> Result<PublishReport, PublishError> {
        let start = Instant::now();
        let mut report = PublishReport::default();

        let wanted: HashSet<&str> = desired.iter().map(|d| d.name.as_str()).collect();
        let gone: Vec<String> = self
            .services
            .keys()
            .filter(|name| !wanted.contains(name.as_str()))
            .cloned()
            .collect();
        for name in gone {
            let svc = self.services.remove(&name).expect("listed above");
            dp.remove_service(&svc.vip, svc.id)?;
            for b in svc.backends.into_values() {
                self.owners.remove(&b.id);
                if let Some(entry) = b.entry {
                    dp.set_backend(b.id, &retired(entry))?;
                }
                self.backend_ids.give_back(b.id);
                report.backends_written += 1;
            }
            self.service_ids.give_back(svc.id);
        }

        self.apply_each(desired, dp, &mut report)?;
        // What a previous run published that the configuration no longer has.
        for (vip, svc) in std::mem::take(&mut self.adopted) {
            dp.remove_service(&vip, svc.id)?;
            for (id, b) in svc.backends.into_values() {
                dp.set_backend(id, &retired(b))?;
                self.backend_ids.give_back(id);
                report.backends_written += 1;
            }
            self.service_ids.give_back(svc.id);
        }
        for id in std::mem::take(&mut self.orphans) {
            self.backend_ids.give_back(id);
        }
        report.elapsed = start.elapsed();
        Ok(report)
    }

    /// Makes the data plane match `desired` for these services only, writing only what
    /// changed; services not named stay as published (nothing is removed). For a change
    /// that concerns some services (a verdict): the work is theirs, not every service's.
    pub fn apply_some<D: Dataplane>(
        &mut self,
        desired: &[DesiredService],
        dp: &mut D,
    ) -> Result<PublishReport, PublishError> {
        let start = Instant::now();
        let mut report = PublishReport::default();
        self.apply_each(desired, dp, &mut report)?;
        report.elapsed = start.elapsed();
        Ok(report)
    }

    pub(super) fn apply_each<D: Dataplane>(
        &mut self,
        desired: &[DesiredService],
        dp: &mut D,
        report: &mut PublishReport,
    ) -> Result<(), PublishError> {
        report.services_given += desired.len();
        for want in desired {
            if let Some(changed) = self
                .services
                .get(&want.name)
                .and_then(|s| s.changes_since_last(want))
            {
                if changed.is_empty() {
                    continue;
                }
                if self.incremental {
                    let changed: Vec<_> = changed.iter().map(|&i| (i, &want.backends[i])).collect();
                    self.apply_changes(&want.name, &changed, dp, report)?;
                    continue;
                }
            }
            self.apply_service(want, dp, report)?;
            if let Some(svc) = self.services.get_mut(&want.name) {
                svc.last_want = Some(want.clone());
            }
        }
        Ok(())
    }

    pub(super) fn apply_service<D: Dataplane>(
        &mut self,
        want: &DesiredService,
        dp: &mut D,
        report: &mut PublishReport,
    ) -> Result<(), PublishError> {
        let vip = vip_key(want.vip, want.proto);
        if !self.services.contains_key(&want.name)
            && let Some(prev) = self.adopted.remove(&vip)
        {
            for (addr, (id, _)) in &prev.backends {
                self.owners.insert(*id, (want.name.clone(), *addr));
            }
            self.services.insert(
                want.name.clone(),
                PublishedService::new(
                    prev.id,
                    vip,
                    Some(prev.meta),
                    prev.backends
                        .into_iter()
                        .map(|(addr, (id, b))| {
                            let entry = Some(b);
                            (
                                addr,
                                PublishedBackend {
                                    id,
                                    entry,
                                    want_index: 0,
                                },
                            )
                        })
                        .collect(),
                ),
            );
        }
        if !self.services.contains_key(&want.name) {
            let id = self
                .service_ids
                .take()
                .ok_or(PublishError::TooManyServices)?;
            self.services.insert(
                want.name.clone(),
                PublishedService::new(id, vip, None, BTreeMap::new()),
            );
        }
        let svc = self.services.get_mut(&want.name).expect("inserted above");
        let is_new = svc.meta.is_none();
        // Until this apply succeeds, the next one must take the full path again.
        svc.last_want = None;

        // Every published backend the loop below does not visit left the service: it
        // keeps this mark (no hashing of every wanted address to find them).
        for b in svc.backends.values_mut() {
            b.want_index = NOT_WANTED;
        }
        // Writes that take liveness away wait until the new table no longer points at
        // those backends: a packet must never find a slot whose backend is not live.
        let mut after_table: Vec<Deferred> = Vec::new();

        // Home table: every configured backend with its weight (healthy or not); live
        // table: the home table with inactive backends' slots failed over.
        let mut home_input = Vec::new();
        let mut active = Vec::new();
        for (i, b) in want.backends.iter().enumerate() {
            let published = match svc.backends.entry(b.addr) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let id = self
                        .backend_ids
                        .take()
                        .ok_or(PublishError::TooManyBackends {
                            max: self.backend_ids.end - 1,
                        })?;
                    self.owners.insert(id, (want.name.clone(), b.addr));
                    e.insert(PublishedBackend {
                        id,
                        entry: None,
                        want_index: i,
                    })
                }
            };
            published.want_index = i;
            report.backends_examined += 1;
            stage_entry(
                published,
                b.addr,
                backend_entry(b, svc.id),
                dp,
                &mut after_table,
                report,
            )?;
            if b.weight > 0 {
                home_input.push(MaglevBackend {
                    id: published.id,
                    key: maglev::stable_key(&b.addr),
                    weight: b.weight,
                });
            }
            if takes_new_flows(b) {
                active.push(published.id);
            }
        }
        // Backends that left the service: their flows re-hash, their ids are freed (their
        // retirements first, as before the table's own deferred writes).
        let gone: Vec<SocketAddr> = svc
            .backends
            .iter()
            .filter(|(_, b)| b.want_index == NOT_WANTED)
            .map(|(a, _)| *a)
            .collect();
        let mut freed = Vec::with_capacity(gone.len());
        let mut retire = Vec::with_capacity(gone.len());
        for addr in gone {
            let b = svc.backends.remove(&addr).expect("listed above");
            self.owners.remove(&b.id);
            if let Some(entry) = b.entry {
                retire.push(Deferred {
                    id: b.id,
                    entry: retired(entry),
                    addr: None,
                });
            }
            freed.push(b.id);
        }
        after_table.splice(0..0, retire);
        home_input.sort_unstable_by_key(|m| (m.id, m.key, m.weight));
        active.sort_unstable();
        // (A new service with no weighted backend still gets a full table of empty slots.)
        let size = want.maglev_size.unwrap_or_else(|| {
            lb_common::maglev_size_for(u32::try_from(want.backends.len()).unwrap_or(u32::MAX))
        });
        // A new size (a new service, or its backends outgrew the old one) is a new table.
        let home_changed = home_input != svc.home_members || svc.home.len() != size as usize;
        if home_changed {
            svc.home = maglev::build_table(&home_input, size);
            svc.home_members = home_input;
        }
        if home_changed || active != svc.active || is_new || svc.table_stale {
            svc.publish_whole(active, dp, report)?;
        }
        write_deferred(after_table, &mut svc.backends, dp, report)?;
        for id in freed {
            self.backend_ids.give_back(id);
        }

        let meta = service_meta(svc.id, want);
        if vip != svc.vip {
            dp.remove_service(&svc.vip, svc.id)?;
            // remove_service emptied the table; put the current one back.
            dp.publish_table(svc.id, &svc.live)?;
            svc.vip = vip;
            svc.meta = None;
        }
        if svc.meta != Some(meta) {
            dp.upsert_service(&svc.vip, &meta)?;
            svc.meta = Some(meta);
            report.services_written += 1;
        }
        Ok(())
    }
}

impl PublishedService {
    /// Computes the live table whole from `home` and `active`, with its walk state, and
    /// publishes it whole.
    pub(super) fn publish_whole<D: Dataplane>(
        &mut self,
        active: Vec<u32>,
        dp: &mut D,
        report: &mut PublishReport,
    ) -> Result<(), PublishError> {
        let (live, walks) = whole_live_table(&self.home, &active);
        self.failover = None;
        self.table_stale = true;
        // `live` changes only once the maps hold it (status counts slots from it).
        dp.publish_table(self.id, &live)?;
        self.live = live;
        self.failover = walks;
        self.live_version += 1;
        self.live_slots = Default::default();
        self.table_stale = false;
        self.active = active;
        report.tables_published += 1;
        report.slots_written += self.live.len();
        Ok(())
    }
}

/// A backend entry to write once the new table no longer points at the backend.
pub(super) struct Deferred {
    pub(super) id: u32,
    pub(super) entry: Backend,
    /// The published backend it belongs to (`None`: it left the service).
    pub(super) addr: Option<SocketAddr>,
}

/// Writes `entry` if it differs from what `published` holds: now, or — when it takes
/// liveness away — into `after_table`, written once the new table no longer points at
/// the backend (a packet must never find a slot whose backend is not live). `published`
/// records an entry only once it is written: after a failed publish, the next one
/// writes what did not make it.
pub(super) fn stage_entry<D: Dataplane>(
    published: &mut PublishedBackend,
    addr: SocketAddr,
    entry: Backend,
    dp: &mut D,
    after_table: &mut Vec<Deferred>,
    report: &mut PublishReport,
) -> Result<(), PublishError> {
    if published.entry != Some(entry) {
        let had = published.entry.map_or(0, |e| e.flags);
        // A flag taken away (LIVE or SERVING) waits for the table; one given is
        // written before the table can point at it.
        if had & !entry.flags != 0 {
            after_table.push(Deferred {
                id: published.id,
                entry,
                addr: Some(addr),
            });
        } else {
            dp.set_backend(published.id, &entry)?;
            report.backends_written += 1;
            published.entry = Some(entry);
        }
    }
    Ok(())
}

/// Writes the entries [`stage_entry`] deferred, once the table is published, and
/// records them as written.
pub(super) fn write_deferred<D: Dataplane>(
    after_table: Vec<Deferred>,
    backends: &mut BTreeMap<SocketAddr, PublishedBackend>,
    dp: &mut D,
    report: &mut PublishReport,
) -> Result<(), PublishError> {
    for d in after_table {
        dp.set_backend(d.id, &d.entry)?;
        report.backends_written += 1;
        if let Some(published) = d.addr.and_then(|a| backends.get_mut(&a)) {
            published.entry = Some(d.entry);
        }
    }
    Ok(())
}
