//! Header parsing: Ethernet (+ one 802.1Q/802.1AD tag), IPv4/IPv6, then TCP/UDP ports or ICMP.
//!
//! Rules (each outcome is one `lb_common::counters` index; docs/packet-rules.md has the
//! whole table):
//! - Ethernet or VLAN header truncated, IP header truncated, wrong IP version, IPv4
//!   IHL < 5, options past the end of the frame, or a total length shorter than the
//!   header: `PASS_MALFORMED`;
//! - not IPv4/IPv6 (after at most one VLAN tag): `PASS_NOT_IP`;
//! - IPv4 fragment (MF set or offset != 0): `PASS_FRAGMENT`;
//! - IPv4 protocol or IPv6 next header other than TCP/UDP/ICMP(v6) (so every IPv6
//!   extension header, fragments included): `PASS_UNSUPPORTED_L4`;
//! - TCP/UDP/ICMP whose destination MAC is a group address, or not the interface's
//!   (when `LB_CONFIG` holds one): `PASS_NOT_FOR_HOST`;
//! - TCP/UDP whose ports are cut off: `PASS_MALFORMED` (no VIP can be recognised).
//!
//! The lengths the IP header claims are kept in the [`Packet`]: [`Packet::l4`] checks
//! them, and the rest of the TCP/UDP header, once the caller knows whether the packet is
//! for a VIP (invalid: drop) or not (invalid: pass). Bytes after the IP total length are
//! Ethernet padding: ignored, never read as L4.

use aya_ebpf::programs::XdpContext;
use lb_common::{
    FAMILY_V4, FAMILY_V6, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP,
    counters::{
        PASS_FRAGMENT, PASS_MALFORMED, PASS_NOT_FOR_HOST, PASS_NOT_IP, PASS_UNSUPPORTED_L4,
    },
    maps::{DataplaneConfig, FlowKey},
};

use crate::{
    maps::LB_CONFIG,
    pkt::{Hdr, ptr_at},
};

pub const ETH_HLEN: usize = 14;
pub const VLAN_HLEN: usize = 4;
pub const IPV4_HLEN: usize = 20;
pub const IPV6_HLEN: usize = 40;
pub const TCP_HLEN: usize = 20;
pub const UDP_HLEN: usize = 8;
pub const ICMP_HLEN: usize = 8;

// EtherTypes as loaded natively from the wire.
const ETH_P_IP: u16 = 0x0800u16.to_be();
const ETH_P_IPV6: u16 = 0x86ddu16.to_be();
const ETH_P_8021Q: u16 = 0x8100u16.to_be();
const ETH_P_8021AD: u16 = 0x88a8u16.to_be();
/// IPv4 flags+fragment offset: MF bit and the 13-bit offset.
const IPV4_FRAG_MASK: u16 = 0x3fffu16.to_be();

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// Ethernet header fields.
pub const ETH_DST: usize = 0;
pub const ETH_SRC: usize = 6;

/// A TCP or UDP packet whose 5-tuple is known.
pub struct Packet {
    pub eth: Hdr<ETH_HLEN>,
    /// Address of the IPv4 or IPv6 header, per `key.family` (re-check before use).
    pub l3: usize,
    /// The first four bytes of the TCP/UDP header: source and destination port.
    pub ports: Hdr<4>,
    /// The 5-tuple as on the wire.
    pub key: FlowKey,
    /// Frame length in bytes (for byte counters).
    pub len: u32,
    /// Length of the TCP/UDP segment as the IP header states it (IPv4 total length
    /// minus header length, IPv6 payload length); may exceed `l4_room` (checked by
    /// [`Packet::l4`]).
    pub l4_len: u32,
    /// Bytes of the frame from the TCP/UDP header to the frame's end.
    pub l4_room: u32,
    /// IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
}

/// The complete TCP/UDP header of a [`Packet`].
#[derive(Clone, Copy)]
pub struct L4 {
    /// The checksum field.
    pub csum: Hdr<2>,
    /// TCP flags (0 for UDP).
    pub tcp_flags: u8,
}

/// An ICMP (IPv4) or ICMPv6 message.
pub struct Icmp {
    pub eth: Hdr<ETH_HLEN>,
    /// Address of the outer IPv4 or IPv6 header, per `family` (re-check before use).
    pub l3: usize,
    /// Address of the ICMP header (not yet bounds-checked).
    pub l4: usize,
    pub family: u8,
    /// Destination of the outer IP header.
    pub dst: [u32; 4],
}

