//! The VIP index the XDP program finds services and nat source addresses in:
//! `LB_VIP_INDEX` (two tables of `VIP_INDEX_BUCKETS` buckets of `VIP_INDEX_WAYS`
//! slots), `LB_VIP_HDR` (each table's hash seed and the nat port range) and
//! `LB_VIP_GEN` (which table is live), all written through `mmap`.
//!
//! [`build`] lays out one table: every service key and every distinct nat source
//! address goes into bucket `vip_hash(key, seed) % VIP_INDEX_BUCKETS`; the seed is the
//! first one (the live table's first) under which no bucket holds more than
//! `VIP_INDEX_WAYS` keys. [`VipIndex`] publishes a table as `maglev_table` does: it
//! writes the table that is not live, then flips the generation with a Release store
//! (the program's header and slot loads depend on the generation's value), and never
//! rewrites a retired table within `GRACE` of its retirement.

use std::{
    collections::{BTreeMap, BTreeSet},
    ptr,
    sync::atomic::{AtomicU64, Ordering},
    time::Instant,
};

use aya::maps::MapData;
use lb_common::{
    VIP_INDEX_BUCKETS, VIP_INDEX_SLOTS, VIP_INDEX_TABLES, VIP_INDEX_WAYS,
    hash::vip_hash,
    maps::{
        SERVICE_F_NAT, ServiceMeta, VIP_SLOT_EMPTY, VIP_SLOT_SERVICE, VIP_SLOT_SNAT,
        VipIndexHeader, VipKey, VipSlot, snat_key,
    },
    vip_bucket_index,
};

use super::{maglev_table::GRACE, mapping::Mapping};
use crate::dataplane::DataplaneError;

/// Seeds tried before giving up. With `MAX_SERVICES` services and up to
/// `MAX_SNAT_ADDRS` source addresses each, the keys fill at most a sixth of the slots,
/// and more than half of all seeds fit; giving up means a bug, not bad luck.
const SEED_ATTEMPTS: u32 = 1 << 16;

/// One table of the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub header: VipIndexHeader,
    /// `VIP_INDEX_SLOTS` slots, bucket by bucket.
    pub slots: Vec<VipSlot>,
    /// Indices of the slots that hold a key, ascending (the rest are empty).
    pub occupied: Vec<usize>,
}

/// The table for `services` (their keys and the nat source addresses of the nat ones),
/// with seed `prefer` if it fits, else the first that does after it. `None` if no seed
/// fits (too many keys).
pub fn build(services: &BTreeMap<VipKey, ServiceMeta>, prefer: u32) -> Option<Layout> {
    let mut keys: Vec<(VipKey, u32, ServiceMeta)> = services
        .iter()
        .map(|(vip, meta)| (*vip, VIP_SLOT_SERVICE, *meta))
        .collect();
    let mut snat = BTreeSet::new();
    let (mut port_min, mut port_max) = (1u16, 0u16);
    for (vip, meta) in services {
        if meta.flags & SERVICE_F_NAT == 0 {
            continue;
        }
        let used = (meta.snat_count as usize).min(meta.snat_addrs.len());
        for addr in &meta.snat_addrs[..used] {
            snat.insert(snat_key(*addr, vip.family));
        }
        if port_min > port_max {
            (port_min, port_max) = (meta.nat_port_min, meta.nat_port_max);
        } else {
            port_min = port_min.min(meta.nat_port_min);
            port_max = port_max.max(meta.nat_port_max);
        }
    }
    keys.extend(
        snat.into_iter()
            .map(|k| (k, VIP_SLOT_SNAT, ServiceMeta::default())),
    );
    let seed = (0..SEED_ATTEMPTS)
        .map(|i| prefer.wrapping_add(i.wrapping_mul(0x9e37_79b9)))
        .find(|&seed| fits(keys.iter().map(|k| &k.0), seed))?;
    let mut slots = vec![VipSlot::default(); VIP_INDEX_SLOTS as usize];
    let mut occupied = Vec::with_capacity(keys.len());
    for (vip, kind, meta) in keys {
        let first = vip_bucket_index(0, vip_hash(&vip, seed)) as usize;
        let way = (first..first + VIP_INDEX_WAYS as usize)
            .find(|&i| slots[i].kind == VIP_SLOT_EMPTY)
            .expect("fits() checked the bucket has room");
        slots[way] = VipSlot { vip, kind, meta };
        occupied.push(way);
    }
    occupied.sort_unstable();
    Some(Layout {
        header: VipIndexHeader {
            seed,
            nat_port_min: port_min,
            nat_port_max: port_max,
        },
        slots,
        occupied,
    })
}

