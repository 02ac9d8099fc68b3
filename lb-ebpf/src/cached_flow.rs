//! The settled-flow path: right after the VIP hit and `validate::to_vip`, a packet this
//! CPU's flow cache can serve goes straight to its backend in a short block of its own;
//! every other packet falls through to `forward::to_service` unchanged.
//!
//! Which packets: exactly those of a flow `forward::to_service` cached that change no
//! flow state (TCP without SYN, FIN or RST; UDP in dsr). Every check of
//! `validate::to_vip` (lengths, TTL / hop limit, TCP flags) runs before it: each one
//! is a refusal the full path makes whatever the flow, so a cached flow must pass them
//! all, and they cost three compares. A cache miss (or a backend out of traffic)
//! returns `None` and the packet takes the full path through `LB_FLOWS`. docs/internals/fast-path.md,
//! "The settled-flow path".

use lb_common::{
    counters::{FLOW_HIT, TX_DSR_CACHED, TX_NAT_FORWARD, TX_NAT_FORWARD_CACHED},
    maps::{BACKEND_F_LIVE, BACKEND_F_SERVING, SERVICE_F_NAT, SERVICE_F_TUNNEL, ServiceMeta},
};

use crate::{
    Verdict, cache, clock,
    counters::{self, count},
    dsr, flow,
    nat::{self, Source},
    parse::{L4, Packet, TCP_FIN, TCP_RST, TCP_SYN},
    tunnel,
};

/// Forwards a packet of a flow this CPU cached in this tick, while its backend is in
/// traffic; `None`: the packet takes the full path (see the module comment). `l4`
/// passed `validate::to_vip`.
#[inline(always)]
pub fn forward(pkt: &Packet, l4: L4, svc: &ServiceMeta, end: usize) -> Option<Verdict> {
    let use_nat = svc.flags & SERVICE_F_NAT != 0;
    if !changes_no_state(pkt, l4, use_nat) {
        return None;
    }
    let hit = cache::hit(&pkt.key, clock::tick())?;
    let id = hit.backend_id;
    let b = flow::any_backend(id)?;
    if b.flags & (BACKEND_F_LIVE | BACKEND_F_SERVING) != BACKEND_F_LIVE | BACKEND_F_SERVING {
        return None;
    }
    counters::service_packet(svc.service_id, pkt.len, false);
    counters::backend_packet(id, pkt.len, false);
    if svc.flags & SERVICE_F_TUNNEL != 0 {
        count(FLOW_HIT);
        return Some(tunnel::forward(svc, id));
    }
    if !use_nat {
        // The cache outcome stands for `TX_DSR` and the `FLOW_HIT` (one counter
        // update, not two: `lb_common::counters::derive`).
        return Some(dsr::forward_with(pkt, b, TX_DSR_CACHED));
    }
    let src = Source {
        addr: hit.nat_addr,
        port: hit.nat_port,
    };
    let mut v = nat::forward(pkt, l4, svc, b, src, end);
    if v.counter == TX_NAT_FORWARD {
        v.counter = TX_NAT_FORWARD_CACHED;
    } else {
        // A translation refused (`DROP_MALFORMED`): the hit is counted on its own.
        count(FLOW_HIT);
    }
    Some(v)
}

/// Whether a packet `validate::to_vip` admitted changes no flow state: TCP without
/// SYN, FIN or RST (no handshake, close or reset to note; `to_vip` made sure it has
/// ACK), or UDP in dsr (nat UDP is noted after a reply, so it always goes through
/// `LB_FLOWS`).
#[inline(always)]
pub fn changes_no_state(pkt: &Packet, l4: L4, use_nat: bool) -> bool {
    if pkt.is_tcp() {
        l4.tcp_flags & (TCP_SYN | TCP_FIN | TCP_RST) == 0
    } else {
        !use_nat
    }
}