/// The packet quoted in an ICMP error: read by `icmp`, rewritten by `icmp_nat`.
pub struct Quote {
    /// Address of the quoted IP header.
    pub ip: usize,
    /// Address of the quoted TCP/UDP header (its ports are bounds-checked).
    pub l4: usize,
    /// Bytes of the quoted TCP/UDP header inside the ICMP message (at least 4; the
    /// frame may carry padding after the message, which is not part of it).
    pub l4_len: usize,
    /// The quoted 5-tuple reversed (`key.src` is the quoted destination): the key of
    /// the answer to the quoted packet, which is how `LB_NAT` (backend side) and
    /// `LB_FLOWS` (client side) know the flow. One key for both keeps the stack small.
    pub key: FlowKey,
}

pub enum Parsed {
    Flow(Packet),
    Icmp(Icmp),
    /// Pass untouched, counting this outcome.
    Pass(u32),
}

/// What the IP header says about the packet, handed to [`transport`].
struct Ip {
    l3: usize,
    l4: usize,
    proto: u8,
    family: u8,
    ttl: u8,
    src: [u32; 4],
    dst: [u32; 4],
    l4_len: u32,
    l4_room: u32,
}

/// Parses the frame up to the L4 ports (or the ICMP header's address).
#[inline(always)]
pub fn parse(ctx: &XdpContext) -> Parsed {
    let data = ctx.data();
    let end = ctx.data_end();
    let Some(eth) = ptr_at::<ETH_HLEN>(data, end) else {
        return Parsed::Pass(PASS_MALFORMED);
    };
    let mut proto = eth.u16::<12>();
    let mut l3_off = ETH_HLEN as u32;
    if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
        let Some(tag) = ptr_at::<VLAN_HLEN>(data + ETH_HLEN, end) else {
            return Parsed::Pass(PASS_MALFORMED);
        };
        proto = tag.u16::<2>();
        l3_off += VLAN_HLEN as u32;
    }
    let l3 = data + l3_off as usize;
    let len = (end - data) as u32;
    let ip = if proto == ETH_P_IP {
        let Some(ip) = ptr_at::<IPV4_HLEN>(l3, end) else {
            return Parsed::Pass(PASS_MALFORMED);
        };
        let vihl = ip.u8::<0>();
        let hlen = ((vihl & 0x0f) as u32) * 4;
        let total = u16::from_be(ip.u16::<2>()) as u32;
        if vihl >> 4 != 4 || hlen < IPV4_HLEN as u32 || total < hlen {
            return Parsed::Pass(PASS_MALFORMED);
        }
        let l4 = l3 + hlen as usize;
        if l4 > end {
            return Parsed::Pass(PASS_MALFORMED);
        }
        if ip.u16::<6>() & IPV4_FRAG_MASK != 0 {
            return Parsed::Pass(PASS_FRAGMENT);
        }
        Ip {
            l3,
            l4,
            proto: ip.u8::<9>(),
            family: FAMILY_V4,
            ttl: ip.u8::<8>(),
            src: [ip.u32::<12>(), 0, 0, 0],
            dst: [ip.u32::<16>(), 0, 0, 0],
            l4_len: total - hlen,
            l4_room: len - l3_off - hlen,
        }
    } else if proto == ETH_P_IPV6 {
        let Some(ip) = ptr_at::<IPV6_HLEN>(l3, end) else {
            return Parsed::Pass(PASS_MALFORMED);
        };
        if ip.u8::<0>() >> 4 != 6 {
            return Parsed::Pass(PASS_MALFORMED);
        }
        Ip {
            l3,
            l4: l3 + IPV6_HLEN,
            proto: ip.u8::<6>(),
            family: FAMILY_V6,
            ttl: ip.u8::<7>(),
            src: ip.words4::<8>(),
            dst: ip.words4::<24>(),
            l4_len: u16::from_be(ip.u16::<4>()) as u32,
            l4_room: len - l3_off - IPV6_HLEN as u32,
        }
    } else {
        return Parsed::Pass(PASS_NOT_IP);
    };
    transport(eth, ip, end, len)
}