/// Whether no bucket gets more than `VIP_INDEX_WAYS` of `keys` under `seed`.
fn fits<'a>(keys: impl Iterator<Item = &'a VipKey>, seed: u32) -> bool {
    let mut load = vec![0u32; VIP_INDEX_BUCKETS as usize];
    for key in keys {
        let bucket = (vip_hash(key, seed) & (VIP_INDEX_BUCKETS - 1)) as usize;
        load[bucket] += 1;
        if load[bucket] > VIP_INDEX_WAYS {
            return false;
        }
    }
    true
}

/// The slot of kind `kind` holding `vip` in `layout`, searched as the program does.
pub fn find<'a>(layout: &'a Layout, vip: &VipKey, kind: u32) -> Option<&'a VipSlot> {
    let first = vip_bucket_index(0, vip_hash(vip, layout.header.seed)) as usize;
    layout.slots[first..first + VIP_INDEX_WAYS as usize]
        .iter()
        .take_while(|s| s.kind != VIP_SLOT_EMPTY)
        .find(|s| s.kind == kind && s.vip == *vip)
}

/// The index maps, mapped into the agent, and the services the live table holds.
pub(in crate::dataplane) struct VipIndex {
    slots: Mapping,
    generation: Mapping,
    headers: Mapping,
    last_flip: Instant,
    services: BTreeMap<VipKey, ServiceMeta>,
    /// Per table, the indices of the slots that are not all zero (as last written, or
    /// as found when adopted): a publish clears those the new layout leaves empty and
    /// writes the occupied ones, not the whole 3.9 MB table.
    written: [Vec<usize>; VIP_INDEX_TABLES as usize],
    /// Keep the maps open for as long as they are mapped.
    _maps: (MapData, MapData, MapData),
}

impl VipIndex {
    /// Maps the three maps and reads the services of the live table (an adopted index
    /// holds the previous agent's).
    pub(in crate::dataplane) fn new(
        slots: MapData,
        generation: MapData,
        headers: MapData,
    ) -> Result<Self, DataplaneError> {
        let s = Mapping::new(
            &slots,
            (VIP_INDEX_TABLES * VIP_INDEX_SLOTS) as usize * size_of::<VipSlot>(),
            "mmap of LB_VIP_INDEX (needs BPF_F_MMAPABLE)",
        )?;
        let g = Mapping::new(
            &generation,
            size_of::<u64>(),
            "mmap of LB_VIP_GEN (needs BPF_F_MMAPABLE)",
        )?;
        let h = Mapping::new(
            &headers,
            VIP_INDEX_TABLES as usize * size_of::<VipIndexHeader>(),
            "mmap of LB_VIP_HDR (needs BPF_F_MMAPABLE)",
        )?;
        let mut index = Self {
            slots: s,
            generation: g,
            headers: h,
            // A restarted agent does not know when the last flip happened: assume now.
            last_flip: Instant::now(),
            services: BTreeMap::new(),
            written: [Vec::new(), Vec::new()],
            _maps: (slots, generation, headers),
        };
        for table in 0..VIP_INDEX_TABLES as usize {
            let all = index.table_slots(table as u64);
            index.written[table] = (0..all.len())
                .filter(|&i| all[i] != VipSlot::default())
                .collect();
        }
        index.services = index
            .live_slots()
            .iter()
            .filter(|s| s.kind == VIP_SLOT_SERVICE)
            .map(|s| (s.vip, s.meta))
            .collect();
        Ok(index)
    }

    /// The services the live table holds.
    pub(in crate::dataplane) fn services(&self) -> &BTreeMap<VipKey, ServiceMeta> {
        &self.services
    }

    /// Adds or replaces a service.
    pub(in crate::dataplane) fn upsert(
        &mut self,
        vip: &VipKey,
        meta: &ServiceMeta,
    ) -> Result<(), DataplaneError> {
        let mut next = self.services.clone();
        next.insert(*vip, *meta);
        self.publish(next)
    }

