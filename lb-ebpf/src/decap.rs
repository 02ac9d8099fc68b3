//! `lb_decap`, the backend side of tunnel forwarding (`lb-agent decap attach`): a tunnel
//! packet addressed to one of this host's addresses (`LB_DECAP_ADDRS`) — IPv4 or IPv6
//! carrying IPv4 (protocol 4) or IPv6 (41), or UDP to `GUE_PORT` carrying either — loses
//! its outer headers (`bpf_xdp_adjust_head`), the Ethernet type follows the inner family,
//! and the inner packet goes up the stack (`XDP_PASS`). Everything else passes untouched.
//! For hosts without the kernel's ipip / fou modules; docs/tunnel.md.

use aya_ebpf::{
    bindings::xdp_action::XDP_PASS, helpers::bpf_xdp_adjust_head, macros::xdp, programs::XdpContext,
};
use lb_common::{
    DECAP_PASSED, DECAP_STRIPPED, FAMILY_V4, FAMILY_V6, IPPROTO_UDP,
    maps::{DecapAddr, GUE_PORT},
};

use crate::{
    maps::{LB_DECAP_ADDRS, LB_DECAP_COUNTERS},
    parse::{ETH_DST, ETH_HLEN, ETH_SRC, IPV4_HLEN, IPV6_HLEN, UDP_HLEN},
    pkt::ptr_at,
    tunnel::{ETH_P_IP, ETH_P_IPV6, IPPROTO_IPIP, IPPROTO_IPV6},
};

/// IPv4 flags+fragment offset: MF and the offset (an outer fragment is the kernel's).
const IPV4_FRAG_MASK: u16 = 0x3fffu16.to_be();

#[xdp]
pub fn lb_decap(ctx: XdpContext) -> u32 {
    let counter = match strip(&ctx) {
        Some(()) => DECAP_STRIPPED,
        None => DECAP_PASSED,
    };
    if let Some(p) = LB_DECAP_COUNTERS.get_ptr_mut(counter) {
        // SAFETY: a per-CPU array slot, only this CPU writes it.
        unsafe { *p += 1 }
    }
    XDP_PASS
}

/// Whether `addr` of `family` is one of the host's.
#[inline(always)]
fn ours(addr: [u32; 4], family: u8) -> bool {
    let key = DecapAddr {
        addr,
        family,
        _pad: [0; 3],
    };
    LB_DECAP_ADDRS.get_ptr(&key).is_some()
}

/// After the outer IP header (ending at `l4`) of protocol `proto`: the outer headers'
/// length past the Ethernet header's end (`ip_len` for IP-in-IP, `+ 8` for GUE) and
/// whether the inner packet is IPv4; `None`: not a tunnel packet.
#[inline(always)]
fn inner(proto: u8, l4: usize, ip_len: usize, end: usize) -> Option<(usize, bool)> {
    match proto {
        IPPROTO_IPIP => Some((ip_len, true)),
        IPPROTO_IPV6 => Some((ip_len, false)),
        IPPROTO_UDP => {
            let udp = ptr_at::<{ UDP_HLEN + 1 }>(l4, end)?;
            if udp.u16::<2>() != GUE_PORT.to_be() {
                return None;
            }
            // GUE variant 1: the inner IP header right after UDP, told by its version.
            match udp.u8::<8>() >> 4 {
                4 => Some((ip_len + UDP_HLEN, true)),
                6 => Some((ip_len + UDP_HLEN, false)),
                _ => None,
            }
        }
        _ => None,
    }
}

#[inline(always)]
fn strip(ctx: &XdpContext) -> Option<()> {
    let data = ctx.data();
    let end = ctx.data_end();
    let eth = ptr_at::<ETH_HLEN>(data, end)?;
    let etype = eth.u16::<12>();
    let l3 = data + ETH_HLEN;
    let (outer, inner_v4) = if etype == ETH_P_IP {
        let ip = ptr_at::<IPV4_HLEN>(l3, end)?;
        let vihl = ip.u8::<0>();
        let hlen = ((vihl & 0x0f) as usize) * 4;
        if vihl >> 4 != 4 || hlen < IPV4_HLEN || ip.u16::<6>() & IPV4_FRAG_MASK != 0 {
            return None;
        }
        if !ours([ip.u32::<16>(), 0, 0, 0], FAMILY_V4) {
            return None;
        }
        inner(ip.u8::<9>(), l3 + hlen, hlen, end)?
    } else if etype == ETH_P_IPV6 {
        let ip = ptr_at::<IPV6_HLEN>(l3, end)?;
        if !ours(ip.words4::<24>(), FAMILY_V6) {
            return None;
        }
        inner(ip.u8::<6>(), l3 + IPV6_HLEN, IPV6_HLEN, end)?
    } else {
        return None;
    };
    // The inner header must be there (its version checked) before anything changes.
    let inner_at = l3 + outer;
    let first = ptr_at::<IPV4_HLEN>(inner_at, end)?.u8::<0>() >> 4;
    if first != if inner_v4 { 4 } else { 6 } {
        return None;
    }
    let (dst, src) = (eth.mac::<ETH_DST>(), eth.mac::<ETH_SRC>());
    // SAFETY: the helper moves `data` forward within the frame (outer < frame length).
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, outer as i32) } != 0 {
        return None;
    }
    let eth = ptr_at::<ETH_HLEN>(ctx.data(), ctx.data_end())?;
    eth.set_mac::<ETH_DST>(&dst);
    eth.set_mac::<ETH_SRC>(&src);
    eth.set_u16::<12>(if inner_v4 { ETH_P_IP } else { ETH_P_IPV6 });
    Some(())
}
