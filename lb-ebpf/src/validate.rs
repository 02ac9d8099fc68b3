//! Checks a packet addressed to a VIP must pass before it may take a flow entry or a nat
//! source port: hostile or broken input is dropped (or handed to the kernel) and counted,
//! never balanced. docs/packet-rules.md has the table; in order, for every VIP packet
//! ([`to_vip`]):
//!
//! 1. TCP/UDP lengths against the IP header ([`Packet::l4`]): `DROP_MALFORMED`;
//! 2. TTL / hop limit <= 1: `PASS_TTL_EXPIRED` (the kernel sends time-exceeded);
//! 3. TCP flags that no client sends to its server: SYN with FIN, RST or ACK, or none
//!    of SYN/ACK/RST (null, FIN-only, "Xmas" scans): `DROP_BAD_FLAGS`;
//!
//! and for a packet without a pinned flow, before it opens one ([`opening`]) — these
//! depend only on what opened the flow, so a pinned flow has passed them already and
//! the established path does not pay for them:
//!
//! 4. a source that cannot be a client (the VIP itself, unspecified/"this network",
//!    loopback, multicast, limited broadcast): `DROP_BAD_SOURCE`;
//! 5. the IPv4 header checksum: `DROP_MALFORMED` (a packet of a pinned flow takes no
//!    new state, and its backend verifies the checksum);
//! 6. an RST: `DROP_BAD_FLAGS` (it cannot open a connection);
//! 7. nat: any other TCP segment but a SYN: `DROP_NO_FLOW` (it cannot open a connection
//!    either: the backend never saw the new source port it would get, and answers with
//!    a reset; docs/capacity.md, "Spoofed packets of every kind").

use lb_common::{
    FAMILY_V4,
    counters::{DROP_BAD_FLAGS, DROP_BAD_SOURCE, DROP_MALFORMED, DROP_NO_FLOW, PASS_TTL_EXPIRED},
    csum::fold,
};

use crate::{
    Verdict,
    parse::{IPV4_HLEN, L4, Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    pkt::ptr_at,
};

/// Longest IPv4 options: 40 bytes, ten 32-bit words.
const IPV4_OPTION_WORDS: usize = 10;

/// The TCP/UDP header of a VIP packet that may be balanced, or the verdict for one
/// that must not be.
#[inline(always)]
pub fn to_vip(pkt: &Packet, end: usize) -> Result<L4, Verdict> {
    let Some(l4) = pkt.l4(end) else {
        return Err(Verdict::drop(DROP_MALFORMED));
    };
    if pkt.ttl <= 1 {
        return Err(Verdict::pass(PASS_TTL_EXPIRED));
    }
    if pkt.is_tcp() && !flags_ok(l4.tcp_flags) {
        return Err(Verdict::drop(DROP_BAD_FLAGS));
    }
    Ok(l4)
}

/// The verdict for a VIP packet without a pinned flow that must not open one (`nat`: of
/// a nat service), or `None`.
#[inline(always)]
pub fn opening(pkt: &Packet, l4: L4, nat: bool, end: usize) -> Option<Verdict> {
    let bad_source = if pkt.key.family == FAMILY_V4 {
        bad_source_v4(pkt.key.src[0])
    } else {
        bad_source_v6(&pkt.key.src)
    };
    if bad_source || pkt.key.src == pkt.key.dst {
        return Some(Verdict::drop(DROP_BAD_SOURCE));
    }
    if pkt.key.family == FAMILY_V4 && !ipv4_checksum_ok(pkt.l3, end) {
        return Some(Verdict::drop(DROP_MALFORMED));
    }
    if pkt.is_tcp() && l4.tcp_flags & TCP_RST != 0 {
        return Some(Verdict::drop(DROP_BAD_FLAGS));
    }
    if nat && pkt.is_tcp() && l4.tcp_flags & TCP_SYN == 0 {
        return Some(Verdict::drop(DROP_NO_FLOW));
    }
    None
}

/// Whether the IPv4 header (options included) sums to 0xffff.
#[inline(always)]
fn ipv4_checksum_ok(l3: usize, end: usize) -> bool {
    let Some(ip) = ptr_at::<IPV4_HLEN>(l3, end) else {
        return false;
    };
    let option_words = ((ip.u8::<0>() & 0x0f) as usize).saturating_sub(IPV4_HLEN / 4);
    let mut sum = ip.u32::<0>() as u64
        + ip.u32::<4>() as u64
        + ip.u32::<8>() as u64
        + ip.u32::<12>() as u64
        + ip.u32::<16>() as u64;
    let mut i = 0;
    while i < IPV4_OPTION_WORDS {
        if i >= option_words {
            break;
        }
        let Some(w) = ptr_at::<4>(l3 + IPV4_HLEN + i * 4, end) else {
            return false;
        };
        sum += w.u32::<0>() as u64;
        i += 1;
    }
    fold(sum) == 0xffff
}

/// 0.0.0.0/8, 127.0.0.0/8, 224.0.0.0/4 (multicast) and 255.255.255.255.
#[inline(always)]
fn bad_source_v4(src: u32) -> bool {
    let a = u32::from_be(src);
    let first = a >> 24;
    first == 0 || first == 127 || a >> 28 == 0xe || a == u32::MAX
}

/// `::`, `::1` and ff00::/8 (multicast).
#[inline(always)]
fn bad_source_v6(src: &[u32; 4]) -> bool {
    if u32::from_be(src[0]) >> 24 == 0xff {
        return true;
    }
    src[0] == 0 && src[1] == 0 && src[2] == 0 && (src[3] == 0 || src[3] == 1u32.to_be())
}

/// A segment a client may send to a server: a SYN without FIN, RST or ACK (SYN+ACK is
/// a server's answer), or an ACK or RST on a connection.
#[inline(always)]
fn flags_ok(flags: u8) -> bool {
    if flags & TCP_SYN != 0 {
        return flags & (TCP_FIN | TCP_RST | TCP_ACK) == 0;
    }
    flags & (TCP_ACK | TCP_RST) != 0
}
