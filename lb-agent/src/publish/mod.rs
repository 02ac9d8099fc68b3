//! Publishes the desired services into the data plane: service and backend ids, backend
//! entries, Maglev tables, VIPs — writing only what changed.
//!
//! Tables: each service has a *home* table, weighted Maglev over all its configured
//! backends (rebuilt only when that set or a weight changes), and a *live* table, the
//! home table with the slots of backends that must not take new flows failed over to
//! the others ([`maglev::failover_table`]). A health verdict costs neither a Maglev
//! rebuild nor a pass over the table: the slots it changes are found from the failover
//! walks kept per slot ([`failover`]) and written in place.
//!
//! Order matters so that no packet sees a half-made service: a new service gets its
//! backends, then its table, then its VIP entry; a removed one loses its VIP first.
//!
//! Cost: a want that differs from the last one only in roles or MACs (a health verdict,
//! a membership change) takes the incremental path ([`incremental`]): work for the
//! changed backends only and the table slots that change; given the changed
//! backends alone ([`Publisher::apply_backends`]), no pass over the service. Anything else
//! (servers added or removed, a weight, the VIP) takes the full path, linear in the
//! service's backends. See docs/internals/publish.md.

mod failover;
mod incremental;
#[cfg(test)]
mod incremental_tests;

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    net::{IpAddr, SocketAddr},
    ops::RangeInclusive,
    time::{Duration, Instant},
};

use lb_common::{
    FAMILY_V4, FAMILY_V6, MAX_BACKENDS, MAX_SERVICES,
    maps::{
        BACKEND_F_LIVE, BACKEND_F_SERVING, Backend, MAX_SNAT_ADDRS, SERVICE_F_GUE, SERVICE_F_NAT,
        SERVICE_F_TUNNEL, ServiceMeta, VipKey,
    },
};

use crate::{
    dataplane::{Dataplane, DataplaneError, PublishedState},
    maglev::{self, MaglevBackend},
};

/// What a backend does in the data plane, and the flags its entry carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// In the Maglev table: receives new flows and keeps its pinned flows
    /// (`BACKEND_F_LIVE | BACKEND_F_SERVING`).
    Active,
    /// Not in the table, but its established TCP flows stay until they end; a SYN reusing
    /// a pinned 5-tuple re-hashes, pinned UDP flows move (`BACKEND_F_LIVE`): left traffic
    /// for a health or membership reason (unhealthy, unavailable, draining, idle spare,
    /// inactive backup level, removed from the config during its grace period).
    Sticky,
    /// Out: not in the table, and its pinned flows are re-hashed (no flag): admin down,
    /// MAC unknown, never in traffic.
    Removed,
}

impl Role {
    /// The `Backend::flags` of a backend in this role (`mac_known`: selectable at all).
    pub fn flags(self, mac_known: bool) -> u8 {
        match (self, mac_known) {
            (_, false) | (Role::Removed, _) => 0,
            (Role::Sticky, true) => BACKEND_F_LIVE,
            (Role::Active, true) => BACKEND_F_LIVE | BACKEND_F_SERVING,
        }
    }
}

/// One backend as the agent wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredBackend {
    pub addr: SocketAddr,
    pub weight: u32,
    /// Link-layer address of the backend or of the next hop toward it; `None` = unknown.
    pub mac: Option<[u8; 6]>,
    pub role: Role,
}

/// How a tunnel service encapsulates (docs/tunnel.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tunnel {
    /// IP-in-IP (IPv4 protocol 4 / IPv6 next header 41).
    Ipip,
    /// The same inside UDP to `lb_common::maps::GUE_PORT`.
    Gue,
}

/// nat parameters of a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatSpec {
    /// Source addresses toward the backends (1..=`MAX_SNAT_ADDRS`, the VIP's family);
    /// flows are spread over (address, port).
    pub snat_ips: Vec<IpAddr>,
    pub ports: RangeInclusive<u16>,
    /// New nat flows per second one client address may open on average; 0 = no limit.
    pub source_rate: u32,
    /// New nat flows one client address may open at once.
    pub source_burst: u32,
}

/// One virtual service as the agent wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredService {
    pub name: String,
    pub vip: SocketAddr,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub proto: u8,
    /// `Some` for full NAT, `None` for direct server return.
    pub nat: Option<NatSpec>,
    /// `Some` for tunnel forwarding (with `nat` `None`): each packet encapsulated toward
    /// its backend's address.
    pub tunnel: Option<Tunnel>,
    pub backends: Vec<DesiredBackend>,
    /// Slots of its Maglev table (one of `lb_common::MAGLEV_SIZES`); `None`: chosen by
    /// its backend count ([`lb_common::maglev_size_for`]).
    pub maglev_size: Option<u32>,
}

/// Why publishing failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error("more than {max} services", max = MAX_SERVICES)]
    TooManyServices,
    #[error("more than {max} backends (the data plane's size, `agent.max_backends`)")]
    TooManyBackends { max: u32 },
}

/// What one `apply` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Tables changed: written whole, or in place for the slots that changed.
    pub tables_published: usize,
    /// Table slots written (a whole table counts all its slots).
    pub slots_written: usize,
    pub backends_written: usize,
    pub services_written: usize,
    /// Backends whose entry was computed and compared: every backend of a service on the
    /// full path, only the changed ones on the incremental path.
    pub backends_examined: usize,
    /// Wanted services the caller described (all of them, or those a change concerns).
    pub services_given: usize,
    /// Wall time from the start of `apply` until the last map write.
    pub elapsed: Duration,
}

