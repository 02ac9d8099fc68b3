//! ICMP/ICMPv6 destination-unreachable from a backend about a translated (nat) flow:
//! reported once per flow as `EVENT_ICMP_UNREACH`; the message itself is always passed.
//!
//! The embedded header is the packet we sent (`snat:nat_port -> backend:port`); swapped,
//! it is the key of the flow's reverse entry in `LB_NAT`. The outer destination must be
//! the embedded source (the snat address).

use lb_common::{
    FAMILY_V4, IPPROTO_TCP, IPPROTO_UDP,
    events::EVENT_ICMP_UNREACH,
    maps::{FLOW_F_REPORTED, FlowKey},
};

use crate::{
    events, flow,
    maps::LB_NAT,
    nat::client_key,
    parse::{ICMP_HLEN, IPV4_HLEN, IPV6_HLEN, Icmp},
    pkt::ptr_at,
};

const ICMP_DEST_UNREACH: u8 = 3;
const ICMPV6_DEST_UNREACH: u8 = 1;

/// Looks at an ICMP message; sends the event when it reports a translated flow.
#[inline(always)]
pub fn inspect(icmp: &Icmp, end: usize) {
    let Some(key) = embedded_reply_key(icmp, end) else {
        return;
    };
    let Some(v) = LB_NAT.get_ptr(&key) else {
        return;
    };
    // SAFETY: as in `nat::reply`.
    let nat = unsafe { &*v };
    let Some(f) = flow::lookup(&client_key(nat, key.proto, key.family)) else {
        return;
    };
    // SAFETY: this flow's entry; no LB_FLOWS insert while the reference lives.
    let f = unsafe { &mut *f };
    if f.flags & FLOW_F_REPORTED != 0 {
        return;
    }
    f.flags |= FLOW_F_REPORTED;
    let service_id = flow::any_backend(nat.backend_id).map_or(0, |b| b.service_id);
    events::emit(EVENT_ICMP_UNREACH, nat.backend_id, service_id);
}

/// The reply 5-tuple of the TCP/UDP packet embedded in a destination-unreachable.
#[inline(always)]
fn embedded_reply_key(icmp: &Icmp, end: usize) -> Option<FlowKey> {
    let hdr = ptr_at::<ICMP_HLEN>(icmp.l4, end)?;
    let inner = icmp.l4 + ICMP_HLEN;
    let (src, dst, proto, l4) = if icmp.family == FAMILY_V4 {
        if hdr.u8::<0>() != ICMP_DEST_UNREACH {
            return None;
        }
        let ip = ptr_at::<IPV4_HLEN>(inner, end)?;
        let vihl = ip.u8::<0>();
        let ihl = (vihl & 0x0f) as usize;
        if vihl >> 4 != 4 || ihl < 5 {
            return None;
        }
        (
            [ip.u32::<12>(), 0, 0, 0],
            [ip.u32::<16>(), 0, 0, 0],
            ip.u8::<9>(),
            inner + ihl * 4,
        )
    } else {
        if hdr.u8::<0>() != ICMPV6_DEST_UNREACH {
            return None;
        }
        let ip = ptr_at::<IPV6_HLEN>(inner, end)?;
        (
            ip.words4::<8>(),
            ip.words4::<24>(),
            ip.u8::<6>(),
            inner + IPV6_HLEN,
        )
    };
    if (proto != IPPROTO_TCP && proto != IPPROTO_UDP) || src != icmp.dst {
        return None;
    }
    let ports = ptr_at::<4>(l4, end)?;
    Some(FlowKey {
        src: dst,
        dst: src,
        sport: ports.u16::<2>(),
        dport: ports.u16::<0>(),
        proto,
        family: icmp.family,
        _pad: [0; 2],
    })
}
