//! Cluster mode: connections another node made, taken over when their packets reach this
//! node (a router moved the client's flow or the backend's replies), so that this node
//! forwards them in both directions exactly as that node does: same backend, same SNAT
//! address and port.
//!
//! The agent keeps every other node's connections in `LB_PEER_FLOWS` (by client 5-tuple)
//! and `LB_PEER_NAT` (by reply 5-tuple). `lb_xdp_full` looks there only after a miss: a
//! nat client packet without an `LB_FLOWS` entry ([`has_flow`]), a reply to a SNAT
//! address without an `LB_NAT` entry ([`reply_missed`]). It hands the packet
//! ([`HANDOFF`]) to `lb_xdp_peer` ([`enter`]), a program of its own with its own stack
//! (`lb_xdp_full`'s is full, docs/internals/fast-path.md "Stack budget"), which writes the
//! entries through the same claims a new flow's go through ([`adopt`]) and continues in
//! `lb_xdp_full`: the packet then finds them and takes the established path, the per-CPU
//! flow cache filled as for any flow. The allocation also skips a pair `LB_PEER_NAT` holds
//! ([`holds`]). None of this runs without cluster mode: every caller asks
//! `layout::cluster` first, which the verifier reads as a constant.

use aya_ebpf::programs::XdpContext;
use lb_common::{
    PEER_PATH_INDEX,
    counters::{
        DROP_BAD_BACKEND, DROP_FLOWS_FULL, DROP_NO_FULL_PATH, FLOW_EVICTED, NAT_PORT_PEER_HELD,
        PASS_NOT_VIP, PEER_FLOW_ADOPTED, PEER_NAT_ADOPTED,
    },
    maps::{
        CLUSTER_HOP_MOVES_MAX, FlowKey, NAT_H_ADOPTED, NAT_S_ACKED, NAT_S_FIN_BACKEND,
        NAT_S_FIN_CLIENT, NAT_S_RST, NatValue, PeerFlow, ServiceMeta, nat_reclaimable, nat_seconds,
    },
    table::{NatBucket, PeerFlowBucket},
};

use crate::{
    Verdict, cache, clock,
    counters::count,
    flow, forward, layout,
    maps::{LB_CLUSTER, LB_PEER_FLOWS, LB_PEER_NAT, LB_PEER_SCRATCH, LB_PROGRAMS},
    nat::{self, Source},
    parse::{self, ETH_SRC, Packet, Parsed, TCP_SYN},
    peer_bounce,
    pkt::MacWords,
    slots::{self, Claim},
    vip::{self, Dest},
};

/// The verdict action of a packet `lb_xdp_full` hands to `lb_xdp_peer` (no XDP action
/// and no tunnel verdict has this bit); its counter is never counted.
pub const HANDOFF: u32 = 1 << 29;

/// The verdict that hands the packet to `lb_xdp_peer`.
#[inline(always)]
pub const fn handoff() -> Verdict {
    Verdict::new(HANDOFF, 0)
}

/// `LB_PEER_FLOWS` as a table for `slots` (two-choice: `slots::find_choice`). Its hash is
/// `LB_FLOWS`' (the same key), its bucket count the peer tables'.
pub struct PeerFlowTable;

impl slots::Table for PeerFlowTable {
    type Value = PeerFlow;

    #[inline(always)]
    fn hash(key: &FlowKey) -> u32 {
        lb_common::hash::table_hash(key, layout::flow_seed())
    }

    #[inline(always)]
    fn index(hash: u32) -> u32 {
        hash & layout::peer_mask()
    }

    #[inline(always)]
    fn at(index: u32) -> Option<*mut PeerFlowBucket> {
        LB_PEER_FLOWS.get_ptr_mut(index)
    }
}

/// `LB_PEER_NAT` as a table for `slots` (two-choice), hashed as `LB_NAT` (the same key).
pub struct PeerNatTable;

impl slots::Table for PeerNatTable {
    type Value = NatValue;

    #[inline(always)]
    fn hash(key: &FlowKey) -> u32 {
        lb_common::hash::table_hash(key, layout::nat_seed())
    }

    #[inline(always)]
    fn index(hash: u32) -> u32 {
        hash & layout::peer_mask()
    }

    #[inline(always)]
    fn at(index: u32) -> Option<*mut NatBucket> {
        LB_PEER_NAT.get_ptr_mut(index)
    }
}

// The peer tables' searches are BPF global functions, as `LB_FLOWS`' and `LB_NAT`'s: the
// verifier checks each once, not once per caller. One per bucket choice (see
// `slots::find_choice`); [`peer_flow_find`] and [`peer_nat_find`] try both.