    /// Points service `service_id`'s slot at its new pair of Maglev tables (a new or
    /// resized table); a service not in the index yet gets it at its upsert.
    pub(in crate::dataplane) fn set_maglev(
        &mut self,
        service_id: u32,
        base: u32,
        size: u32,
    ) -> Result<(), DataplaneError> {
        let mut next = self.services.clone();
        let Some(meta) = next.values_mut().find(|m| m.service_id == service_id) else {
            return Ok(());
        };
        if (meta.maglev_base, meta.maglev_size) == (base, size) {
            return Ok(());
        }
        (meta.maglev_base, meta.maglev_size) = (base, size);
        self.publish(next)
    }

    /// Removes a service (absent: nothing to do).
    pub(in crate::dataplane) fn remove(&mut self, vip: &VipKey) -> Result<(), DataplaneError> {
        if !self.services.contains_key(vip) {
            return Ok(());
        }
        let mut next = self.services.clone();
        next.remove(vip);
        self.publish(next)
    }

    fn generation_word(&self) -> &AtomicU64 {
        // SAFETY: one 8-byte array value at the start of the page-aligned mapping, only
        // accessed atomically.
        unsafe { &*self.generation.addr.cast::<AtomicU64>() }
    }

    fn live_generation(&self) -> u64 {
        self.generation_word().load(Ordering::Acquire) & 1
    }

    fn live_slots(&self) -> Vec<VipSlot> {
        self.table_slots(self.live_generation())
    }

    /// A copy of table `generation` (bit 0).
    fn table_slots(&self, generation: u64) -> Vec<VipSlot> {
        let first = vip_bucket_index(generation, 0) as usize;
        let mut out = vec![VipSlot::default(); VIP_INDEX_SLOTS as usize];
        // SAFETY: reading one whole table inside the mapping.
        unsafe {
            ptr::copy_nonoverlapping(
                self.slots.addr.cast::<VipSlot>().add(first),
                out.as_mut_ptr(),
                out.len(),
            );
        }
        out
    }

