//! Builds Ethernet frames (optional 802.1Q tag, IPv4/IPv6, TCP/UDP/ICMP) with correct
//! checksums, for BPF fixtures and benchmarks. Checksums use a plain RFC 1071 sum
//! written here, independent of `lb_common::csum`.

use std::net::IpAddr;

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_8021Q: u16 = 0x8100;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;

/// The transport part of a frame.
#[derive(Clone, Debug)]
pub enum Transport {
    Tcp {
        sport: u16,
        dport: u16,
        flags: u8,
        seq: u32,
        ack: u32,
    },
    Udp {
        sport: u16,
        dport: u16,
        /// IPv4 only: send checksum 0 ("no checksum").
        zero_csum: bool,
    },
    /// ICMP (IPv4) or ICMPv6 message; `rest` is the 4 bytes after the checksum.
    Icmp { ty: u8, code: u8, rest: [u8; 4] },
    /// Any other protocol number, body taken from the payload.
    Other { proto: u8 },
}

/// IPv4-only header knobs.
#[derive(Clone, Debug, Default)]
pub struct Ipv4Opts {
    /// Flags + fragment offset field, host order (e.g. 0x2000 = MF, 0x4000 = DF).
    pub frag: u16,
    /// IPv4 options (padded to a multiple of 4 by the caller).
    pub options: Vec<u8>,
    pub id: u16,
}

/// One Ethernet frame, rendered by [`Frame::bytes`].
#[derive(Clone, Debug)]
pub struct Frame {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    /// 802.1Q VLAN id.
    pub vlan: Option<u16>,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ttl: u8,
    pub v4: Ipv4Opts,
    /// IPv6 next header override (e.g. 44 for a fragment header); the transport is
    /// still rendered after the fixed header.
    pub v6_next_header: Option<u8>,
    pub transport: Transport,
    pub payload: Vec<u8>,
}

impl Frame {
    fn new(src: IpAddr, dst: IpAddr, transport: Transport) -> Self {
        assert_eq!(
            src.is_ipv4(),
            dst.is_ipv4(),
            "src and dst must be one family"
        );
        Frame {
            dst_mac: [0x02, 0, 0, 0, 0, 0x01],
            src_mac: [0x02, 0, 0, 0, 0, 0x02],
            vlan: None,
            src,
            dst,
            ttl: 64,
            v4: Ipv4Opts::default(),
            v6_next_header: None,
            transport,
            payload: Vec::new(),
        }
    }

