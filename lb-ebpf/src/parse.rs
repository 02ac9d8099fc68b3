//! Header parsing: Ethernet (+ one 802.1Q/802.1AD tag), IPv4/IPv6, then TCP/UDP ports or ICMP.
//!
//! Rules (each outcome is one `lb_common::counters` index):
//! - Ethernet or VLAN header truncated, IP header truncated, wrong IP version, IPv4
//!   IHL < 5 or options past the end of the frame: `PASS_MALFORMED`;
//! - not IPv4/IPv6 (after at most one VLAN tag): `PASS_NOT_IP`;
//! - IPv4 fragment (MF set or offset != 0): `PASS_FRAGMENT`;
//! - IPv4 protocol or IPv6 next header other than TCP/UDP/ICMP(v6) (so every IPv6
//!   extension header, fragments included): `PASS_UNSUPPORTED_L4`;
//! - TCP/UDP whose ports are cut off: `PASS_MALFORMED` (no VIP can be recognised).
//!
//! The rest of the TCP/UDP header is checked by [`Packet::l4`] once the caller knows
//! whether the packet is for a VIP (truncated: drop) or not (truncated: pass).

use aya_ebpf::programs::XdpContext;
use lb_common::{
    FAMILY_V4, FAMILY_V6, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP,
    counters::{PASS_FRAGMENT, PASS_MALFORMED, PASS_NOT_IP, PASS_UNSUPPORTED_L4},
    maps::FlowKey,
};

use crate::pkt::{Hdr, ptr_at};

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

pub enum Parsed {
    Flow(Packet),
    Icmp(Icmp),
    /// Pass untouched, counting this outcome.
    Pass(u32),
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
    let mut l3 = data + ETH_HLEN;
    if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
        let Some(tag) = ptr_at::<VLAN_HLEN>(l3, end) else {
            return Parsed::Pass(PASS_MALFORMED);
        };
        proto = tag.u16::<2>();
        l3 += VLAN_HLEN;
    }
    let len = (end - data) as u32;
    if proto == ETH_P_IP {
        let Some(ip) = ptr_at::<IPV4_HLEN>(l3, end) else {
            return Parsed::Pass(PASS_MALFORMED);
        };
        let vihl = ip.u8::<0>();
        let ihl = (vihl & 0x0f) as usize;
        if vihl >> 4 != 4 || ihl < 5 {
            return Parsed::Pass(PASS_MALFORMED);
        }
        let l4 = l3 + ihl * 4;
        if l4 > end {
            return Parsed::Pass(PASS_MALFORMED);
        }
        if ip.u16::<6>() & IPV4_FRAG_MASK != 0 {
            return Parsed::Pass(PASS_FRAGMENT);
        }
        let src = [ip.u32::<12>(), 0, 0, 0];
        let dst = [ip.u32::<16>(), 0, 0, 0];
        transport(eth, l3, l4, end, ip.u8::<9>(), FAMILY_V4, src, dst, len)
    } else if proto == ETH_P_IPV6 {
        let Some(ip) = ptr_at::<IPV6_HLEN>(l3, end) else {
            return Parsed::Pass(PASS_MALFORMED);
        };
        if ip.u8::<0>() >> 4 != 6 {
            return Parsed::Pass(PASS_MALFORMED);
        }
        let src = ip.words4::<8>();
        let dst = ip.words4::<24>();
        transport(
            eth,
            l3,
            l3 + IPV6_HLEN,
            end,
            ip.u8::<6>(),
            FAMILY_V6,
            src,
            dst,
            len,
        )
    } else {
        Parsed::Pass(PASS_NOT_IP)
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn transport(
    eth: Hdr<ETH_HLEN>,
    l3: usize,
    l4: usize,
    end: usize,
    proto: u8,
    family: u8,
    src: [u32; 4],
    dst: [u32; 4],
    len: u32,
) -> Parsed {
    if proto == IPPROTO_TCP || proto == IPPROTO_UDP {
        let Some(ports) = ptr_at::<4>(l4, end) else {
            return Parsed::Pass(PASS_MALFORMED);
        };
        let key = FlowKey {
            src,
            dst,
            sport: ports.u16::<0>(),
            dport: ports.u16::<2>(),
            proto,
            family,
            _pad: [0; 2],
        };
        Parsed::Flow(Packet {
            eth,
            l3,
            ports,
            key,
            len,
        })
    } else if (family == FAMILY_V4 && proto == IPPROTO_ICMP)
        || (family == FAMILY_V6 && proto == IPPROTO_ICMPV6)
    {
        Parsed::Icmp(Icmp {
            eth,
            l3,
            l4,
            family,
            dst,
        })
    } else {
        Parsed::Pass(PASS_UNSUPPORTED_L4)
    }
}

impl Packet {
    /// Checks the complete TCP (20 bytes, data offset >= 5) or UDP (8 bytes) header.
    #[inline(always)]
    pub fn l4(&self, end: usize) -> Option<L4> {
        let at = self.ports.addr();
        if self.key.proto == IPPROTO_TCP {
            let tcp = ptr_at::<TCP_HLEN>(at, end)?;
            if tcp.u8::<12>() >> 4 < 5 {
                return None;
            }
            // SAFETY: bytes 16..18 lie inside the checked 20-byte header.
            let csum = unsafe { Hdr::<2>::assume(tcp.raw().add(16)) };
            Some(L4 {
                csum,
                tcp_flags: tcp.u8::<13>(),
            })
        } else {
            let udp = ptr_at::<UDP_HLEN>(at, end)?;
            // SAFETY: bytes 6..8 lie inside the checked 8-byte header.
            let csum = unsafe { Hdr::<2>::assume(udp.raw().add(6)) };
            Some(L4 { csum, tcp_flags: 0 })
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
