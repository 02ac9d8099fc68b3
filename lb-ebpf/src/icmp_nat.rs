//! The rewrite of an ICMP error about a nat flow: the quoted packet's addresses and
//! ports become the other side's view of the flow, the outer header goes from the
//! quoted destination to the quoted source, and every checksum follows (RFC 1624
//! incremental updates over the words that change).
//!
//! Checksums: the outer IPv4 header (addresses, TTL); the quoted IPv4 header
//! (addresses); the quoted TCP/UDP checksum when the quote reaches it (its
//! pseudo-header addresses and the ports; a UDP/IPv4 checksum of 0 stays 0); the ICMP
//! checksum over every changed word of the quote (they all lie at even offsets from
//! the ICMP header), plus, for ICMPv6, the outer addresses of its pseudo-header.
//!
//! The outer TTL (hop limit) is decremented, as a router forwarding the error would;
//! an error arriving with TTL <= 1 is not translated but passed (`PASS_TTL_EXPIRED`).
//! The quoted header's TTL is the packet's as it left its sender and is kept.

use lb_common::{
    FAMILY_V4, IPPROTO_TCP, IPPROTO_UDP,
    counters::{PASS_MALFORMED, PASS_TTL_EXPIRED},
    csum::{replace_addr, replace16, replace32},
};

use crate::{
    parse::{ICMP_HLEN, IPV4_HLEN, IPV6_HLEN, Icmp, Quote, UDP_HLEN},
    pkt::{Hdr, ptr_at},
};

/// Quoted TCP bytes needed to reach the end of the checksum field.
const TCP_CSUM_END: usize = 18;

/// What the quoted packet becomes: `src:sport -> dst:dport` (addresses as in keys,
/// network order, IPv4 in word 0). Borrowed straight from map values: a copy would be
/// 40 more bytes of BPF stack.
pub struct Target<'a> {
    pub src: &'a [u32; 4],
    pub sport: u16,
    pub dst: &'a [u32; 4],
    pub dport: u16,
}

/// Rewrites the message in place to be about `new` (the quoted packet becomes
/// `new.src:new.sport -> new.dst:new.dport`) and to travel `new.dst -> new.src`.
/// `q.key` is the quote reversed: the quoted source is `q.key.dst`.
///
/// Errors with the outcome counter of a message that must be passed instead: TTL
/// expired, or headers that no longer check out (unreachable: [`crate::icmp`] checked
/// the same bytes). Nothing is written before the TTL is known to be fine.
#[inline(always)]
pub fn rewrite(icmp: &Icmp, q: &Quote, new: &Target<'_>, end: usize) -> Result<(), u32> {
    if ttl(icmp, end).ok_or(PASS_MALFORMED)? <= 1 {
        return Err(PASS_TTL_EXPIRED);
    }
    let hdr = ptr_at::<ICMP_HLEN>(icmp.l4, end).ok_or(PASS_MALFORMED)?;
    let mut check = hdr.u16::<2>();
    check = quoted_ip(q, new, check, end).ok_or(PASS_MALFORMED)?;
    check = quoted_l4(q, new, check, end).ok_or(PASS_MALFORMED)?;
    check = outer_ip(icmp, new, check, end).ok_or(PASS_MALFORMED)?;
    hdr.set_u16::<2>(check);
    Ok(())
}

/// The outer TTL or hop limit.
#[inline(always)]
fn ttl(icmp: &Icmp, end: usize) -> Option<u8> {
    if icmp.family == FAMILY_V4 {
        Some(ptr_at::<IPV4_HLEN>(icmp.l3, end)?.u8::<8>())
    } else {
        Some(ptr_at::<IPV6_HLEN>(icmp.l3, end)?.u8::<7>())
    }
}

/// The quoted IP header's addresses (and its checksum); returns the ICMP checksum.
#[inline(always)]
fn quoted_ip(q: &Quote, new: &Target<'_>, check: u16, end: usize) -> Option<u16> {
    let old = &q.key;
    let mut check = check;
    let words = if old.family == FAMILY_V4 {
        let ip = ptr_at::<IPV4_HLEN>(q.ip, end)?;
        let ip_old = ip.u16::<10>();
        let ip_new = replace32(ip_old, old.dst[0], new.src[0]);
        let ip_new = replace32(ip_new, old.src[0], new.dst[0]);
        ip.set_u32::<12>(new.src[0]);
        ip.set_u32::<16>(new.dst[0]);
        ip.set_u16::<10>(ip_new);
        check = replace16(check, ip_old, ip_new);
        1
    } else {
        let ip = ptr_at::<IPV6_HLEN>(q.ip, end)?;
        ip.set_words4::<8>(new.src);
        ip.set_words4::<24>(new.dst);
        4
    };
    check = replace_addr(check, &old.dst, new.src, words);
    Some(replace_addr(check, &old.src, new.dst, words))
}

