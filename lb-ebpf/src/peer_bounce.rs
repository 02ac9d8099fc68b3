//! Cluster mode, the second hop: a backend's reply that reaches this node before the
//! node that made its connection shared it goes on to that node.
//!
//! The routers spread the backends' replies to a shared SNAT address over every node
//! that announces it, so the SYN-ACK of a new connection reaches a random node, well
//! before the connection's owner has told the others (a LAN round trip is far shorter
//! than the sync). The owner is known from the reply's destination port: each member
//! hands out its own contiguous slice of the SNAT address's ports (`LB_CLUSTER`,
//! `lb_common::maps::cluster_port_owner`). A reply without an entry here or in
//! `LB_PEER_NAT` whose port another member owns is sent to that member's MAC, unchanged
//! but for its Ethernet addresses (`TX_PEER_BOUNCE`); the owner translates it as usual.
//! A frame that came from a member is never sent on again (members whose configs
//! disagree do not bounce a packet between them); it passes, as a reply without an entry
//! does on one node.

use aya_ebpf::bindings::xdp_action::XDP_TX;
use lb_common::{
    counters::{PASS_NOT_VIP, TX_PEER_BOUNCE},
    maps::{CLUSTER_MEMBERS_MAX, ClusterMembers, cluster_port_owner},
};

use crate::{
    Verdict,
    maps::LB_CLUSTER,
    parse::{ETH_SRC, Packet},
    rewrite,
};

/// Sends `pkt`, a reply no table here knows, to the member that owns its destination
/// port; passes it (`PASS_NOT_VIP`) when that is this node, when the owner's MAC is not
/// known, when the port is outside every shared range, or when it came from a member.
#[inline(always)]
pub fn to_owner(pkt: &Packet) -> Verdict {
    let not_sent = Verdict::pass(PASS_NOT_VIP);
    let Some(members) = LB_CLUSTER.get(0) else {
        return not_sent;
    };
    let Some(owner) = owner_of(members, pkt) else {
        return not_sent;
    };
    if owner == members.own || usize::from(owner) >= CLUSTER_MEMBERS_MAX {
        return not_sent;
    }
    let mac = members.macs[usize::from(owner)];
    if mac == [0; 6] || from_member(members, &pkt.eth.mac::<ETH_SRC>()) {
        return not_sent;
    }
    rewrite::retarget_l2(pkt.eth, &mac);
    Verdict::new(XDP_TX, TX_PEER_BOUNCE)
}

/// The member whose slice of the reply's SNAT address holds its destination port.
#[inline(always)]
fn owner_of(members: &ClusterMembers, pkt: &Packet) -> Option<u8> {
    let key = &pkt.key;
    let snat = members.shared_snat(&key.dst, key.family)?;
    cluster_port_owner(
        u16::from_be(key.dport),
        snat.port_min,
        snat.port_max,
        members.count,
    )
}

/// Whether `mac` is one of the members' (this node's own is all zero in the table).
#[inline(always)]
fn from_member(members: &ClusterMembers, mac: &[u8; 6]) -> bool {
    members
        .macs
        .iter()
        .take(CLUSTER_MEMBERS_MAX)
        .any(|m| m == mac && *m != [0; 6])
}