impl ApplyReport {
    /// Adds what another apply of the same change did.
    pub fn absorb(&mut self, other: ApplyReport) {
        self.tables_published += other.tables_published;
        self.slots_written += other.slots_written;
        self.backends_written += other.backends_written;
        self.services_written += other.services_written;
        self.backends_examined += other.backends_examined;
        self.services_given += other.services_given;
        self.elapsed += other.elapsed;
    }
}

#[derive(Debug)]
struct PublishedBackend {
    id: u32,
    /// Last entry written; `None` until the first write.
    entry: Option<Backend>,
    /// Its position in the service's last want (meaningful while that is `Some`).
    want_index: usize,
}

#[derive(Debug)]
struct PublishedService {
    id: u32,
    vip: VipKey,
    /// Last `LB_SERVICES` value written; `None` until the VIP is in the map.
    meta: Option<ServiceMeta>,
    backends: BTreeMap<SocketAddr, PublishedBackend>,
    /// Backends the home table was built from (sorted), and the home table: weighted
    /// Maglev over every configured backend, rebuilt only when that set changes.
    home_members: Vec<MaglevBackend>,
    home: Vec<u32>,
    /// Sorted ids of the backends taking new flows, and the live table published.
    active: Vec<u32>,
    live: Vec<u32>,
    /// Slots of the live table per backend id (the status page's Maglev share), counted
    /// when first asked for after a publish: a verdict must not pay a pass over the table.
    live_slots: std::cell::OnceCell<HashMap<u32, u32>>,
    /// What the last apply wanted: an identical want is skipped without any work.
    last_want: Option<DesiredService>,
    /// Bumped at every publish of `live` (fingerprint caching).
    live_version: u64,
    /// The walk state that lets a change of `active` rewrite only the slots it changes
    /// (`None`: the next change computes `live` whole and publishes the whole table).
    failover: Option<failover::Failover>,
    /// `live` may differ from the table in the map (a slot write failed): the next
    /// publish writes the whole table.
    table_stale: bool,
}

/// Hands out ids, reusing freed ones as late as possible (oldest freed first), so that a
/// stale flow pinned to a freed id is unlikely to meet a new backend under it.
#[derive(Debug)]
struct IdPool {
    next: u32,
    end: u32,
    freed: VecDeque<u32>,
}

impl IdPool {
    fn new(first: u32, end: u32) -> Self {
        Self {
            next: first,
            end,
            freed: VecDeque::new(),
        }
    }

    fn take(&mut self) -> Option<u32> {
        if self.next < self.end {
            self.next += 1;
            Some(self.next - 1)
        } else {
            self.freed.pop_front()
        }
    }

    fn give_back(&mut self, id: u32) {
        self.freed.push_back(id);
    }

    /// Marks `id` as taken (adopting a previous run's assignment).
    fn reserve(&mut self, id: u32) {
        if id >= self.next && id < self.end {
            self.freed.extend(self.next..id);
            self.next = id + 1;
        } else {
            self.freed.retain(|&f| f != id);
        }
    }
}

/// A service found in pinned maps, not yet matched to the configuration.
#[derive(Debug)]
struct AdoptedService {
    id: u32,
    meta: ServiceMeta,
    backends: BTreeMap<SocketAddr, (u32, Backend)>,
}

/// The data-plane state the agent has published, and the diffing publisher.
#[derive(Debug)]
pub struct Publisher {
    services: BTreeMap<String, PublishedService>,
    service_ids: IdPool,
    backend_ids: IdPool,
    /// Published by a previous run (pinned maps), keyed by VIP; matched on first apply.
    adopted: HashMap<VipKey, AdoptedService>,
    /// Backend ids of a previous run that belong to no service; freed on first apply.
    orphans: Vec<u32>,
    /// Some adopted backend carries `BACKEND_F_SERVING`: the previous run knew the flag.
    /// Pinned maps of a version before it mark a backend in traffic with LIVE alone.
    adopted_serving_known: bool,
    /// `false`: every changed service takes the full path (tests compare the two).
    incremental: bool,
    /// Service name and address of every published backend id (passive events name ids).
    owners: HashMap<u32, (String, SocketAddr)>,
}

impl Default for Publisher {
    fn default() -> Self {
        Self {
            adopted: HashMap::new(),
            orphans: Vec::new(),
            adopted_serving_known: false,
            services: BTreeMap::new(),
            service_ids: IdPool::new(0, MAX_SERVICES),
            backend_ids: IdPool::new(1, MAX_BACKENDS),
            incremental: true,
            owners: HashMap::new(),
        }
    }
}

impl Publisher {
    /// A publisher for a data plane holding `max_backends` backends (ids
    /// `1..=max_backends`, [`crate::dataplane::Dataplane::max_backends`]).
    pub fn with_max_backends(max_backends: u32) -> Self {
        Self {
            backend_ids: IdPool::new(1, max_backends.saturating_add(1)),
            ..Self::default()
        }
    }

    /// How many backends the data plane holds.
    pub fn max_backends(&self) -> u32 {
        self.backend_ids.end - 1
    }