/// The quoted ports and, when quoted, the TCP/UDP checksum; returns the ICMP checksum.
#[inline(always)]
fn quoted_l4(q: &Quote, new: &Target<'_>, check: u16, end: usize) -> Option<u16> {
    let old = &q.key;
    let ports = ptr_at::<4>(q.l4, end)?;
    ports.set_u16::<0>(new.sport);
    ports.set_u16::<2>(new.dport);
    let mut check = replace16(check, old.dport, new.sport);
    check = replace16(check, old.sport, new.dport);

    let Some(field) = quoted_l4_csum(q, end) else {
        return Some(check);
    };
    let words = if old.family == FAMILY_V4 { 1 } else { 4 };
    let udp = old.proto == IPPROTO_UDP;
    let l4_old = field.u16::<0>();
    if udp && words == 1 && l4_old == 0 {
        return Some(check);
    }
    let l4_new = replace_addr(l4_old, &old.dst, new.src, words);
    let l4_new = replace_addr(l4_new, &old.src, new.dst, words);
    let l4_new = replace16(l4_new, old.dport, new.sport);
    let mut l4_new = replace16(l4_new, old.sport, new.dport);
    if udp && l4_new == 0 {
        l4_new = 0xffff;
    }
    field.set_u16::<0>(l4_new);
    Some(replace16(check, l4_old, l4_new))
}

/// The quoted TCP/UDP checksum field, if the quote reaches past it.
#[inline(always)]
fn quoted_l4_csum(q: &Quote, end: usize) -> Option<Hdr<2>> {
    if q.key.proto == IPPROTO_TCP {
        if q.l4_len < TCP_CSUM_END {
            return None;
        }
        let tcp = ptr_at::<TCP_CSUM_END>(q.l4, end)?;
        // SAFETY: bytes 16..18 lie inside the checked 18 bytes.
        Some(unsafe { Hdr::<2>::assume(tcp.raw().add(16)) })
    } else {
        if q.l4_len < UDP_HLEN {
            return None;
        }
        let udp = ptr_at::<UDP_HLEN>(q.l4, end)?;
        // SAFETY: bytes 6..8 lie inside the checked 8-byte header.
        Some(unsafe { Hdr::<2>::assume(udp.raw().add(6)) })
    }
}

/// The outer header: `new.dst -> new.src`, TTL one less; returns the ICMP checksum
/// (ICMPv6 covers the outer addresses through its pseudo-header).
#[inline(always)]
fn outer_ip(icmp: &Icmp, new: &Target<'_>, check: u16, end: usize) -> Option<u16> {
    if icmp.family == FAMILY_V4 {
        let ip = ptr_at::<IPV4_HLEN>(icmp.l3, end)?;
        let ttl_old = ip.u16::<8>();
        let ttl_new = u16::from_ne_bytes([ip.u8::<8>().wrapping_sub(1), ip.u8::<9>()]);
        let ip_check = replace16(ip.u16::<10>(), ttl_old, ttl_new);
        let ip_check = replace32(ip_check, ip.u32::<12>(), new.dst[0]);
        let ip_check = replace32(ip_check, icmp.dst[0], new.src[0]);
        ip.set_u16::<8>(ttl_new);
        ip.set_u32::<12>(new.dst[0]);
        ip.set_u32::<16>(new.src[0]);
        ip.set_u16::<10>(ip_check);
        Some(check)
    } else {
        let ip = ptr_at::<IPV6_HLEN>(icmp.l3, end)?;
        let check = replace_addr(check, &ip.words4::<8>(), new.dst, 4);
        let check = replace_addr(check, &icmp.dst, new.src, 4);
        let hop = u16::from_ne_bytes([ip.u8::<6>(), ip.u8::<7>().wrapping_sub(1)]);
        ip.set_u16::<6>(hop);
        ip.set_words4::<8>(new.dst);
        ip.set_words4::<24>(new.src);
        Some(check)
    }
}