    /// Writes the table for `services` as the next one and makes it live.
    fn publish(&mut self, services: BTreeMap<VipKey, ServiceMeta>) -> Result<(), DataplaneError> {
        let live = self.live_generation();
        // SAFETY: header `live` lies inside the mapping; it is not written while live.
        let prefer = unsafe {
            (*self
                .headers
                .addr
                .cast::<VipIndexHeader>()
                .add(live as usize))
            .seed
        };
        let layout = build(&services, prefer).ok_or(DataplaneError::VipIndexFull {
            services: services.len(),
        })?;
        while self.last_flip.elapsed() < GRACE {
            std::hint::spin_loop();
        }
        let next = live ^ 1;
        let first = vip_bucket_index(next, 0) as usize;
        // SAFETY: table and header `next` lie inside the mappings; no packet reads them
        // until the generation flips below (and none still reads the table it retired
        // GRACE ago).
        unsafe {
            let table = self.slots.addr.cast::<VipSlot>().add(first);
            // Slots the table held that the layout leaves empty, then every key: the
            // table then equals `layout.slots` (all other slots were and stay zero).
            for &i in &self.written[next as usize] {
                if layout.slots[i].kind == VIP_SLOT_EMPTY {
                    ptr::write(table.add(i), VipSlot::default());
                }
            }
            for &i in &layout.occupied {
                ptr::write(table.add(i), layout.slots[i]);
            }
            ptr::write_volatile(
                self.headers
                    .addr
                    .cast::<VipIndexHeader>()
                    .add(next as usize),
                layout.header,
            );
        }
        // Release: the writes above happen-before the flip for a packet that reads the
        // new generation (see `maglev_table::MaglevTables::publish`).
        self.generation_word().store(next, Ordering::Release);
        self.last_flip = Instant::now();
        self.written[next as usize] = layout.occupied;
        self.services = services;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use lb_common::{FAMILY_V4, IPPROTO_TCP, IPPROTO_UDP, MAX_SERVICES, maps::MAX_SNAT_ADDRS};

    use super::*;

    fn v4(a: Ipv4Addr) -> [u32; 4] {
        [u32::from_ne_bytes(a.octets()), 0, 0, 0]
    }

    fn vip(i: u32, proto: u8) -> VipKey {
        VipKey {
            addr: v4(Ipv4Addr::new(10, 0, (i / 200) as u8, (i % 200) as u8)),
            port: (80 + i as u16).to_be(),
            proto,
            family: FAMILY_V4,
        }
    }

    fn nat_meta(id: u32, snat: &[Ipv4Addr], ports: (u16, u16)) -> ServiceMeta {
        let mut m = ServiceMeta {
            service_id: id,
            flags: SERVICE_F_NAT,
            snat_count: snat.len() as u32,
            nat_port_min: ports.0,
            nat_port_max: ports.1,
            ..ServiceMeta::default()
        };
        for (slot, a) in m.snat_addrs.iter_mut().zip(snat) {
            *slot = v4(*a);
        }
        m
    }

    #[test]
    fn every_service_and_source_address_is_found_and_nothing_else() {
        let mut services = BTreeMap::new();
        for i in 0..MAX_SERVICES {
            let snat: Vec<Ipv4Addr> = (0..MAX_SNAT_ADDRS as u8)
                .map(|k| Ipv4Addr::new(192, 168 + (i / 256) as u8, i as u8, k))
                .collect();
            services.insert(vip(i, IPPROTO_TCP), nat_meta(i, &snat, (20_000, 29_999)));
        }
        let layout = build(&services, 0).expect("a seed fits");
        for (key, meta) in &services {
            let found = find(&layout, key, VIP_SLOT_SERVICE).expect("service found");
            assert_eq!(found.meta, *meta);
            for addr in &meta.snat_addrs {
                assert!(find(&layout, &snat_key(*addr, FAMILY_V4), VIP_SLOT_SNAT).is_some());
            }
            // Same address and port, other protocol: no service.
            let udp = VipKey {
                proto: IPPROTO_UDP,
                ..*key
            };
            assert!(find(&layout, &udp, VIP_SLOT_SERVICE).is_none());
        }
        let used = layout
            .slots
            .iter()
            .filter(|s| s.kind != VIP_SLOT_EMPTY)
            .count();
        assert_eq!(used, MAX_SERVICES as usize * (1 + MAX_SNAT_ADDRS));
    }

    #[test]
    fn the_preferred_seed_is_kept_when_it_fits() {
        let services: BTreeMap<_, _> = (0..3)
            .map(|i| (vip(i, IPPROTO_TCP), ServiceMeta::default()))
            .collect();
        let first = build(&services, 12345).unwrap();
        assert_eq!(
            first.header.seed, 12345,
            "three keys fit under almost any seed"
        );
        let again = build(&services, first.header.seed).unwrap();
        assert_eq!(again, first);
    }

    #[test]
    fn the_nat_port_range_covers_every_nat_service_and_only_those() {
        let mut services = BTreeMap::new();
        let a = Ipv4Addr::new(10, 9, 0, 1);
        services.insert(vip(1, IPPROTO_TCP), nat_meta(1, &[a], (20_000, 29_999)));
        services.insert(vip(2, IPPROTO_UDP), nat_meta(2, &[a], (40_000, 40_010)));
        let dsr = ServiceMeta {
            service_id: 3,
            nat_port_min: 1,
            nat_port_max: 65_535,
            ..ServiceMeta::default()
        };
        services.insert(vip(3, IPPROTO_TCP), dsr);
        let layout = build(&services, 0).unwrap();
        assert_eq!(
            (layout.header.nat_port_min, layout.header.nat_port_max),
            (20_000, 40_010)
        );
        let snat = layout
            .slots
            .iter()
            .filter(|s| s.kind == VIP_SLOT_SNAT)
            .count();
        assert_eq!(snat, 1, "one entry per distinct source address");

        services.retain(|_, m| m.flags & SERVICE_F_NAT == 0);
        let layout = build(&services, 0).unwrap();
        assert!(
            layout.header.nat_port_min > layout.header.nat_port_max,
            "no nat service: an empty range"
        );
    }

    #[test]
    fn a_crowded_bucket_moves_to_another_seed() {
        // Five keys that share a bucket under seed 0 do not fit it.
        let mut crowded = BTreeMap::new();
        let mut i = 0;
        while crowded.len() < 5 {
            let key = vip(i, IPPROTO_TCP);
            if vip_hash(&key, 0) & (VIP_INDEX_BUCKETS - 1) == 0 {
                crowded.insert(key, ServiceMeta::default());
            }
            i += 1;
        }
        let layout = build(&crowded, 0).unwrap();
        assert_ne!(layout.header.seed, 0);
        for key in crowded.keys() {
            assert!(find(&layout, key, VIP_SLOT_SERVICE).is_some());
        }
    }
}