    /// Takes over what a previous run published (pinned maps): services are matched to
    /// the configuration by VIP, backends by address, and keep their ids, so flows pinned
    /// before the restart still find their backends. Call before the first `apply`.
    pub fn adopt(&mut self, state: &PublishedState) {
        for (vip, meta) in &state.services {
            self.service_ids.reserve(meta.service_id);
            self.adopted.insert(
                *vip,
                AdoptedService {
                    id: meta.service_id,
                    meta: *meta,
                    backends: BTreeMap::new(),
                },
            );
        }
        for (id, b) in &state.backends {
            self.backend_ids.reserve(*id);
            self.adopted_serving_known |= b.flags & BACKEND_F_SERVING != 0;
            let addr = SocketAddr::new(words_addr(b.addr, b.family), u16::from_be(b.port));
            match self.adopted.values_mut().find(|s| s.id == b.service_id) {
                Some(svc) => {
                    svc.backends.insert(addr, (*id, *b));
                }
                // A backend retired by the previous run: its id stays reserved until
                // the first apply gives it back (below).
                None => self.orphans.push(*id),
            }
        }
    }

    /// Whether a backend was taking new flows (`BACKEND_F_SERVING`) when a previous run
    /// stopped; `None` if it was not published then. A backend that only kept its pinned
    /// flows (`BACKEND_F_LIVE` alone: unhealthy, draining, idle spare) does not count —
    /// unless no adopted backend has `SERVING` at all: maps pinned by a version before
    /// that flag meant "in traffic" by `LIVE` alone, and an upgrade must not take every
    /// server out of traffic.
    pub fn adopted_live(&self, vip: SocketAddr, proto: u8, addr: SocketAddr) -> Option<bool> {
        let svc = self.adopted.get(&vip_key(vip, proto))?;
        let (_, b) = svc.backends.get(&addr)?;
        let in_traffic = if self.adopted_serving_known {
            BACKEND_F_SERVING
        } else {
            BACKEND_F_LIVE
        };
        Some(b.flags & in_traffic != 0)
    }

    /// Data-plane id of a service.
    pub fn service_id(&self, service: &str) -> Option<u32> {
        self.services.get(service).map(|s| s.id)
    }

    /// Slots of `service`'s live Maglev table that send new flows to `addr` (0 when it
    /// takes none or is not published).
    pub fn live_slots(&self, service: &str, addr: &SocketAddr) -> u32 {
        self.services
            .get(service)
            .and_then(|s| {
                let id = s.backends.get(addr)?.id;
                s.live_slots
                    .get_or_init(|| slot_counts(&s.live))
                    .get(&id)
                    .copied()
            })
            .unwrap_or(0)
    }

    /// Every backend id handed out so far is below this.
    pub fn backend_id_limit(&self) -> u32 {
        self.backend_ids.next
    }

    /// Data-plane id of a backend of a service.
    pub fn backend_id(&self, service: &str, addr: &SocketAddr) -> Option<u32> {
        self.services.get(service)?.backends.get(addr).map(|b| b.id)
    }

    /// Whether a backend of a service is published (one lookup).
    pub fn has_backend(&self, service: &str, addr: &SocketAddr) -> bool {
        self.services
            .get(service)
            .is_some_and(|s| s.backends.contains_key(addr))
    }

