//! `lb_tunnel_gso`, on the interface's tc ingress: sends out a tunnel service's merged
//! segments (docs/tunnel.md, "Offloads"). Generic mode can hand the XDP program a TCP
//! packet longer than the MTU (a veth's peer passes its host's TSO packets whole); XDP
//! encapsulates it as any other ([`crate::tunnel`]) but cannot give the skb the
//! tunnel's GSO state, without which no later segmentation applies to the outer packet,
//! so it passes it instead of sending it. Here the outer headers come out and go back in
//! with `bpf_skb_adjust_room`, which sets the tunnel's GSO type and shrinks the segment
//! size by the outer headers, and the packet leaves through the interface it came in
//! by, whose peer (or any device that needs wire-sized frames) segments it.
//!
//! Such a packet is recognised by what nothing else on the ingress is: a GSO packet for
//! another host (its destination MAC is the backend's next hop) carrying a tunnel header
//! (IPv4 or IPv6 with protocol 4 or 41, or UDP to `GUE_PORT`). Any other packet passes.

use aya_ebpf::{
    EbpfContext,
    bindings::{
        __sk_buff, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6,
        BPF_F_ADJ_ROOM_ENCAP_L4_UDP, BPF_F_ADJ_ROOM_FIXED_GSO, TC_ACT_OK, TC_ACT_SHOT,
        bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
    },
    helpers::bpf_redirect,
    macros::classifier,
    programs::TcContext,
};
use lb_common::{
    IPPROTO_UDP,
    maps::{GUE_PORT, TUNNEL_GUE_OVERHEAD, TUNNEL_V4_OVERHEAD, TUNNEL_V6_OVERHEAD},
};

use crate::{
    parse::{ETH_HLEN, IPV4_HLEN, IPV6_HLEN},
    tunnel::{IPPROTO_IPIP, IPPROTO_IPV6},
};

/// `PACKET_OTHERHOST`: the frame's destination MAC is not the interface's.
const PACKET_OTHERHOST: u32 = 3;

#[classifier]
pub fn lb_tunnel_gso(ctx: TcContext) -> i32 {
    // SAFETY: the context is an `__sk_buff`, whose fields are readable.
    let (pkt_type, gso_size, ifindex) = unsafe {
        let skb = &*(ctx.as_ptr() as *const __sk_buff);
        (skb.pkt_type, skb.gso_size, skb.ifindex)
    };
    if pkt_type != PACKET_OTHERHOST || gso_size == 0 {
        return TC_ACT_OK;
    }
    match outer(&ctx) {
        Some((true, false)) => reencap::<{ ETH_HLEN + IPV4_HLEN }>(&ctx, ifindex, true, false),
        Some((true, true)) => reencap::<{ ETH_HLEN + IPV4_HLEN + 8 }>(&ctx, ifindex, true, true),
        Some((false, false)) => reencap::<{ ETH_HLEN + IPV6_HLEN }>(&ctx, ifindex, false, false),
        Some((false, true)) => reencap::<{ ETH_HLEN + IPV6_HLEN + 8 }>(&ctx, ifindex, false, true),
        None => TC_ACT_OK,
    }
}

/// The tunnel header the packet carries: (outer IPv4, GUE); `None` if none.
#[inline(always)]
fn outer(ctx: &TcContext) -> Option<(bool, bool)> {
    let etype = u16::from_be(ctx.load::<u16>(12).ok()?);
    let (v4, proto, l4) = match etype {
        0x0800 => {
            let b = ctx.load::<[u8; 10]>(ETH_HLEN).ok()?;
            if b[0] != 0x45 {
                return None;
            }
            (true, b[9], ETH_HLEN + IPV4_HLEN)
        }
        0x86dd => (
            false,
            ctx.load::<u8>(ETH_HLEN + 6).ok()?,
            ETH_HLEN + IPV6_HLEN,
        ),
        _ => return None,
    };
    match proto {
        IPPROTO_IPIP | IPPROTO_IPV6 => Some((v4, false)),
        IPPROTO_UDP if u16::from_be(ctx.load::<u16>(l4 + 2).ok()?) == GUE_PORT => Some((v4, true)),
        _ => None,
    }
}

/// Takes the `N` bytes of Ethernet and outer headers out and puts them back as the
/// tunnel's, then sends the packet out of `ifindex`.
#[inline(always)]
fn reencap<const N: usize>(ctx: &TcContext, ifindex: u32, v4: bool, gue: bool) -> i32 {
    let Ok(headers) = ctx.load::<[u8; N]>(0) else {
        return TC_ACT_SHOT;
    };
    let overhead = (if v4 {
        TUNNEL_V4_OVERHEAD
    } else {
        TUNNEL_V6_OVERHEAD
    } + if gue { TUNNEL_GUE_OVERHEAD } else { 0 }) as i32;
    // Out with the segment size kept; back in as the tunnel, the segment size less the
    // outer headers.
    if ctx
        .adjust_room(-overhead, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO as u64)
        .is_err()
    {
        return TC_ACT_SHOT;
    }
    let l3 = if v4 {
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV4
    } else {
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV6
    };
    let l4 = if gue { BPF_F_ADJ_ROOM_ENCAP_L4_UDP } else { 0 };
    if ctx
        .adjust_room(overhead, BPF_ADJ_ROOM_MAC, (l3 | l4) as u64)
        .is_err()
        || ctx.store(0, &headers, 0).is_err()
    {
        return TC_ACT_SHOT;
    }
    // SAFETY: a helper call with plain values; it returns TC_ACT_REDIRECT.
    unsafe { bpf_redirect(ifindex, 0) as i32 }
}
