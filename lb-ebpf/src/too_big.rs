//! The answer to a tunnel service's packet that would not fit the interface's MTU once
//! encapsulated (Katran's ICMP "too big" generation): ICMP fragmentation-needed (IPv4,
//! DF set) or ICMPv6 packet-too-big, from the VIP to the client, quoting the start of the
//! client's packet and naming the MTU the client may use (the interface's less the
//! tunnel overhead), sent back with `XDP_TX` (MACs swapped). The frame is built in place:
//! `bpf_xdp_adjust_head` makes room for the new IP and ICMP headers in front of the old
//! frame, `bpf_xdp_adjust_tail` cuts it after the quote.

use aya_ebpf::{
    bindings::xdp_action::XDP_TX,
    helpers::{bpf_csum_diff, bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use lb_common::{
    IPPROTO_ICMP, IPPROTO_ICMPV6,
    counters::{DROP_TUNNEL, TX_ICMP_TOO_BIG},
};

use crate::{
    Verdict,
    parse::{ETH_DST, ETH_HLEN, ETH_SRC, ICMP_HLEN, IPV4_HLEN, IPV6_HLEN},
    pkt::{Hdr, ptr_at},
    tunnel::{ETH_P_IP, ETH_P_IPV6, move_mac},
};

/// IPv4: the quote (the client's IP header and 8 bytes, RFC 792) and the whole answer.
const V4_QUOTE: usize = IPV4_HLEN + 8;
const V4_ADDED: usize = IPV4_HLEN + ICMP_HLEN;
const V4_FRAME: usize = ETH_HLEN + V4_ADDED + V4_QUOTE;
/// IPv6: the quote (the client's IPv6 header and 8 bytes) and the whole answer.
const V6_QUOTE: usize = IPV6_HLEN + 8;
const V6_ADDED: usize = IPV6_HLEN + ICMP_HLEN;
const V6_FRAME: usize = ETH_HLEN + V6_ADDED + V6_QUOTE;
const TTL: u8 = 64;

/// Answers the packet in `ctx` (an untagged IPv4 packet with DF set if `v4`, else
/// IPv6) with the "too big" error naming `mtu`.
#[inline(always)]
pub fn answer(ctx: &XdpContext, v4: bool, mtu: u32) -> Verdict {
    let (added, frame) = if v4 {
        (V4_ADDED, V4_FRAME)
    } else {
        (V6_ADDED, V6_FRAME)
    };
    // SAFETY: the helpers move `data` / `data_end` within the frame's buffer.
    unsafe {
        if bpf_xdp_adjust_head(ctx.ctx, -(added as i32)) != 0 {
            return Verdict::drop(DROP_TUNNEL);
        }
        let len = frame_len(ctx);
        if bpf_xdp_adjust_tail(ctx.ctx, (frame as i64 - len as i64) as i32) != 0 {
            return Verdict::drop(DROP_TUNNEL);
        }
    }
    let ok = if v4 {
        ptr_at::<V4_FRAME>(ctx.data(), ctx.data_end()).map(|f| build4(f, mtu))
    } else {
        ptr_at::<V6_FRAME>(ctx.data(), ctx.data_end()).map(|f| build6(f, mtu))
    };
    match ok {
        Some(()) => Verdict::new(XDP_TX, TX_ICMP_TOO_BIG),
        None => Verdict::drop(DROP_TUNNEL),
    }
}

/// The frame's length, as `data_end - data` in that order: the verifier lets a
/// privileged program subtract two packet pointers, but refuses any arithmetic that
/// starts from `data_end`, which is what LLVM makes of `frame - (end - data)`.
#[inline(always)]
fn frame_len(ctx: &XdpContext) -> u64 {
    let mut len = ctx.data_end() as u64;
    let data = ctx.data() as u64;
    // SAFETY: register arithmetic only.
    unsafe {
        core::arch::asm!(
            "{len} -= {data}",
            len = inout(reg) len,
            data = in(reg) data,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    len
}

/// Swaps the MACs of the old Ethernet header at `OLD` into the new one at 0.
#[inline(always)]
fn ethernet<const OLD: usize, const N: usize>(f: Hdr<N>, etype: u16) {
    const { assert!(OLD + ETH_HLEN <= N) };
    let at = f.raw();
    // Word by word, each stored as soon as loaded (nothing kept: the frame is scarce).
    // SAFETY: both headers lie inside the checked N bytes.
    unsafe {
        move_mac(at.add(OLD + ETH_SRC), at.add(ETH_DST));
        move_mac(at.add(OLD + ETH_DST), at.add(ETH_SRC));
    }
    // SAFETY: the frame starts with N >= 14 checked bytes.
    let eth = unsafe { Hdr::<ETH_HLEN>::assume(f.raw()) };
    eth.set_u16::<12>(etype);
}

/// The sum `bpf_csum_diff` gives over `len` bytes (a multiple of 4) at `at`, added to
/// `seed`.
#[inline(always)]
fn sum(at: *mut u8, len: u32, seed: u32) -> u64 {
    // SAFETY: `at` and `len` lie inside the checked frame.
    unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, at.cast(), len, seed) as u64 }
}

/// Copies the 32-bit word at `FROM` to `TO` (one load, one store: nothing is kept).
#[inline(always)]
fn copy<const FROM: usize, const TO: usize, const N: usize>(f: Hdr<N>) {
    const { assert!(FROM + 4 <= N && TO + 4 <= N) };
    // SAFETY: both words lie inside the checked N bytes.
    unsafe {
        let v = core::ptr::read_unaligned(f.raw().add(FROM).cast::<u32>());
        core::ptr::write_unaligned(f.raw().add(TO).cast::<u32>(), v);
    }
}

#[inline(always)]
fn build4(f: Hdr<V4_FRAME>, mtu: u32) {
    // The old frame starts at V4_ADDED: its Ethernet header (read first: the new IP
    // header covers it), then the client's IP header at OLD_IP.
    const OLD_IP: usize = V4_ADDED + ETH_HLEN;
    ethernet::<V4_ADDED, V4_FRAME>(f, ETH_P_IP);
    // From the VIP (the old destination) to the client (the old source).
    copy::<{ OLD_IP + 16 }, { ETH_HLEN + 12 }, V4_FRAME>(f);
    copy::<{ OLD_IP + 12 }, { ETH_HLEN + 16 }, V4_FRAME>(f);
    // SAFETY: 14 + 28 <= V4_FRAME.
    let ip = unsafe { Hdr::<V4_ADDED>::assume(f.raw().add(ETH_HLEN)) };
    ip.set_u16::<0>(u16::from_ne_bytes([0x45, 0]));
    ip.set_u16::<2>(((V4_ADDED + V4_QUOTE) as u16).to_be());
    ip.set_u32::<4>(0);
    ip.set_u16::<8>(u16::from_ne_bytes([TTL, IPPROTO_ICMP]));
    ip.set_u16::<10>(0);
    let s = sum(ip.raw(), IPV4_HLEN as u32, 0);
    ip.set_u16::<10>(!lb_common::csum::fold(s));
    // ICMP type 3 code 4, the next-hop MTU in the second half of the "unused" word.
    ip.set_u16::<20>(u16::from_ne_bytes([3, 4]));
    ip.set_u16::<22>(0);
    ip.set_u16::<24>(0);
    ip.set_u16::<26>((mtu as u16).to_be());
    let icmp = f.raw().wrapping_add(ETH_HLEN + IPV4_HLEN);
    let s = sum(icmp, (ICMP_HLEN + V4_QUOTE) as u32, 0);
    ip.set_u16::<22>(!lb_common::csum::fold(s));
}

#[inline(always)]
fn build6(f: Hdr<V6_FRAME>, mtu: u32) {
    const OLD_IP: usize = V6_ADDED + ETH_HLEN;
    const SRC: usize = ETH_HLEN + 8;
    const DST: usize = ETH_HLEN + 24;
    // The old Ethernet header first: the new header's destination covers it.
    ethernet::<V6_ADDED, V6_FRAME>(f, ETH_P_IPV6);
    copy::<{ OLD_IP + 24 }, SRC, V6_FRAME>(f);
    copy::<{ OLD_IP + 28 }, { SRC + 4 }, V6_FRAME>(f);
    copy::<{ OLD_IP + 32 }, { SRC + 8 }, V6_FRAME>(f);
    copy::<{ OLD_IP + 36 }, { SRC + 12 }, V6_FRAME>(f);
    copy::<{ OLD_IP + 8 }, DST, V6_FRAME>(f);
    copy::<{ OLD_IP + 12 }, { DST + 4 }, V6_FRAME>(f);
    copy::<{ OLD_IP + 16 }, { DST + 8 }, V6_FRAME>(f);
    copy::<{ OLD_IP + 20 }, { DST + 12 }, V6_FRAME>(f);
    // SAFETY: 14 + 48 <= V6_FRAME.
    let ip = unsafe { Hdr::<V6_ADDED>::assume(f.raw().add(ETH_HLEN)) };
    let icmp_len = (ICMP_HLEN + V6_QUOTE) as u16;
    ip.set_u32::<0>(0x6000_0000u32.to_be());
    ip.set_u16::<4>(icmp_len.to_be());
    ip.set_u16::<6>(u16::from_ne_bytes([IPPROTO_ICMPV6, TTL]));
    // ICMPv6 type 2 code 0, the MTU as a 32-bit word.
    ip.set_u16::<40>(u16::from_ne_bytes([2, 0]));
    ip.set_u16::<42>(0);
    ip.set_u32::<44>(mtu.to_be());
    // The pseudo-header: both addresses, the upper-layer length and next header.
    let addrs = f.raw().wrapping_add(SRC);
    let s = sum(addrs, 32, 0) + icmp_len.to_be() as u64 + (IPPROTO_ICMPV6 as u16).to_be() as u64;
    let icmp = f.raw().wrapping_add(ETH_HLEN + IPV6_HLEN);
    let s = sum(icmp, (ICMP_HLEN + V6_QUOTE) as u32, 0) + s;
    ip.set_u16::<42>(!lb_common::csum::fold(s));
}