    /// The backends published for a service as (address, (data-plane id, live slots)), in
    /// address order: one pass for callers walking every server (stats tick, snapshot)
    /// instead of two map lookups per server.
    pub fn backends_in_order(
        &self,
        service: &str,
    ) -> impl Iterator<Item = (SocketAddr, (u32, u32))> + '_ {
        self.services.get(service).into_iter().flat_map(|s| {
            let slots = s.live_slots.get_or_init(|| slot_counts(&s.live));
            s.backends
                .iter()
                .map(move |(addr, b)| (*addr, (b.id, slots.get(&b.id).copied().unwrap_or(0))))
        })
    }

    /// The backends published for a service as (address, data-plane id), in address
    /// order, without the slot counts (the stats tick needs only the ids: counting
    /// slots walks the whole live table after every publish).
    pub fn backend_ids_in_order(
        &self,
        service: &str,
    ) -> impl Iterator<Item = (SocketAddr, u32)> + '_ {
        self.services
            .get(service)
            .into_iter()
            .flat_map(|s| s.backends.iter().map(|(addr, b)| (*addr, b.id)))
    }

    /// Addresses of the backends published for a service.
    pub fn backend_addrs(&self, service: &str) -> impl Iterator<Item = SocketAddr> + '_ {
        self.services
            .get(service)
            .into_iter()
            .flat_map(|s| s.backends.keys().copied())
    }

    /// The live table of a service as published, with a number that changes whenever
    /// the table does (addresses of its ids: [`Publisher::backend_addr`]).
    pub fn live_table(&self, service: &str) -> Option<(&[u32], u64)> {
        let svc = self.services.get(service)?;
        Some((&svc.live, svc.live_version))
    }

    /// The service and address of a data-plane backend id.
    pub fn backend_by_id(&self, id: u32) -> Option<(String, SocketAddr)> {
        self.owners.get(&id).cloned()
    }

    /// The address of a data-plane backend id.
    pub fn backend_addr(&self, id: u32) -> Option<SocketAddr> {
        self.owners.get(&id).map(|(_, addr)| *addr)
    }

    /// Makes the data plane match `desired`, writing only what changed.
    pub fn apply<D: Dataplane>(
        &mut self,
        desired: &[DesiredService],
        dp: &mut D,
    ) -> Result<ApplyReport, PublishError> {
        let start = Instant::now();
        let mut report = ApplyReport::default();

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
    ) -> Result<ApplyReport, PublishError> {
        let start = Instant::now();
        let mut report = ApplyReport::default();
        self.apply_each(desired, dp, &mut report)?;
        report.elapsed = start.elapsed();
        Ok(report)
    }

    fn apply_each<D: Dataplane>(
        &mut self,
        desired: &[DesiredService],
        dp: &mut D,
        report: &mut ApplyReport,
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

    fn apply_service<D: Dataplane>(
        &mut self,
        want: &DesiredService,
        dp: &mut D,
        report: &mut ApplyReport,
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
                PublishedService {
                    id: prev.id,
                    vip,
                    meta: Some(prev.meta),
                    backends: prev
                        .backends
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
                    home_members: Vec::new(),
                    home: Vec::new(),
                    active: Vec::new(),
                    live: Vec::new(),
                    live_slots: Default::default(),
                    last_want: None,
                    live_version: 0,
                    failover: None,
                    table_stale: false,
                },
            );
        }
        if !self.services.contains_key(&want.name) {
            let id = self
                .service_ids
                .take()
                .ok_or(PublishError::TooManyServices)?;
            self.services.insert(
                want.name.clone(),
                PublishedService {
                    id,
                    vip,
                    meta: None,
                    backends: BTreeMap::new(),
                    home_members: Vec::new(),
                    home: Vec::new(),
                    active: Vec::new(),
                    live: Vec::new(),
                    live_slots: Default::default(),
                    last_want: None,
                    live_version: 0,
                    failover: None,
                    table_stale: false,
                },
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
    fn publish_whole<D: Dataplane>(
        &mut self,
        active: Vec<u32>,
        dp: &mut D,
        report: &mut ApplyReport,
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

/// `PublishedBackend::want_index` of a backend not (yet) found in the want being applied.
const NOT_WANTED: usize = usize::MAX;

/// A backend entry to write once the new table no longer points at the backend.
struct Deferred {
    id: u32,
    entry: Backend,
    /// The published backend it belongs to (`None`: it left the service).
    addr: Option<SocketAddr>,
}

/// Writes `entry` if it differs from what `published` holds: now, or — when it takes
/// liveness away — into `after_table`, written once the new table no longer points at
/// the backend (a packet must never find a slot whose backend is not live). `published`
/// records an entry only once it is written: after a failed publish, the next one
/// writes what did not make it.
fn stage_entry<D: Dataplane>(
    published: &mut PublishedBackend,
    addr: SocketAddr,
    entry: Backend,
    dp: &mut D,
    after_table: &mut Vec<Deferred>,
    report: &mut ApplyReport,
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
fn write_deferred<D: Dataplane>(
    after_table: Vec<Deferred>,
    backends: &mut BTreeMap<SocketAddr, PublishedBackend>,
    dp: &mut D,
    report: &mut ApplyReport,
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

/// Whether a backend holds slots of the live table (receives new flows).
fn takes_new_flows(b: &DesiredBackend) -> bool {
    b.weight > 0 && b.role == Role::Active && b.mac.is_some()
}

/// How many slots of `table` each backend id holds.
fn slot_counts(table: &[u32]) -> HashMap<u32, u32> {
    // Ids are small and dense: counted in a vector indexed by id rather than with a hash
    // per slot (a table holds about 100 slots per backend, a million at 10,000
    // backends). Anything else (`NO_BACKEND`) is counted in the map itself.
    const DENSE: u32 = 1 << 22;
    let mut dense: Vec<u32> = Vec::new();
    let mut counts = HashMap::new();
    for &id in table {
        if id < DENSE {
            let i = id as usize;
            if i >= dense.len() {
                dense.resize(i + 1, 0);
            }
            dense[i] += 1;
        } else {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts.extend(
        dense
            .into_iter()
            .enumerate()
            .filter(|&(_, n)| n > 0)
            .map(|(id, n)| (id as u32, n)),
    );
    counts
}

/// The home table with the slots of inactive backends failed over to active ones
/// (`active` sorted), and the walk state for updating it slot by slot when it can be had.
fn whole_live_table(home: &[u32], active: &[u32]) -> (Vec<u32>, Option<failover::Failover>) {
    let bound = active.iter().max().map_or(0, |&id| id as usize + 1);
    let mut is_active = vec![false; bound];
    for &id in active {
        if let Some(flag) = is_active.get_mut(id as usize) {
            *flag = true;
        }
    }
    let is_active = |id: u32| is_active.get(id as usize).copied().unwrap_or(false);
    // The walk state records every step of every walk: with most of the table's owners
    // out of traffic the walks are long (a tenth of the slots active: ten steps a slot on
    // average), and recording them costs far more than the walks (10,000 backends,
    // 9,900 out: 2.2 s to leave and 33.6 s to return slot by slot, against 105 ms and
    // 3 ms without the state; BENCHMARKS.md §2 "Storms of verdicts"). Then the table is
    // computed without it, and each publish
    // until enough are back computes it whole again — bounded, where the slot-by-slot
    // path would pay for the long walks on every verdict.
    let active_slots = home.iter().filter(|&&id| is_active(id)).count();
    if active_slots * WALK_STATE_MIN_ACTIVE_SHARE < home.len() {
        return (maglev::failover_table(home, is_active), None);
    }
    match failover::Failover::build(home, is_active) {
        Some((live, walks)) => (live, Some(walks)),
        None => (maglev::failover_table(home, is_active), None),
    }
}

/// The walk state is kept only while at least 1/N of the table's home slots belong to
/// backends taking new flows (walks of N steps on average).
const WALK_STATE_MIN_ACTIVE_SHARE: usize = 8;

fn retired(mut entry: Backend) -> Backend {
    entry.flags &= !(BACKEND_F_LIVE | BACKEND_F_SERVING);
    entry
}

/// Address words in network order, as the XDP program reads them from packets.
pub fn addr_words(ip: IpAddr) -> ([u32; 4], u8) {
    match ip {
        IpAddr::V4(v4) => ([u32::from_ne_bytes(v4.octets()), 0, 0, 0], FAMILY_V4),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let mut w = [0u32; 4];
            for (i, word) in w.iter_mut().enumerate() {
                *word = u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]]);
            }
            (w, FAMILY_V6)
        }
    }
}

/// The address held in network-order words (inverse of [`addr_words`]).
pub fn words_addr(words: [u32; 4], family: u8) -> IpAddr {
    if family == FAMILY_V6 {
        let mut o = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            o[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        IpAddr::from(o)
    } else {
        IpAddr::from(words[0].to_ne_bytes())
    }
}

/// The `LB_SERVICES` key of a VIP.
pub fn vip_key(vip: SocketAddr, proto: u8) -> VipKey {
    let (addr, family) = addr_words(vip.ip());
    VipKey {
        addr,
        port: vip.port().to_be(),
        proto,
        family,
    }
}

fn backend_entry(b: &DesiredBackend, service_id: u32) -> Backend {
    let (addr, family) = addr_words(b.addr.ip());
    Backend {
        addr,
        port: b.addr.port().to_be(),
        family,
        flags: b.role.flags(b.mac.is_some()),
        mac: b.mac.unwrap_or_default(),
        _pad: [0; 2],
        service_id,
    }
}

/// The GCRA interval of a per-source rate (flows per second); 0 = no limit.
fn source_interval_ns(rate: u32) -> u32 {
    1_000_000_000u32.checked_div(rate).map_or(0, |ns| ns.max(1))
}

fn service_meta(id: u32, want: &DesiredService) -> ServiceMeta {
    match &want.nat {
        Some(nat) => {
            let mut snat_addrs = [[0u32; 4]; MAX_SNAT_ADDRS];
            for (slot, ip) in snat_addrs.iter_mut().zip(&nat.snat_ips) {
                *slot = addr_words(*ip).0;
            }
            ServiceMeta {
                service_id: id,
                flags: SERVICE_F_NAT,
                snat_addrs,
                snat_count: nat.snat_ips.len().clamp(1, MAX_SNAT_ADDRS) as u32,
                nat_port_min: *nat.ports.start(),
                nat_port_max: *nat.ports.end(),
                source_interval_ns: source_interval_ns(nat.source_rate),
                source_burst: nat.source_burst.max(1),
                ..ServiceMeta::default()
            }
        }
        None => ServiceMeta {
            service_id: id,
            flags: match want.tunnel {
                None => 0,
                Some(Tunnel::Ipip) => SERVICE_F_TUNNEL,
                Some(Tunnel::Gue) => SERVICE_F_TUNNEL | SERVICE_F_GUE,
            },
            ..ServiceMeta::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use lb_common::{IPPROTO_TCP, NO_BACKEND};

    use super::*;
    use crate::dataplane::memory::{MemoryDataplane, Write};

    const MAC: Option<[u8; 6]> = Some([2, 0, 0, 0, 0, 1]);

    fn backend(addr: &str, weight: u32, role: Role) -> DesiredBackend {
        DesiredBackend {
            addr: addr.parse().unwrap(),
            weight,
            mac: MAC,
            role,
        }
    }

    fn web(backends: Vec<DesiredBackend>) -> DesiredService {
        DesiredService {
            name: "web".into(),
            vip: "10.0.0.100:80".parse().unwrap(),
            proto: IPPROTO_TCP,
            tunnel: None,
            nat: Some(NatSpec {
                snat_ips: vec!["10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap()],
                ports: 20000..=29999,
                source_rate: 250,
                source_burst: 500,
            }),
            backends,
            maglev_size: None,
        }
    }

    fn slots_of(dp: &MemoryDataplane, service: u32, id: u32) -> usize {
        dp.tables[&service].iter().filter(|&&s| s == id).count()
    }

    /// A fresh dataplane and publisher after one apply of `services`.
    fn applied(services: &[DesiredService]) -> (MemoryDataplane, Publisher) {
        let mut dp = MemoryDataplane::default();
        let mut p = Publisher::default();
        p.apply(services, &mut dp).unwrap();
        (dp, p)
    }

    /// Applies `services` and returns what that apply wrote, in order.
    fn writes(
        p: &mut Publisher,
        dp: &mut MemoryDataplane,
        services: &[DesiredService],
    ) -> Vec<Write> {
        dp.log.clear();
        p.apply(services, dp).unwrap();
        dp.log.clone()
    }

    /// Two active backends, 10.0.1.1:80 and 10.0.1.2:80, weight 1.
    fn two_active() -> Vec<DesiredBackend> {
        vec![
            backend("10.0.1.1:80", 1, Role::Active),
            backend("10.0.1.2:80", 1, Role::Active),
        ]
    }

    /// `all` with backend `i` in `role`.
    fn with_role(all: &[DesiredBackend], i: usize, role: Role) -> Vec<DesiredBackend> {
        let mut out = all.to_vec();
        out[i].role = role;
        out
    }

    /// What a restarted agent reads back from the maps `dp` holds.
    fn state_of(dp: &MemoryDataplane) -> PublishedState {
        PublishedState {
            services: dp.services.values().copied().collect(),
            backends: dp.backends.iter().map(|(id, b)| (*id, *b)).collect(),
        }
    }

    #[test]
    fn new_service_writes_backends_then_table_then_vip() {
        let svc = web(two_active());
        let (dp, _) = applied(std::slice::from_ref(&svc));
        let vip = vip_key(svc.vip, IPPROTO_TCP);
        assert_eq!(
            dp.log,
            vec![
                Write::Backend(1),
                Write::Backend(2),
                Write::Table(0),
                Write::Service(vip)
            ],
            "a VIP must only appear once its backends and table are in place"
        );
        let meta = dp.service(&vip).expect("VIP published");
        assert_eq!(meta.flags, SERVICE_F_NAT);
        assert_eq!((meta.nat_port_min, meta.nat_port_max), (20000, 29999));
        assert_eq!(meta.snat_count, 2, "both snat addresses");
        assert_eq!(
            &meta.snat_addrs[..2],
            &[
                addr_words("10.0.0.2".parse().unwrap()).0,
                addr_words("10.0.0.3".parse().unwrap()).0
            ]
        );
        assert_eq!(meta.snat_addrs[2], [0; 4], "unused slots stay zero");
        assert_eq!(
            (meta.source_interval_ns, meta.source_burst),
            (4_000_000, 500),
            "250 flows/s is one every 4 ms"
        );
        assert!(dp.tables[&0].iter().all(|&s| s == 1 || s == 2));
        for id in [1, 2] {
            assert_eq!(
                dp.backends[&id].flags,
                BACKEND_F_LIVE | BACKEND_F_SERVING,
                "an active backend is live and serving"
            );
        }
    }

    #[test]
    fn a_tunnel_service_carries_its_mode_and_a_change_of_mode_rewrites_its_slot() {
        let dsr = DesiredService {
            nat: None,
            ..web(two_active())
        };
        let (mut dp, mut p) = applied(std::slice::from_ref(&dsr));
        let vip = vip_key(dsr.vip, IPPROTO_TCP);
        assert_eq!(dp.service(&vip).expect("published").flags, 0, "dsr");
        for (tunnel, flags) in [
            (Tunnel::Ipip, SERVICE_F_TUNNEL),
            (Tunnel::Gue, SERVICE_F_TUNNEL | SERVICE_F_GUE),
        ] {
            let svc = DesiredService {
                tunnel: Some(tunnel),
                ..dsr.clone()
            };
            let log = writes(&mut p, &mut dp, std::slice::from_ref(&svc));
            assert_eq!(
                log,
                vec![Write::Service(vip)],
                "{tunnel:?}: only the VIP slot"
            );
            let meta = dp.service(&vip).expect("published");
            assert_eq!(meta.flags, flags, "{tunnel:?}");
            assert_eq!(meta.snat_count, 0, "{tunnel:?}: no source translation");
        }
    }

    #[test]
    fn unchanged_apply_writes_nothing() {
        let svc = web(vec![backend("10.0.1.1:80", 1, Role::Active)]);
        let (mut dp, mut p) = applied(std::slice::from_ref(&svc));
        let before = dp.log.len();
        let report = p.apply(std::slice::from_ref(&svc), &mut dp).unwrap();
        assert_eq!(
            dp.log.len(),
            before,
            "second identical apply wrote {report:?}"
        );
    }

    #[test]
    fn sticky_backend_leaves_table_but_stays_live() {
        let (mut dp, mut p) = applied(&[web(two_active())]);
        p.apply(&[web(with_role(&two_active(), 1, Role::Sticky))], &mut dp)
            .unwrap();
        assert_eq!(
            slots_of(&dp, 0, 2),
            0,
            "sticky backend must leave the table"
        );
        assert_eq!(
            dp.backends[&2].flags, BACKEND_F_LIVE,
            "sticky: live (keeps its TCP connections), not serving"
        );
    }

    #[test]
    fn live_slots_follow_the_published_table() {
        let mut dp = MemoryDataplane::default();
        let mut p = Publisher::default();
        let (a, b) = (
            "10.0.1.1:80".parse().unwrap(),
            "10.0.1.2:80".parse().unwrap(),
        );
        p.apply(
            &[web(vec![
                backend("10.0.1.1:80", 3, Role::Active),
                backend("10.0.1.2:80", 1, Role::Active),
            ])],
            &mut dp,
        )
        .unwrap();
        let (sa, sb) = (p.live_slots("web", &a), p.live_slots("web", &b));
        assert_eq!(sa as usize, slots_of(&dp, 0, 1));
        assert_eq!(sb as usize, slots_of(&dp, 0, 2));
        assert_eq!(sa as usize + sb as usize, dp.tables[&0].len());
        assert!(sa > 2 * sb, "weight 3 vs 1: {sa} vs {sb} slots");
        p.apply(
            &[web(vec![
                backend("10.0.1.1:80", 3, Role::Active),
                backend("10.0.1.2:80", 1, Role::Sticky),
            ])],
            &mut dp,
        )
        .unwrap();
        assert_eq!(p.live_slots("web", &a) as usize, dp.tables[&0].len());
        assert_eq!(p.live_slots("web", &b), 0);
        assert_eq!(p.live_slots("nope", &a), 0);
    }

    #[test]
    fn slot_counts_count_every_id_and_the_empty_slot() {
        let table = [3, 0, 3, NO_BACKEND, 7, 3, NO_BACKEND, 0];
        let mut naive = HashMap::new();
        for &id in &table {
            *naive.entry(id).or_insert(0u32) += 1;
        }
        assert_eq!(slot_counts(&table), naive);
        assert_eq!(slot_counts(&[]), HashMap::new());
    }

    #[test]
    fn table_size_follows_the_backend_count_unless_configured() {
        let many = |n: u8| -> Vec<DesiredBackend> {
            (1..=n)
                .map(|i| backend(&format!("10.0.1.{i}:80"), 1, Role::Active))
                .collect()
        };
        let (mut dp, mut p) = applied(&[web(many(2))]);
        assert_eq!(dp.tables[&0].len(), 4099, "2 servers: the smallest size");
        // 41 servers need more than 4,099 slots at 100 per server: a new table.
        p.apply(&[web(many(41))], &mut dp).unwrap();
        assert_eq!(dp.tables[&0].len(), 16411);
        assert!(slots_of(&dp, 0, 41) > 0, "the 41st server has slots");
        // Configured: that size whatever the count.
        let fixed = DesiredService {
            maglev_size: Some(262147),
            ..web(many(41))
        };
        p.apply(std::slice::from_ref(&fixed), &mut dp).unwrap();
        assert_eq!(dp.tables[&0].len(), 262147);
        let before = dp.log.len();
        p.apply(&[fixed], &mut dp).unwrap();
        assert_eq!(dp.log.len(), before, "unchanged: nothing rewritten");
    }

    #[test]
    fn removed_backend_loses_live_flag_and_id_is_reused_last() {
        let (mut dp, mut p) = applied(&[web(two_active())]);
        p.apply(
            &[web(vec![backend("10.0.1.1:80", 1, Role::Active)])],
            &mut dp,
        )
        .unwrap();
        assert_eq!(dp.backends[&2].flags & BACKEND_F_LIVE, 0);
        assert_eq!(slots_of(&dp, 0, 1), dp.tables[&0].len());
        p.apply(
            &[web(vec![
                backend("10.0.1.1:80", 1, Role::Active),
                backend("10.0.1.3:80", 1, Role::Active),
            ])],
            &mut dp,
        )
        .unwrap();
        assert_eq!(
            p.backend_id("web", &"10.0.1.3:80".parse().unwrap()),
            Some(3),
            "a fresh id is preferred over a recently freed one"
        );
    }

    #[test]
    fn unknown_mac_is_not_selectable() {
        let mut b = backend("10.0.1.1:80", 1, Role::Active);
        b.mac = None;
        let (dp, _) = applied(&[web(vec![b])]);
        assert!(dp.tables[&0].iter().all(|&s| s == NO_BACKEND));
        assert_eq!(dp.backends[&1].flags & BACKEND_F_LIVE, 0);
    }

    #[test]
    fn removed_service_loses_vip_and_backends() {
        let svc = web(vec![backend("10.0.1.1:80", 1, Role::Active)]);
        let (mut dp, mut p) = applied(std::slice::from_ref(&svc));
        p.apply(&[], &mut dp).unwrap();
        assert!(dp.service(&vip_key(svc.vip, IPPROTO_TCP)).is_none());
        assert_eq!(dp.backends[&1].flags & BACKEND_F_LIVE, 0);
        assert_eq!(p.service_id("web"), None);
    }

    #[test]
    fn a_health_change_moves_only_that_backends_slots() {
        let all: Vec<DesiredBackend> = (1..=10)
            .map(|i| backend(&format!("10.0.1.{i}:80"), 1, Role::Active))
            .collect();
        let (mut dp, mut p) = applied(&[web(all.clone())]);
        let before = dp.tables[&0].clone();
        p.apply(&[web(with_role(&all, 2, Role::Removed))], &mut dp)
            .unwrap();
        let after = dp.tables[&0].clone();
        let id = p.backend_id("web", &all[2].addr).unwrap();
        let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
        let owned = before.iter().filter(|&&s| s == id).count();
        assert_eq!(moved, owned, "only the failed backend's slots may move");
        p.apply(&[web(all)], &mut dp).unwrap();
        assert_eq!(
            dp.tables[&0], before,
            "recovery restores the home table exactly"
        );
    }

    #[test]
    fn adoption_keeps_ids_and_rewrites_nothing_that_is_unchanged() {
        let svc = web(with_role(&two_active(), 1, Role::Removed));
        let gone = DesiredService {
            name: "old".into(),
            vip: "10.0.0.101:80".parse().unwrap(),
            tunnel: None,
            nat: None,
            ..web(vec![backend("10.0.2.1:80", 1, Role::Active)])
        };
        let (mut dp, first) = applied(&[svc.clone(), gone.clone()]);
        let state = state_of(&dp);

        let mut second = Publisher::default();
        second.adopt(&state);
        assert_eq!(
            second.adopted_live(svc.vip, IPPROTO_TCP, "10.0.1.1:80".parse().unwrap()),
            Some(true)
        );
        assert_eq!(
            second.adopted_live(svc.vip, IPPROTO_TCP, "10.0.1.2:80".parse().unwrap()),
            Some(false)
        );
        dp.log.clear();
        second.apply(std::slice::from_ref(&svc), &mut dp).unwrap();
        for addr in ["10.0.1.1:80", "10.0.1.2:80"] {
            let addr = addr.parse().unwrap();
            assert_eq!(
                second.backend_id("web", &addr),
                first.backend_id("web", &addr)
            );
        }
        assert!(
            !dp.log
                .iter()
                .any(|w| matches!(w, Write::Backend(id) if *id <= 2)),
            "unchanged adopted backends must not be rewritten: {:?}",
            dp.log
        );
        assert!(
            dp.service(&vip_key(gone.vip, IPPROTO_TCP)).is_none(),
            "a service no longer configured is removed"
        );
        assert_eq!(dp.backends[&3].flags & BACKEND_F_LIVE, 0);
    }

    #[test]
    fn liveness_is_taken_away_only_after_the_table_stops_pointing_at_it() {
        let all = two_active();
        let (mut dp, mut p) = applied(&[web(all.clone())]);
        assert_eq!(
            writes(&mut p, &mut dp, &[web(with_role(&all, 1, Role::Removed))]),
            vec![Write::Slots(0), Write::Backend(2)],
            "table first, then the backend loses LIVE"
        );
        writes(&mut p, &mut dp, &[web(all[..1].to_vec())]);
        let log = writes(&mut p, &mut dp, &[web(all)]);
        assert_eq!(
            log.first(),
            Some(&Write::Backend(3)),
            "a new backend is written before the table points at it: {log:?}"
        );
    }

    #[test]
    fn roles_map_to_flags() {
        let mut no_mac = backend("10.0.1.4:80", 1, Role::Active);
        no_mac.mac = None;
        let (dp, _) = applied(&[web(vec![
            backend("10.0.1.1:80", 1, Role::Active),
            backend("10.0.1.2:80", 1, Role::Sticky),
            backend("10.0.1.3:80", 1, Role::Removed),
            no_mac,
        ])]);
        let flags: Vec<u8> = (1..=4).map(|id| dp.backends[&id].flags).collect();
        assert_eq!(
            flags,
            vec![BACKEND_F_LIVE | BACKEND_F_SERVING, BACKEND_F_LIVE, 0, 0],
            "Active = LIVE|SERVING, Sticky = LIVE, Removed and MAC unknown = none"
        );
    }

    #[test]
    fn leaving_traffic_clears_serving_after_the_table_and_keeps_live() {
        let all = two_active();
        let (mut dp, mut p) = applied(&[web(all.clone())]);
        assert_eq!(
            writes(&mut p, &mut dp, &[web(with_role(&all, 1, Role::Sticky))]),
            vec![Write::Slots(0), Write::Backend(2)],
            "table first, then the backend loses SERVING"
        );
        assert_eq!(dp.backends[&2].flags, BACKEND_F_LIVE);
        assert_eq!(slots_of(&dp, 0, 2), 0);
        assert_eq!(
            writes(&mut p, &mut dp, &[web(all)]),
            vec![Write::Backend(2), Write::Slots(0)],
            "SERVING is given before the table points at the backend again"
        );
        assert_eq!(dp.backends[&2].flags, BACKEND_F_LIVE | BACKEND_F_SERVING);
    }

    #[test]
    fn adoption_counts_only_serving_backends_as_up() {
        let svc = web(with_role(&two_active(), 1, Role::Sticky));
        let (dp, _) = applied(std::slice::from_ref(&svc));
        let state = state_of(&dp);
        let mut second = Publisher::default();
        second.adopt(&state);
        let up = |a: &str| second.adopted_live(svc.vip, IPPROTO_TCP, a.parse().unwrap());
        assert_eq!(up("10.0.1.1:80"), Some(true));
        assert_eq!(
            up("10.0.1.2:80"),
            Some(false),
            "a sticky backend (LIVE without SERVING) was not taking traffic"
        );
    }

    #[test]
    fn adoption_of_maps_pinned_before_serving_existed_reads_live_as_in_traffic() {
        let svc = web(with_role(&two_active(), 1, Role::Removed));
        let (dp, _) = applied(std::slice::from_ref(&svc));
        // What the previous version pinned: LIVE alone for a backend in traffic.
        let mut state = state_of(&dp);
        for (_, b) in &mut state.backends {
            b.flags &= !BACKEND_F_SERVING;
        }
        let mut second = Publisher::default();
        second.adopt(&state);
        let up = |a: &str| second.adopted_live(svc.vip, IPPROTO_TCP, a.parse().unwrap());
        assert_eq!(
            (up("10.0.1.1:80"), up("10.0.1.2:80")),
            (Some(true), Some(false))
        );
    }

    #[test]
    fn ipv4_words_are_wire_order() {
        let (w, fam) = addr_words("10.0.1.2".parse().unwrap());
        assert_eq!(w[0].to_ne_bytes(), [10, 0, 1, 2]);
        assert_eq!(fam, FAMILY_V4);
    }
}