#[inline(always)]
fn transport(eth: Hdr<ETH_HLEN>, ip: Ip, end: usize, len: u32) -> Parsed {
    let flow = ip.proto == IPPROTO_TCP || ip.proto == IPPROTO_UDP;
    let icmp = (ip.family == FAMILY_V4 && ip.proto == IPPROTO_ICMP)
        || (ip.family == FAMILY_V6 && ip.proto == IPPROTO_ICMPV6);
    if !flow && !icmp {
        return Parsed::Pass(PASS_UNSUPPORTED_L4);
    }
    if !for_this_host(eth) {
        return Parsed::Pass(PASS_NOT_FOR_HOST);
    }
    if icmp {
        return Parsed::Icmp(Icmp {
            eth,
            l3: ip.l3,
            l4: ip.l4,
            family: ip.family,
            dst: ip.dst,
        });
    }
    let Some(ports) = ptr_at::<4>(ip.l4, end) else {
        return Parsed::Pass(PASS_MALFORMED);
    };
    let key = FlowKey {
        src: ip.src,
        dst: ip.dst,
        sport: ports.u16::<0>(),
        dport: ports.u16::<2>(),
        proto: ip.proto,
        family: ip.family,
        _pad: [0; 2],
    };
    Parsed::Flow(Packet {
        eth,
        l3: ip.l3,
        ports,
        key,
        len,
        l4_len: ip.l4_len,
        l4_room: ip.l4_room,
        ttl: ip.ttl,
    })
}

/// Whether the frame is addressed to the interface: never for a group (broadcast or
/// multicast) destination; otherwise the MAC in `LB_CONFIG` must match, unless it is all
/// zero (not configured). Compared as a 32-bit and a 16-bit word.
#[inline(always)]
fn for_this_host(eth: Hdr<ETH_HLEN>) -> bool {
    if eth.u8::<ETH_DST>() & 1 != 0 {
        return false;
    }
    let Some(cfg) = LB_CONFIG.get(0) else {
        return true;
    };
    let at = (cfg as *const DataplaneConfig).cast::<u8>();
    // SAFETY: `mac` is the first field of a 4-aligned map value: bytes 0..4 and 4..6
    // are an aligned u32 and u16 inside it.
    let (hi, lo) = unsafe { (*at.cast::<u32>(), *at.add(4).cast::<u16>()) };
    (hi == 0 && lo == 0) || (eth.u32::<ETH_DST>() == hi && eth.u16::<4>() == lo)
}

impl Packet {
    /// Checks the TCP/UDP header against the lengths the IP header states: the IP
    /// packet must fit in the frame; TCP: 20 bytes, data offset >= 5 and within the
    /// segment; UDP: 8 bytes and a length field equal to the segment's length.
    #[inline(always)]
    pub fn l4(&self, end: usize) -> Option<L4> {
        if self.l4_len > self.l4_room {
            return None;
        }
        let at = self.ports.addr();
        if self.key.proto == IPPROTO_TCP {
            if self.l4_len < TCP_HLEN as u32 {
                return None;
            }
            let tcp = ptr_at::<TCP_HLEN>(at, end)?;
            let doff = (tcp.u8::<12>() >> 4) as u32;
            if doff < 5 || doff * 4 > self.l4_len {
                return None;
            }
            // SAFETY: bytes 16..18 lie inside the checked 20-byte header.
            let csum = unsafe { Hdr::<2>::assume(tcp.raw().add(16)) };
            Some(L4 {
                csum,
                tcp_flags: tcp.u8::<13>(),
            })
        } else {
            if self.l4_len < UDP_HLEN as u32 {
                return None;
            }
            let udp = ptr_at::<UDP_HLEN>(at, end)?;
            if u16::from_be(udp.u16::<4>()) as u32 != self.l4_len {
                return None;
            }
            // SAFETY: bytes 6..8 lie inside the checked 8-byte header.
            let csum = unsafe { Hdr::<2>::assume(udp.raw().add(6)) };
            Some(L4 { csum, tcp_flags: 0 })
        }
    }

    /// TCP: the segment's sequence number as on the wire (a SYN's is its connection's
    /// ISN). Read afresh, with its own bounds check, where it is needed (a value carried
    /// from parsing would be one more live value across the whole path: BPF stack is
    /// scarce); 0 if the frame is cut before it (never for a header [`Packet::l4`]
    /// admitted).
    #[inline(always)]
    pub fn tcp_seq(&self, end: usize) -> u32 {
        match ptr_at::<8>(self.ports.addr(), end) {
            Some(h) => h.u32::<4>(),
            None => 0,
        }
    }

    #[inline(always)]
    pub fn is_tcp(&self) -> bool {
        self.key.proto == IPPROTO_TCP
    }
}

/// A SYN without ACK: the client opening a connection.
#[inline(always)]
pub fn is_syn(flags: u8) -> bool {
    flags & (TCP_SYN | TCP_ACK) == TCP_SYN
}
