//! Tunnel forwarding (`ipip`, `gue`): the path decides as in dsr and returns a verdict
//! that asks for encapsulation ([`forward`]); the entry point then ([`finish`]) prepends
//! the outer header with `bpf_xdp_adjust_head` — the last thing done to the packet, as
//! the helper invalidates every packet pointer the path holds — or answers a packet that
//! would no longer fit the interface's MTU ([`too_big`]); merged segments longer than
//! the MTU go on to the tc ingress ([`crate::tunnel_gso`]). docs/tunnel.md.
//!
//! The outer header: IPv4 (protocol 4 for an IPv4 inner packet, 41 for IPv6) or IPv6
//! (next header 4 or 41) after the backend's family, from `LB_CONFIG`'s tunnel source of
//! that family to the backend's address; GUE adds a UDP header to `GUE_PORT` whose source
//! port (and an IPv6 outer header's flow label) comes from the inner flow's addresses and
//! ports, so routers' ECMP spreads the flows. The Ethernet destination is the backend's
//! `mac`: the next hop toward it (its route's gateway when routed).

use aya_ebpf::{
    bindings::{
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
        xdp_md,
    },
    helpers::bpf_xdp_adjust_head,
    programs::XdpContext,
};
use lb_common::{
    BACKEND_ENTRIES_LIMIT, FAMILY_V4, IPPROTO_UDP,
    counters::{DROP_BAD_BACKEND, DROP_TUNNEL, TX_TUNNEL},
    maps::{
        Backend, DataplaneConfig, GUE_PORT, SERVICE_F_GUE, ServiceMeta, TUNNEL_GUE_OVERHEAD,
        TUNNEL_V4_OVERHEAD, TUNNEL_V6_OVERHEAD,
    },
};

use crate::{
    Verdict, flow,
    maps::LB_CONFIG,
    parse::{ETH_HLEN, ETH_SRC, IPV4_HLEN, IPV6_HLEN, UDP_HLEN},
    pkt::{Hdr, ptr_at},
    too_big,
};

/// Verdict action bit: encapsulate toward the backend whose id is in the low bits
/// ([`ID_MASK`]); never an XDP action (those are 0 to 4).
const ENCAP: u32 = 1 << 31;
/// With [`ENCAP`]: GUE, not plain IP-in-IP.
const ENCAP_GUE: u32 = 1 << 30;
/// Backend ids are below `BACKEND_ENTRIES_LIMIT` (a power of two).
const ID_MASK: u32 = BACKEND_ENTRIES_LIMIT - 1;

pub const ETH_P_IP: u16 = 0x0800u16.to_be();
pub const ETH_P_IPV6: u16 = 0x86ddu16.to_be();
/// IPv4 "don't fragment", as loaded from the wire.
pub const IP_DF: u16 = 0x4000u16.to_be();
/// IP protocol numbers of an inner IPv4 / IPv6 packet.
pub const IPPROTO_IPIP: u8 = 4;
pub const IPPROTO_IPV6: u8 = 41;
/// The outer header's TTL / hop limit.
const OUTER_TTL: u8 = 64;

/// The verdict of a tunnel service's packet bound for backend `backend_id`: [`finish`]
/// replaces it with the outcome of the encapsulation (`TX_TUNNEL`, or the ICMP answer or
/// drop).
#[inline(always)]
pub fn forward(svc: &ServiceMeta, backend_id: u32) -> Verdict {
    let gue = if svc.flags & SERVICE_F_GUE != 0 {
        ENCAP_GUE
    } else {
        0
    };
    Verdict::new(ENCAP | gue | (backend_id & ID_MASK), TX_TUNNEL)
}

/// At the entry point, after the path: a verdict asking for encapsulation is carried out
/// (or turned into the ICMP answer or a drop) in [`encap`], a subprogram of its own so
/// that its locals never add to the path's frame (docs/internals/fast-path.md, "Stack
/// budget"); any other verdict is returned as is.
#[inline(always)]
pub fn finish(ctx: &XdpContext, v: Verdict) -> Verdict {
    if v.action & ENCAP == 0 {
        return v;
    }
    let r = encap(ctx.ctx, v.action);
    Verdict::new((r >> 32) as u32, r as u32)
}

