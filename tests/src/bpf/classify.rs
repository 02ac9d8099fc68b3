//! A reference classifier in plain Rust: given a frame and a [`World`] (dsr services,
//! the interface MAC, the flows pinned so far), predicts `lb_xdp`'s action and outcome
//! counter for the parse-level outcomes and a dsr forward (docs/packet-rules.md).
//!
//! Written from the rules, not from the program: each stage below is one row group of
//! the table, in the program's order. The fuzz target ([`crate::bpf::fuzz`]) compares every
//! prediction with BPF_PROG_TEST_RUN. To cover a new rule, add a stage (and, if it
//! needs state, a field of [`World`] or [`Flows`]).

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use lb_common::counters::{
    DROP_BAD_FLAGS, DROP_BAD_SOURCE, DROP_MALFORMED, DROP_NO_BACKEND, PASS_FRAGMENT,
    PASS_MALFORMED, PASS_NOT_FOR_HOST, PASS_NOT_IP, PASS_NOT_VIP, PASS_TTL_EXPIRED,
    PASS_UNSUPPORTED_L4, TX_DSR,
};

use crate::{
    bpf::object::{XDP_DROP, XDP_PASS, XDP_TX},
    traffic::packet::{
        ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP,
        TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, checksum,
    },
};

pub const ETH_P_8021AD: u16 = 0x88a8;

/// An action and the one outcome counter it increments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub action: u32,
    pub counter: u32,
}

impl Verdict {
    pub fn pass(counter: u32) -> Self {
        Self {
            action: XDP_PASS,
            counter,
        }
    }
    pub fn drop(counter: u32) -> Self {
        Self {
            action: XDP_DROP,
            counter,
        }
    }
    pub fn tx(counter: u32) -> Self {
        Self {
            action: XDP_TX,
            counter,
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}",
            crate::bpf::object::action_name(self.action),
            lb_common::counters::NAMES[self.counter as usize]
        )
    }
}

/// One dsr service: `backend` is the MAC every Maglev slot leads to, `None` for a
/// service without a published table.
#[derive(Clone, Debug)]
pub struct Service {
    pub vip: IpAddr,
    pub port: u16,
    pub proto: u8,
    pub backend: Option<[u8; 6]>,
}

/// What the program was configured with.
#[derive(Clone, Debug)]
pub struct World {
    /// `LB_CONFIG`'s MAC (all zero: not configured).
    pub mac: [u8; 6],
    pub services: Vec<Service>,
}

/// 5-tuples pinned in the flow table: (src, sport, dst, dport, proto).
pub type FlowTuple = (IpAddr, u16, IpAddr, u16, u8);

/// The flows a run has pinned so far (every dsr forward pins its 5-tuple).
#[derive(Default, Debug)]
pub struct Flows(pub HashSet<FlowTuple>);

/// The IP-level facts the later stages need.
struct Ip {
    v4: bool,
    l3: usize,
    l4: usize,
    proto: u8,
    ttl: u8,
    src: IpAddr,
    dst: IpAddr,
    /// Segment length the IP header claims.
    l4_len: usize,
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

impl World {
    fn service(&self, dst: IpAddr, port: u16, proto: u8) -> Option<&Service> {
        self.services
            .iter()
            .find(|s| s.vip == dst && s.port == port && s.proto == proto)
    }

    /// Predicts the verdict for `frame`; a dsr forward pins its flow in `flows`.
    pub fn classify(&self, frame: &[u8], flows: &mut Flows) -> Verdict {
        let ip = match ip_layer(frame) {
            Ok(ip) => ip,
            Err(v) => return v,
        };
        let flow = ip.proto == IPPROTO_TCP || ip.proto == IPPROTO_UDP;
        let icmp = (ip.v4 && ip.proto == IPPROTO_ICMP) || (!ip.v4 && ip.proto == IPPROTO_ICMPV6);
        if !flow && !icmp {
            return Verdict::pass(PASS_UNSUPPORTED_L4);
        }
        if !self.for_this_host(frame) {
            return Verdict::pass(PASS_NOT_FOR_HOST);
        }
        if icmp {
            // ICMP is only inspected (nat flows' errors); this world has no nat flows.
            return Verdict::pass(PASS_NOT_VIP);
        }
        if frame.len() < ip.l4 + 4 {
            return Verdict::pass(PASS_MALFORMED);
        }
        let (sport, dport) = (be16(frame, ip.l4), be16(frame, ip.l4 + 2));
        let l4_ok = l4_header_ok(frame, &ip);
        let Some(svc) = self.service(ip.dst, dport, ip.proto) else {
            // Not a VIP: the nat reply path checks the same lengths; no nat entries here.
            return Verdict::pass(if l4_ok { PASS_NOT_VIP } else { PASS_MALFORMED });
        };
        if let Some(refused) = vip_checks(frame, &ip, l4_ok) {
            return refused;
        }
        let tuple = (ip.src, sport, ip.dst, dport, ip.proto);
        if !flows.0.contains(&tuple)
            && let Some(refused) = opening_checks(frame, &ip)
        {
            return refused;
        }
        if svc.backend.is_none() {
            return Verdict::drop(DROP_NO_BACKEND);
        }
        flows.0.insert(tuple);
        Verdict::tx(TX_DSR)
    }

    /// Not for a group address; the configured MAC, if there is one.
    fn for_this_host(&self, frame: &[u8]) -> bool {
        if frame[0] & 1 != 0 {
            return false;
        }
        self.mac == [0; 6] || frame[..6] == self.mac
    }

