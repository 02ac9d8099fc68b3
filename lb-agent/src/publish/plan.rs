//! Planning, pure: what to write for a want, computed without touching the maps — a
//! backend's entry and its flags, a service's `LB_SERVICES` value, VIP keys and address
//! words as the XDP program reads them, the live table with inactive backends' slots
//! failed over, and slot counts. [`super::write`] writes what these compute.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
};

use lb_common::{
    FAMILY_V4, FAMILY_V6,
    maps::{
        BACKEND_F_LIVE, BACKEND_F_SERVING, Backend, MAX_SNAT_ADDRS, SERVICE_F_GUE, SERVICE_F_NAT,
        SERVICE_F_TUNNEL, ServiceMeta, VipKey,
    },
};

use super::{DesiredBackend, DesiredService, Role, Tunnel, failover};
use crate::maglev::{self};

/// Whether a backend holds slots of the live table (receives new flows).
pub(super) fn takes_new_flows(b: &DesiredBackend) -> bool {
    b.weight > 0 && b.role == Role::Active && b.mac.is_some()
}

/// How many slots of `table` each backend id holds.
pub(super) fn slot_counts(table: &[u32]) -> HashMap<u32, u32> {
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
pub(super) fn whole_live_table(
    home: &[u32],
    active: &[u32],
) -> (Vec<u32>, Option<failover::Failover>) {
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
    // average), and recording them costs far more than the walks. Then the table is
    // computed without it, and each publish until enough are back computes it whole
    // again: bounded (10,000 backends, 9,900 out: 105 ms to leave, 3 ms to return;
    // docs/internals/publish.md, "Storms"), where the slot-by-slot path would pay for the
    // long walks on every verdict.
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
pub(super) const WALK_STATE_MIN_ACTIVE_SHARE: usize = 8;

pub(super) fn retired(mut entry: Backend) -> Backend {
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

pub(super) fn backend_entry(b: &DesiredBackend, service_id: u32) -> Backend {
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
pub(super) fn source_interval_ns(rate: u32) -> u32 {
    1_000_000_000u32.checked_div(rate).map_or(0, |ns| ns.max(1))
}

pub(super) fn service_meta(id: u32, want: &DesiredService) -> ServiceMeta {
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
    use lb_common::NO_BACKEND;

    use super::*;

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
    fn ipv4_words_are_wire_order() {
        let (w, fam) = addr_words("10.0.1.2".parse().unwrap());
        assert_eq!(w[0].to_ne_bytes(), [10, 0, 1, 2]);
        assert_eq!(fam, FAMILY_V4);
    }
}