/// A small mix of the inner flow's addresses and ports (GUE's source port, the IPv6
/// outer flow label): the same flow always gets the same value.
#[inline(always)]
fn mix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846c_a68b);
    h ^ (h >> 16)
}

/// A verdict as [`encap`] returns it: action in the high word, counter in the low.
#[inline(always)]
fn packed(action: u32, counter: u32) -> u64 {
    ((action as u64) << 32) | counter as u64
}

/// What [`encap`] keeps across `bpf_xdp_adjust_head` besides the context and two map
/// pointers, in one register: the inner packet's length (bits 0..16), whether it is
/// IPv4 (bit 16), GUE (bit 17), merged segments to pass (bit 18), the flow's mix (bits
/// 32..64).
const KEEP_V4: u64 = 1 << 16;
const KEEP_GUE: u64 = 1 << 17;
const KEEP_MERGED: u64 = 1 << 18;

/// Encapsulates the packet for the backend `action` names (see [`forward`]); returns
/// the verdict [`packed`]. Values are re-read from the map entries after the helper
/// rather than kept: every value live across it is a stack slot.
#[inline(never)]
fn encap(ctx: *mut xdp_md, action: u32) -> u64 {
    let Some(b) = flow::any_backend(action & ID_MASK) else {
        return packed(XDP_DROP, DROP_BAD_BACKEND);
    };
    let Some(cfg) = LB_CONFIG.get(0) else {
        return packed(XDP_DROP, DROP_TUNNEL);
    };
    let gue = action & ENCAP_GUE != 0;
    let x = XdpContext::new(ctx);
    let data = x.data();
    let end = x.data_end();
    let Some(eth) = ptr_at::<ETH_HLEN>(data, end) else {
        return packed(XDP_DROP, DROP_TUNNEL);
    };
    let etype = eth.u16::<12>();
    let inner_v4 = etype == ETH_P_IP;
    // A VLAN tag is not carried into the tunnel (docs/tunnel.md).
    if !inner_v4 && etype != ETH_P_IPV6 {
        return packed(XDP_DROP, DROP_TUNNEL);
    }
    let l3 = data + ETH_HLEN;
    let (inner_len, df, h) = if inner_v4 {
        let Some(ip) = ptr_at::<IPV4_HLEN>(l3, end) else {
            return packed(XDP_DROP, DROP_TUNNEL);
        };
        let hlen = ((ip.u8::<0>() & 0x0f) as usize) * 4;
        let ports = match ptr_at::<4>(l3 + hlen, end) {
            Some(p) => p.u32::<0>(),
            None => 0,
        };
        let h = ip.u32::<12>() ^ ip.u32::<16>().rotate_left(16) ^ ports;
        (
            u16::from_be(ip.u16::<2>()) as u32,
            ip.u16::<6>() & IP_DF != 0,
            h,
        )
    } else {
        let Some(ip) = ptr_at::<{ IPV6_HLEN + 4 }>(l3, end) else {
            return packed(XDP_DROP, DROP_TUNNEL);
        };
        let h = ip.u32::<8>()
            ^ ip.u32::<20>()
            ^ ip.u32::<24>().rotate_left(16)
            ^ ip.u32::<36>()
            ^ ip.u32::<40>();
        (
            u16::from_be(ip.u16::<4>()) as u32 + IPV6_HLEN as u32,
            true,
            h,
        )
    };
    let overhead = overhead(b.family == FAMILY_V4, gue);
    let mtu = cfg.mtu as u32;
    // Longer than the MTU: no frame of the wire but segments merged before the program
    // (TSO, GRO), which only generic mode sees (from a virtual interface whose peer
    // hands over its host's TSO packets whole). Its segments fit, so no "too big"
    // answer: encapsulated and passed to `lb_tunnel_gso` on the tc ingress, which gives
    // the skb the tunnel's GSO state and sends it ([`crate::tunnel_gso`]). Only within
    // one family: the skb's inner protocol is taken from the outer header there.
    let merged = mtu != 0 && inner_len > mtu;
    if merged && inner_v4 != (b.family == FAMILY_V4) {
        return packed(XDP_DROP, DROP_TUNNEL);
    }
    if !merged && mtu != 0 && inner_len + overhead > mtu {
        if !df || mtu <= overhead {
            return packed(XDP_DROP, DROP_TUNNEL);
        }
        let v = too_big::answer(&x, inner_v4, mtu - overhead);
        return packed(v.action, v.counter);
    }
    if (b.family == FAMILY_V4 && cfg.tunnel_src4 == 0)
        || (b.family != FAMILY_V4 && cfg.tunnel_src6 == [0; 4])
    {
        return packed(XDP_DROP, DROP_TUNNEL);
    }
    let keep = (inner_len as u64 & 0xffff)
        | if inner_v4 { KEEP_V4 } else { 0 }
        | if gue { KEEP_GUE } else { 0 }
        | if merged { KEEP_MERGED } else { 0 }
        | ((mix(h) as u64) << 32);
    // One value across the helper call, not its parts.
    let keep = opaque(keep);
    // SAFETY: the helper only moves `data` within the frame's headroom.
    if unsafe { bpf_xdp_adjust_head(ctx, -(overhead as i32)) } != 0 {
        return packed(XDP_DROP, DROP_TUNNEL);
    }
    if write(&x, b, cfg, keep) {
        let action = if keep & KEEP_MERGED != 0 {
            XDP_PASS
        } else {
            XDP_TX
        };
        packed(action, TX_TUNNEL)
    } else {
        packed(XDP_DROP, DROP_TUNNEL)
    }
}