    /// The dsr output for a forwarded `frame` to service `dst:dport/proto`.
    pub fn dsr_output(&self, frame: &[u8]) -> Option<Vec<u8>> {
        let ip = ip_layer(frame).ok()?;
        let svc = self.service(ip.dst, be16(frame, ip.l4 + 2), ip.proto)?;
        let mut out = frame.to_vec();
        out[6..12].copy_from_slice(&frame[..6]);
        out[..6].copy_from_slice(&svc.backend?);
        Some(out)
    }
}

/// Ethernet, one optional VLAN tag, the IPv4/IPv6 header.
fn ip_layer(f: &[u8]) -> Result<Ip, Verdict> {
    let malformed = Err(Verdict::pass(PASS_MALFORMED));
    if f.len() < 14 {
        return malformed;
    }
    let mut ethertype = be16(f, 12);
    let mut l3 = 14;
    if ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        if f.len() < 18 {
            return malformed;
        }
        ethertype = be16(f, 16);
        l3 = 18;
    }
    if ethertype == ETH_P_IP {
        if f.len() < l3 + 20 {
            return malformed;
        }
        let hlen = usize::from(f[l3] & 0x0f) * 4;
        let total = usize::from(be16(f, l3 + 2));
        if f[l3] >> 4 != 4 || hlen < 20 || total < hlen || l3 + hlen > f.len() {
            return malformed;
        }
        if be16(f, l3 + 6) & 0x3fff != 0 {
            return Err(Verdict::pass(PASS_FRAGMENT));
        }
        let a = |at: usize| IpAddr::V4(Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3]));
        Ok(Ip {
            v4: true,
            l3,
            l4: l3 + hlen,
            proto: f[l3 + 9],
            ttl: f[l3 + 8],
            src: a(l3 + 12),
            dst: a(l3 + 16),
            l4_len: total - hlen,
        })
    } else if ethertype == ETH_P_IPV6 {
        if f.len() < l3 + 40 {
            return malformed;
        }
        if f[l3] >> 4 != 6 {
            return malformed;
        }
        let a = |at: usize| {
            let o: [u8; 16] = f[at..at + 16].try_into().expect("16 bytes");
            IpAddr::V6(Ipv6Addr::from(o))
        };
        Ok(Ip {
            v4: false,
            l3,
            l4: l3 + 40,
            proto: f[l3 + 6],
            ttl: f[l3 + 7],
            src: a(l3 + 8),
            dst: a(l3 + 24),
            l4_len: usize::from(be16(f, l3 + 4)),
        })
    } else {
        Err(Verdict::pass(PASS_NOT_IP))
    }
}

/// The IP packet fits the frame; TCP: data offset in 5..=segment/4; UDP: length field
/// equals the segment.
fn l4_header_ok(f: &[u8], ip: &Ip) -> bool {
    if ip.l4 + ip.l4_len > f.len() {
        return false;
    }
    if ip.proto == IPPROTO_TCP {
        ip.l4_len >= 20 && {
            let doff = usize::from(f[ip.l4 + 12] >> 4) * 4;
            doff >= 20 && doff <= ip.l4_len
        }
    } else {
        ip.l4_len >= 8 && usize::from(be16(f, ip.l4 + 4)) == ip.l4_len
    }
}

/// The checks of every VIP packet, in order.
fn vip_checks(f: &[u8], ip: &Ip, l4_ok: bool) -> Option<Verdict> {
    if !l4_ok {
        return Some(Verdict::drop(DROP_MALFORMED));
    }
    if ip.ttl <= 1 {
        return Some(Verdict::pass(PASS_TTL_EXPIRED));
    }
    if ip.proto == IPPROTO_TCP && !tcp_flags_ok(f[ip.l4 + 13]) {
        return Some(Verdict::drop(DROP_BAD_FLAGS));
    }
    None
}

/// The checks before a packet without a pinned flow opens one: a source that cannot be
/// a client, the IPv4 header checksum, then "an RST opens nothing".
fn opening_checks(f: &[u8], ip: &Ip) -> Option<Verdict> {
    if bad_source(ip.src) || ip.src == ip.dst {
        return Some(Verdict::drop(DROP_BAD_SOURCE));
    }
    if ip.v4 {
        let hlen = usize::from(f[ip.l3] & 0x0f) * 4;
        if checksum(&f[ip.l3..ip.l3 + hlen]) != 0 {
            return Some(Verdict::drop(DROP_MALFORMED));
        }
    }
    if ip.proto == IPPROTO_TCP && f[ip.l4 + 13] & TCP_RST != 0 {
        return Some(Verdict::drop(DROP_BAD_FLAGS));
    }
    None
}

/// Sources no client can have: this network (0/8), loopback, multicast, limited
/// broadcast; `::`, `::1`, ff00::/8.
pub fn bad_source(src: IpAddr) -> bool {
    match src {
        IpAddr::V4(a) => {
            let o = a.octets();
            o[0] == 0 || a.is_loopback() || a.is_multicast() || a.is_broadcast()
        }
        IpAddr::V6(a) => a.is_unspecified() || a.is_loopback() || a.is_multicast(),
    }
}

/// A SYN alone (no FIN/RST/ACK), or a segment with ACK or RST.
pub fn tcp_flags_ok(flags: u8) -> bool {
    if flags & TCP_SYN != 0 {
        flags & (TCP_FIN | TCP_RST | TCP_ACK) == 0
    } else {
        flags & (TCP_ACK | TCP_RST) != 0
    }
}
