//! Which service a packet is for, through the inlined `LB_VIP_INDEX` array: hash the
//! key with the live table's seed, read the bucket's ways, compare. A packet to no
//! service is a nat-reply candidate only when its destination port lies in the nat
//! services' port range and its destination address is a nat source address (a second
//! probe of the same array), or, in cluster mode, in the whole shared range of that
//! address (`LB_CLUSTER`): every other packet is passed without a hash-map lookup.

use lb_common::{
    VIP_INDEX_WAYS,
    hash::vip_hash,
    maps::{
        FlowKey, ServiceMeta, VIP_SLOT_EMPTY, VIP_SLOT_SERVICE, VIP_SLOT_SNAT, VipKey, VipSlot,
        same_vip, snat_key,
    },
    vip_bucket_index,
};

use crate::{
    layout,
    maps::{LB_CLUSTER, LB_VIP_GEN, LB_VIP_HDR, LB_VIP_INDEX},
};

/// What the destination of a TCP/UDP packet is.
pub enum Dest {
    /// A service.
    Service(&'static ServiceMeta),
    /// No service, but possibly a nat reply (an `LB_NAT` lookup decides).
    NatCandidate,
    /// Neither: not ours.
    Other,
}

/// The destination of a packet with 5-tuple `key`.
///
/// The generation is read once; the header and slots of that table follow from it
/// (address-dependent loads), so a packet sees one published table, never a mix.
#[inline(always)]
pub fn dest(key: &FlowKey) -> Dest {
    let Some(generation) = LB_VIP_GEN.get(0) else {
        return Dest::Other;
    };
    let generation = *generation;
    let Some(hdr) = LB_VIP_HDR.get((generation & 1) as u32) else {
        return Dest::Other;
    };
    let vip = VipKey {
        addr: key.dst,
        port: key.dport,
        proto: key.proto,
        family: key.family,
    };
    if let Some(slot) = probe(generation, hdr.seed, &vip, VIP_SLOT_SERVICE) {
        return Dest::Service(&slot.meta);
    }
    // The header's range is this node's own ports; in cluster mode a reply to another
    // member's port of a shared SNAT address is ours too (taken over, or sent on to
    // that member).
    let port = u16::from_be(key.dport);
    if (port < hdr.nat_port_min || port > hdr.nat_port_max) && !shared_snat_port(key, port) {
        return Dest::Other;
    }
    match probe(
        generation,
        hdr.seed,
        &snat_key(key.dst, key.family),
        VIP_SLOT_SNAT,
    ) {
        Some(_) => Dest::NatCandidate,
        None => Dest::Other,
    }
}

/// Cluster mode: whether `port` lies in the whole shared range of the SNAT address
/// `key` is sent to (`LB_CLUSTER`), any member's slice.
#[inline(always)]
fn shared_snat_port(key: &FlowKey, port: u16) -> bool {
    if !layout::cluster() {
        return false;
    }
    let Some(members) = LB_CLUSTER.get(0) else {
        return false;
    };
    members
        .shared_snat(&key.dst, key.family)
        .is_some_and(|snat| port >= snat.port_min && port <= snat.port_max)
}

/// The service whose key is `vip`, if any.
#[inline(always)]
pub fn service(vip: &VipKey) -> Option<&'static ServiceMeta> {
    let generation = *LB_VIP_GEN.get(0)?;
    let hdr = LB_VIP_HDR.get((generation & 1) as u32)?;
    probe(generation, hdr.seed, vip, VIP_SLOT_SERVICE).map(|s| &s.meta)
}

/// The slot of kind `kind` holding `vip` in table `generation`, if any.
///
/// Array slots are preallocated and never freed; the agent rewrites a table only while
/// it is not live and not within a grace period of its retirement (see the agent's
/// `vip_index`), so the reference stays valid for this packet.
#[inline(always)]
fn probe(generation: u64, seed: u32, vip: &VipKey, kind: u32) -> Option<&'static VipSlot> {
    let first = vip_bucket_index(generation, vip_hash(vip, seed));
    let mut way = 0;
    while way < VIP_INDEX_WAYS {
        let slot = LB_VIP_INDEX.get(first + way)?;
        if slot.kind == VIP_SLOT_EMPTY {
            return None;
        }
        if slot.kind == kind && same_vip(&slot.vip, vip) {
            return Some(slot);
        }
        way += 1;
    }
    None
}