/// `v`, through an asm statement the compiler can neither see through nor move across
/// memory accesses.
#[inline(always)]
pub fn opaque(mut v: u64) -> u64 {
    // SAFETY: register only; `v` comes out as it went in.
    unsafe {
        core::arch::asm!(
            "{v} = {v}",
            v = inout(reg) v,
            options(nostack, preserves_flags),
        );
    }
    v
}

/// Bytes the outer headers take.
#[inline(always)]
fn overhead(outer_v4: bool, gue: bool) -> u32 {
    let ip = if outer_v4 {
        TUNNEL_V4_OVERHEAD
    } else {
        TUNNEL_V6_OVERHEAD
    };
    (ip + if gue { TUNNEL_GUE_OVERHEAD } else { 0 }) as u32
}

/// Writes the new Ethernet and outer headers in front of the inner packet (`data` has
/// moved back by the outer headers' length); `false` if the frame is too short (never,
/// the helper succeeded).
#[inline(always)]
fn write(x: &XdpContext, b: &Backend, cfg: &DataplaneConfig, keep: u64) -> bool {
    let gue = keep & KEEP_GUE != 0;
    let overhead = overhead(b.family == FAMILY_V4, gue);
    let data = x.data();
    let end = x.data_end();
    let Some(eth) = ptr_at::<ETH_HLEN>(data, end) else {
        return false;
    };
    // Our MAC: the old Ethernet header's destination, now right after the new headers.
    let Some(old) = ptr_at::<ETH_HLEN>(data + (overhead as usize & 0x3f), end) else {
        return false;
    };
    // SAFETY: both headers were checked above; the backend's entry is 32 bytes.
    unsafe {
        move_mac(old.raw(), eth.raw().add(ETH_SRC));
        move_mac(b.mac.as_ptr(), eth.raw());
    }
    // Taken apart only now (an ordering point the compiler keeps): every value derived
    // from `keep` before the copies above would wait in a stack slot.
    let keep = opaque(keep);
    let inner_len = (keep & 0xffff) as u32;
    let inner_v4 = keep & KEEP_V4 != 0;
    let gue = keep & KEEP_GUE != 0;
    let h = (keep >> 32) as u32;
    let outer_v4 = b.family == FAMILY_V4;
    let proto = if gue {
        IPPROTO_UDP
    } else if inner_v4 {
        IPPROTO_IPIP
    } else {
        IPPROTO_IPV6
    };
    let sport = (0x8000 | (h & 0x7fff)) as u16;
    let l3 = data + ETH_HLEN;
    if outer_v4 {
        eth.set_u16::<12>(ETH_P_IP);
        let Some(ip) = ptr_at::<{ IPV4_HLEN + UDP_HLEN }>(l3, end) else {
            return false;
        };
        ip.set_u16::<0>(u16::from_ne_bytes([0x45, 0]));
        ip.set_u16::<2>(((inner_len + overhead) as u16).to_be());
        ip.set_u32::<4>(0);
        ip.set_u16::<8>(u16::from_ne_bytes([OUTER_TTL, proto]));
        let (src, dst) = (cfg.tunnel_src4, b.addr[0]);
        ip.set_u32::<12>(src);
        ip.set_u32::<16>(dst);
        let sum = u16::from_ne_bytes([0x45, 0]) as u64
            + ((inner_len + overhead) as u16).to_be() as u64
            + u16::from_ne_bytes([OUTER_TTL, proto]) as u64
            + (src & 0xffff) as u64
            + (src >> 16) as u64
            + (dst & 0xffff) as u64
            + (dst >> 16) as u64;
        ip.set_u16::<10>(!lb_common::csum::fold(sum));
        if gue {
            set_udp::<20, { IPV4_HLEN + UDP_HLEN }>(ip, sport, inner_len);
        }
    } else {
        eth.set_u16::<12>(ETH_P_IPV6);
        let Some(ip) = ptr_at::<{ IPV6_HLEN + UDP_HLEN }>(l3, end) else {
            return false;
        };
        ip.set_u32::<0>((0x6000_0000 | (h & 0x000f_ffff)).to_be());
        let payload = inner_len + if gue { UDP_HLEN as u32 } else { 0 };
        ip.set_u16::<4>((payload as u16).to_be());
        ip.set_u16::<6>(u16::from_ne_bytes([proto, OUTER_TTL]));
        // Word by word from the map entries (nothing kept).
        ip.set_u32::<8>(cfg.tunnel_src6[0]);
        ip.set_u32::<12>(cfg.tunnel_src6[1]);
        ip.set_u32::<16>(cfg.tunnel_src6[2]);
        ip.set_u32::<20>(cfg.tunnel_src6[3]);
        ip.set_u32::<24>(b.addr[0]);
        ip.set_u32::<28>(b.addr[1]);
        ip.set_u32::<32>(b.addr[2]);
        ip.set_u32::<36>(b.addr[3]);
        if gue {
            set_udp::<40, { IPV6_HLEN + UDP_HLEN }>(ip, sport, inner_len);
        }
    }
    true
}