    pub fn tcp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, flags: u8) -> Self {
        Self::new(
            src,
            dst,
            Transport::Tcp {
                sport,
                dport,
                flags,
                seq: 0x1000_0000,
                ack: if flags & TCP_ACK != 0 { 0x2000_0000 } else { 0 },
            },
        )
    }

    pub fn udp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Self {
        Self::new(
            src,
            dst,
            Transport::Udp {
                sport,
                dport,
                zero_csum: false,
            },
        )
    }

    pub fn icmp(src: IpAddr, dst: IpAddr, ty: u8, code: u8) -> Self {
        Self::new(
            src,
            dst,
            Transport::Icmp {
                ty,
                code,
                rest: [0; 4],
            },
        )
    }

    pub fn other(src: IpAddr, dst: IpAddr, proto: u8) -> Self {
        Self::new(src, dst, Transport::Other { proto })
    }

    pub fn macs(mut self, src: [u8; 6], dst: [u8; 6]) -> Self {
        self.src_mac = src;
        self.dst_mac = dst;
        self
    }

    pub fn vlan(mut self, id: u16) -> Self {
        self.vlan = Some(id);
        self
    }

    pub fn payload(mut self, payload: &[u8]) -> Self {
        self.payload = payload.to_vec();
        self
    }

    pub fn proto(&self) -> u8 {
        match self.transport {
            Transport::Tcp { .. } => IPPROTO_TCP,
            Transport::Udp { .. } => IPPROTO_UDP,
            Transport::Icmp { .. } if self.src.is_ipv4() => IPPROTO_ICMP,
            Transport::Icmp { .. } => IPPROTO_ICMPV6,
            Transport::Other { proto } => proto,
        }
    }

    /// Offset of the IP header in the rendered frame.
    pub fn l3_offset(&self) -> usize {
        14 + if self.vlan.is_some() { 4 } else { 0 }
    }

    /// Offset of the transport header in the rendered frame.
    pub fn l4_offset(&self) -> usize {
        self.l3_offset()
            + match self.src {
                IpAddr::V4(_) => 20 + self.v4.options.len(),
                IpAddr::V6(_) => 40,
            }
    }

    /// The frame's bytes with its TCP/UDP checksum as a sender that offloads it leaves
    /// it (`CHECKSUM_PARTIAL`): the folded pseudo-header sum, not inverted.
    pub fn partial_checksum_bytes(&self) -> Vec<u8> {
        let mut bytes = self.bytes();
        let len = self.l4_bytes().len();
        let field = self.l4_offset() + if self.proto() == IPPROTO_TCP { 16 } else { 6 };
        let sum = fold(pseudo_header_sum(self.src, self.dst, self.proto(), len));
        bytes[field..field + 2].copy_from_slice(&sum.to_be_bytes());
        bytes
    }

    /// The transport header and payload, checksum filled in.
    pub fn l4_bytes(&self) -> Vec<u8> {
        let mut l4 = match &self.transport {
            Transport::Tcp {
                sport,
                dport,
                flags,
                seq,
                ack,
            } => {
                let mut h = Vec::with_capacity(20);
                h.extend_from_slice(&sport.to_be_bytes());
                h.extend_from_slice(&dport.to_be_bytes());
                h.extend_from_slice(&seq.to_be_bytes());
                h.extend_from_slice(&ack.to_be_bytes());
                h.push(5 << 4);
                h.push(*flags);
                h.extend_from_slice(&64240u16.to_be_bytes());
                h.extend_from_slice(&[0, 0, 0, 0]);
                h
            }
            Transport::Udp { sport, dport, .. } => {
                let len = (8 + self.payload.len()) as u16;
                let mut h = Vec::with_capacity(8);
                h.extend_from_slice(&sport.to_be_bytes());
                h.extend_from_slice(&dport.to_be_bytes());
                h.extend_from_slice(&len.to_be_bytes());
                h.extend_from_slice(&[0, 0]);
                h
            }
            Transport::Icmp { ty, code, rest } => {
                let mut h = vec![*ty, *code, 0, 0];
                h.extend_from_slice(rest);
                h
            }
            Transport::Other { .. } => Vec::new(),
        };
        l4.extend_from_slice(&self.payload);
        let proto = self.proto();
        let csum_at = match self.transport {
            Transport::Tcp { .. } => Some(16),
            Transport::Udp { zero_csum, .. } => (!zero_csum || self.src.is_ipv6()).then_some(6),
            Transport::Icmp { .. } => Some(2),
            Transport::Other { .. } => None,
        };
        if let Some(at) = csum_at {
            let mut sum = if proto == IPPROTO_ICMP {
                0
            } else {
                pseudo_header_sum(self.src, self.dst, proto, l4.len())
            };
            sum += sum_words(&l4);
            let mut c = !fold(sum);
            if proto == IPPROTO_UDP && c == 0 {
                c = 0xffff;
            }
            l4[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
        l4
    }

    /// The IP header and everything after it.
    pub fn ip_bytes(&self) -> Vec<u8> {
        let l4 = self.l4_bytes();
        let mut out = Vec::with_capacity(60 + l4.len());
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let opts = &self.v4.options;
                assert_eq!(opts.len() % 4, 0, "IPv4 options must be padded to 4 bytes");
                let hlen = 20 + opts.len();
                out.push(0x40 | (hlen / 4) as u8);
                out.push(0);
                out.extend_from_slice(&((hlen + l4.len()) as u16).to_be_bytes());
                out.extend_from_slice(&self.v4.id.to_be_bytes());
                out.extend_from_slice(&self.v4.frag.to_be_bytes());
                out.push(self.ttl);
                out.push(self.proto());
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&s.octets());
                out.extend_from_slice(&d.octets());
                out.extend_from_slice(opts);
                let c = checksum(&out);
                out[10..12].copy_from_slice(&c.to_be_bytes());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                out.extend_from_slice(&[0x60, 0, 0, 0]);
                out.extend_from_slice(&(l4.len() as u16).to_be_bytes());
                out.push(self.v6_next_header.unwrap_or(self.proto()));
                out.push(self.ttl);
                out.extend_from_slice(&s.octets());
                out.extend_from_slice(&d.octets());
            }
            _ => unreachable!("checked in Frame::new"),
        }
        out.extend_from_slice(&l4);
        out
    }

    /// The whole frame.
    pub fn bytes(&self) -> Vec<u8> {
        let ip = self.ip_bytes();
        let mut out = Vec::with_capacity(18 + ip.len());
        out.extend_from_slice(&self.dst_mac);
        out.extend_from_slice(&self.src_mac);
        if let Some(id) = self.vlan {
            out.extend_from_slice(&ETH_P_8021Q.to_be_bytes());
            out.extend_from_slice(&(id & 0x0fff).to_be_bytes());
        }
        let ethertype = if self.src.is_ipv4() {
            ETH_P_IP
        } else {
            ETH_P_IPV6
        };
        out.extend_from_slice(&ethertype.to_be_bytes());
        out.extend_from_slice(&ip);
        out
    }
}

/// A non-IP frame (e.g. ARP) with an arbitrary body.
pub fn raw_frame(dst_mac: [u8; 6], src_mac: [u8; 6], ethertype: u16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(14 + body.len());
    out.extend_from_slice(&dst_mac);
    out.extend_from_slice(&src_mac);
    out.extend_from_slice(&ethertype.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Sum of big-endian 16-bit words (odd length padded with a zero byte).
pub fn sum_words(data: &[u8]) -> u64 {
    data.chunks(2)
        .map(|c| u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

/// Folds a one's-complement sum to 16 bits.
pub fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// RFC 1071 Internet checksum of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum_words(data))
}

/// Sum of the TCP/UDP/ICMPv6 pseudo-header.
pub fn pseudo_header_sum(src: IpAddr, dst: IpAddr, proto: u8, len: usize) -> u64 {
    let mut bytes = Vec::with_capacity(40);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            bytes.extend_from_slice(&s.octets());
            bytes.extend_from_slice(&d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            bytes.extend_from_slice(&s.octets());
            bytes.extend_from_slice(&d.octets());
        }
        _ => panic!("pseudo header over mixed families"),
    }
    sum_words(&bytes) + u64::from(proto) + len as u64
}