/// `slots::find_choice` in `LB_PEER_FLOWS`, the key's own bucket.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_peer_flow_find(key: *const FlowKey) -> u64 {
    if key.is_null() {
        return slots::NOT_FOUND;
    }
    slots::find_choice::<PeerFlowTable, false>(key)
}

/// `slots::find_choice` in `LB_PEER_FLOWS`, the key's second bucket.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_peer_flow_find2(key: *const FlowKey) -> u64 {
    if key.is_null() {
        return slots::NOT_FOUND;
    }
    slots::find_choice::<PeerFlowTable, true>(key)
}

/// `slots::find_choice` in `LB_PEER_NAT`, the key's own bucket.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_peer_nat_find(key: *const FlowKey) -> u64 {
    if key.is_null() {
        return slots::NOT_FOUND;
    }
    slots::find_choice::<PeerNatTable, false>(key)
}

/// `slots::find_choice` in `LB_PEER_NAT`, the key's second bucket.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_peer_nat_find2(key: *const FlowKey) -> u64 {
    if key.is_null() {
        return slots::NOT_FOUND;
    }
    slots::find_choice::<PeerNatTable, true>(key)
}

/// Whether `LB_PEER_NAT` holds `key` (a reply 5-tuple), in either bucket, counted
/// `NAT_PORT_PEER_HELD` when it does: another node's connection holds the (address,
/// port) pair, which the allocation takes as held (a pair whose owner changed when the
/// cluster's members did may still carry that node's connection). Called by
/// `nat::lb_nat_claim_new`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_peer_nat_held(key: *const FlowKey) -> u64 {
    if key.is_null() {
        return 0;
    }
    // SAFETY: non-NULL, checked by the verifier to cover a key.
    let hash = <PeerNatTable as slots::Table>::hash(unsafe { &*key });
    let held = slots::holds_hashed::<PeerNatTable>(key, hash);
    if held {
        count(NAT_PORT_PEER_HELD);
    }
    held as u64
}

/// Where `key` lives in `LB_PEER_FLOWS` (`slots::find`'s code), in either of its buckets.
#[inline(always)]
fn peer_flow_find(key: &FlowKey) -> u64 {
    match lb_peer_flow_find(key) {
        slots::NOT_FOUND => lb_peer_flow_find2(key),
        code => code,
    }
}

/// Where `key` lives in `LB_PEER_NAT`, in either of its buckets.
#[inline(always)]
fn peer_nat_find(key: &FlowKey) -> u64 {
    match lb_peer_nat_find(key) {
        slots::NOT_FOUND => lb_peer_nat_find2(key),
        code => code,
    }
}

/// Whether another node's connection has the client 5-tuple `key` and this packet
/// continues it. A client SYN (`syn`) never does: a connection is shared only once the
/// client acknowledged the SYN-ACK, after which its client sends no SYN, so a SYN on a
/// shared 5-tuple opens a new connection (the client reused its port) rather than take
/// the old one over, whose pair the backend may still hold in `TIME_WAIT`.
#[inline(always)]
pub fn has_flow(key: &FlowKey, syn: bool) -> bool {
    !syn && peer_flow_find(key) != slots::NOT_FOUND
}

/// Whether another node's connection has the reply 5-tuple `key`.
#[inline(always)]
pub fn has_reverse(key: &FlowKey) -> bool {
    peer_nat_find(key) != slots::NOT_FOUND
}

/// `lb_xdp`: a reply `nat::settled_reply` found no `LB_NAT` entry for
/// (`PASS_NOT_VIP`) goes to the whole path in cluster mode, which may take it over
/// ([`reply_missed`]).
#[inline(always)]
pub fn settled_reply_missed(v: Option<Verdict>) -> Option<Verdict> {
    match v {
        Some(v) if layout::cluster() && v.counter == PASS_NOT_VIP => None,
        v => v,
    }
}

/// `lb_xdp_full`: a reply `nat::reply` found no `LB_NAT` entry for (`PASS_NOT_VIP`) is
/// handed over in cluster mode: `lb_xdp_peer` takes it over from `LB_PEER_NAT` or sends
/// it on to the node that owns its port (`peer_bounce`).
#[inline(always)]
pub fn reply_missed(v: Verdict) -> Verdict {
    if layout::cluster() && v.counter == PASS_NOT_VIP {
        handoff()
    } else {
        v
    }
}