/// GUE's UDP header at `OFF` of `h`: `sport` to `GUE_PORT`, carrying `inner_len` bytes;
/// checksum 0 (none over IPv4; over IPv6 the zero checksum RFC 6935 allows tunnels).
#[inline(always)]
fn set_udp<const OFF: usize, const N: usize>(h: Hdr<N>, sport: u16, inner_len: u32) {
    // SAFETY: the caller checked N bytes, OFF + 8 <= N.
    let udp = unsafe { Hdr::<UDP_HLEN>::assume(h.raw().add(OFF)) };
    udp.set_u16::<0>(sport.to_be());
    udp.set_u16::<2>(GUE_PORT.to_be());
    udp.set_u16::<4>(((inner_len + UDP_HLEN as u32) as u16).to_be());
    udp.set_u16::<6>(0);
}

/// Copies a MAC address (a 32-bit and a 16-bit word, each stored as soon as loaded).
///
/// # Safety
/// `from` and `to` must each point to 6 readable / writable bytes.
#[inline(always)]
pub unsafe fn move_mac(from: *const u8, to: *mut u8) {
    // SAFETY: the caller's promise.
    unsafe {
        let hi = core::ptr::read_unaligned(from.cast::<u32>());
        core::ptr::write_unaligned(to.cast::<u32>(), hi);
        let lo = core::ptr::read_unaligned(from.add(4).cast::<u16>());
        core::ptr::write_unaligned(to.add(4).cast::<u16>(), lo);
    }
}