/// Continues this packet in `lb_xdp_peer`; returns only if the tail call failed
/// (`LB_PROGRAMS` without it: a loader bug), then the packet is dropped and counted
/// `DROP_NO_FULL_PATH`, as for `lb_xdp_full`'s own entry.
#[inline(always)]
pub fn enter(ctx: &XdpContext) -> Verdict {
    // SAFETY: the tail call replaces this program by `lb_xdp_peer` on the same context,
    // or returns without effect.
    unsafe { LB_PROGRAMS.tail_call(ctx, PEER_PATH_INDEX) };
    Verdict::drop(DROP_NO_FULL_PATH)
}

/// `lb_xdp_peer`'s work: takes the packet's connection over from the peer tables.
/// `None`: done (or nothing to take: the peer entry went meanwhile), the packet continues
/// in `lb_xdp_full`; a verdict: the take-over failed and the packet ends here (rather
/// than loop back into a miss that hands it over again).
#[inline(always)]
pub fn adopt(ctx: &XdpContext) -> Option<Verdict> {
    let Parsed::Flow(pkt) = parse::parse(ctx) else {
        return None;
    };
    match vip::dest(&pkt.key) {
        Dest::Service(svc) => adopt_flow(&pkt, svc),
        Dest::NatCandidate => {
            let syn = pkt.is_tcp()
                && pkt
                    .l4(ctx.data_end())
                    .is_some_and(|l4| l4.tcp_flags & TCP_SYN != 0);
            adopt_reply(&pkt, syn)
        }
        Dest::Other => None,
    }
}

/// A client packet: pins its flow as `LB_PEER_FLOWS` says, after its reverse entry
/// (from `LB_PEER_NAT`, unless `LB_NAT` holds it already). The flow is settled; its
/// `nat_tick` is last tick's, so that this packet verifies the reverse entry
/// (`nat::ensure` claims one if `LB_PEER_NAT` had none). Refused (`DROP_FLOWS_FULL`)
/// when the flow's bucket is busy or full: the client resends.
#[inline(always)]
fn adopt_flow(pkt: &Packet, svc: &ServiceMeta) -> Option<Verdict> {
    let code = peer_flow_find(&pkt.key);
    let mut peer = PeerFlow::default();
    if !slots::copy_at::<PeerFlowTable>(&pkt.key, code, &mut peer) {
        return None;
    }
    let id = peer.backend_id;
    let src = Source {
        addr: peer.nat_addr,
        port: peer.nat_port,
    };
    let Some(backend) = flow::any_backend(id) else {
        return Some(Verdict::drop(DROP_BAD_BACKEND));
    };
    let reply = nat::reply_key(&pkt.key, svc, backend, src);
    let _ = adopt_reverse(&reply, Some(pkt.eth.mac::<ETH_SRC>()));
    let now = clock::now();
    let mut value = forward::new_flow(id, false, 0, src, now);
    value.nat_tick = now.tick.wrapping_sub(1);
    match Claim::from_code(flow::lb_flow_claim(&pkt.key, &value, now.ns)) {
        Claim::Busy | Claim::Full => return Some(Verdict::drop(DROP_FLOWS_FULL)),
        Claim::Evicted => count(FLOW_EVICTED),
        Claim::Fresh | Claim::Replaced | Claim::Taken | Claim::Displaced => {}
    }
    // As for a new flow: a copy this CPU may hold of an evicted entry must not outlive it.
    cache::forget(&pkt.key);
    count(PEER_FLOW_ADOPTED);
    None
}

/// Whether `v`, the `LB_NAT` entry a reply found (`syn`: a SYN-ACK), is a taken-over
/// connection's that may be over (`NAT_H_ADOPTED`): its port may be reused, or a SYN-ACK
/// comes after its handshake. Its owner may have given the pair to a new connection;
/// the reply then goes the way of one without an entry ([`reply_missed`]).
#[inline(always)]
pub fn stale(v: &NatValue, proto: u8, syn: bool) -> bool {
    if v.handshake & NAT_H_ADOPTED == 0 {
        return false;
    }
    let past_handshake = NAT_S_ACKED | NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND | NAT_S_RST;
    (syn && v.state & past_handshake != 0)
        || nat_reclaimable(v, proto, nat_seconds(clock::now().ns))
}

/// For `v`, the `LB_NAT` entry a reply found: when its client MAC is one the agent saw
/// move (`ClusterMembers::hop_moves`), the entry takes the new one. On a node that takes
/// a connection's replies but not its client's packets, nothing else would bring it.
#[inline(always)]
pub fn follow_hop_moves(v: &mut NatValue) {
    let Some(members) = LB_CLUSTER.get(0) else {
        return;
    };
    let count = members.hop_move_count as usize;
    if count == 0 {
        return;
    }
    let mac = MacWords::of(&v.client_mac);
    for i in 0..CLUSTER_HOP_MOVES_MAX {
        if i >= count {
            return;
        }
        let m = &members.hop_moves[i];
        if MacWords::of(&m.old) == mac {
            MacWords::of(&m.new).write(&mut v.client_mac);
            return;
        }
    }
}

/// Frees the `LB_NAT` entry of `key` if it is [`stale`]; `false` when its bucket is
/// busy (the reply then passes rather than loop back here).
#[inline(always)]
fn forget_stale(key: &FlowKey, syn: bool) -> bool {
    let code = nat::lb_nat_find(key);
    match slots::value_at::<nat::NatTable>(code) {
        Some(v) if stale(v, key.proto, syn) => nat::lb_nat_free(key, code) == 1,
        _ => true,
    }
}

/// A backend's reply: claims its reverse entry from `LB_PEER_NAT`; without one, the
/// connection is another member's that has not shared it yet, and the reply goes on to
/// it (`peer_bounce`). A [`stale`] entry of a connection taken over before goes first.
/// A bucket busy or full of live entries leaves it untranslated (`PASS_NOT_VIP`, as a
/// reply without an entry).
#[inline(always)]
fn adopt_reply(pkt: &Packet, syn: bool) -> Option<Verdict> {
    if !forget_stale(&pkt.key, syn) {
        return Some(Verdict::pass(PASS_NOT_VIP));
    }
    if !has_reverse(&pkt.key) {
        return Some(peer_bounce::to_owner(pkt));
    }
    match adopt_reverse(&pkt.key, None) {
        Claim::Busy | Claim::Full | Claim::Evicted => Some(Verdict::pass(PASS_NOT_VIP)),
        Claim::Fresh | Claim::Replaced | Claim::Taken | Claim::Displaced => None,
    }
}

/// Claims the reverse entry `reply` as `LB_PEER_NAT` holds it, aged from this node's
/// clock (the other node's is not this one's) and, for a client packet, with the MAC it
/// came from (`mac`; `LB_NAT` may hold the entry already, which is then kept); a reply
/// keeps the MAC the agent installed. `Taken` when `LB_PEER_NAT` has no such entry
/// (nothing to claim: the caller goes on as without it), or `LB_NAT` one already.
#[inline(always)]
fn adopt_reverse(reply: &FlowKey, mac: Option<[u8; 6]>) -> Claim {
    let mac = match mac {
        Some(m) => u64::from_le_bytes([m[0], m[1], m[2], m[3], m[4], m[5], 0, 0]) | MAC_GIVEN,
        None => 0,
    };
    Claim::from_code(lb_peer_adopt_reverse(reply, mac))
}

/// [`lb_peer_adopt_reverse`]'s `mac` bit: its low six bytes are the MAC a client packet
/// came from.
const MAC_GIVEN: u64 = 1 << 63;

/// [`adopt_reverse`]'s work, a BPF global function: its copy of the entry and the reply
/// key's claim take a frame of their own, beside `lb_xdp_peer`'s rather than in it
/// (`lb_xdp_peer` reaches it from a client packet and from a reply). `mac`: a MAC in the
/// low six bytes with [`MAC_GIVEN`] (a client packet's: an entry `LB_NAT` holds is
/// kept), or none (a reply's). The result is `Claim::code`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_peer_adopt_reverse(reply: *const FlowKey, mac: u64) -> u64 {
    if reply.is_null() {
        return Claim::Busy.code();
    }
    if mac & MAC_GIVEN != 0 && nat::lb_nat_find(reply) != slots::NOT_FOUND {
        return Claim::Taken.code();
    }
    let mac = (mac & MAC_GIVEN != 0).then(|| {
        let b = mac.to_le_bytes();
        [b[0], b[1], b[2], b[3], b[4], b[5]]
    });
    // SAFETY: non-NULL, checked by the verifier to cover a key.
    let reply = unsafe { &*reply };
    let now_s = nat_seconds(clock::now().ns);
    let code = peer_nat_find(reply);
    let Some(value) = LB_PEER_SCRATCH.get_ptr_mut(0) else {
        return Claim::Busy.code();
    };
    if !slots::copy_at::<PeerNatTable>(reply, code, value) {
        return Claim::Taken.code();
    }
    // SAFETY: this CPU's scratch value, which `copy_at` wrote whole.
    let value = unsafe { &mut *value };
    nat::adopt_value(value, mac, now_s);
    let claim = nat::claim(reply, value, false, now_s);
    if matches!(claim, Claim::Fresh | Claim::Replaced) {
        count(PEER_NAT_ADOPTED);
    }
    claim.code()
}
