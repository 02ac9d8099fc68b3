//! ICMP/ICMPv6 errors about nat flows: whether one is believed as a passive signal about
//! a backend, and whether it is translated to the other side of the flow ([`icmp_nat`]).
//!
//! Errors handled: IPv4 destination unreachable (3, every code; 4 = fragmentation
//! needed) and time exceeded (11); ICMPv6 destination unreachable (1), packet too big
//! (2) and time exceeded (3). The quoted packet must be TCP/UDP sent from the outer
//! destination (the error is about a packet that left from this address):
//! - quoted `snat:nat_port -> backend:port`, found in `LB_NAT`: backend side. Translated
//!   to the client (about `client:cport -> VIP:vport`, from the VIP);
//! - quoted `VIP:vport -> client:cport` of a nat service with a pinned flow whose
//!   reverse entry is still its own: client side. Translated to the backend (about
//!   `backend:port -> snat:nat_port`, from the snat address);
//! - anything else (dsr services, host traffic) is passed as before (`PASS_NOT_VIP`).
//!
//! Path errors (fragmentation needed, packet too big, time exceeded) are translated
//! from anyone: PMTU discovery must work, and their worst effect is a smaller MTU or a
//! soft error. Other destination unreachables are fatal to a connection in most stacks,
//! so they are translated only when the frame comes from the flow's side of the
//! segment (backend side: the backend's MAC in `LB_BACKENDS`, the backend or its next
//! hop; client side: the NAT entry's client MAC, the client's previous hop), and port
//! or protocol unreachables (only ever sent by the quoted packet's destination host)
//! only when they also come from that host's address. The others are passed and
//! counted `ICMP_IGNORED`.
//!
//! Passive signal (`EVENT_ICMP_UNREACH`, once per flow): a destination unreachable other
//! than fragmentation needed, on the backend side, believed only when
//! - the outer source is the flow's backend: its address, and the frame comes from the
//!   MAC lb sends that backend's packets to;
//! - the reverse entry belongs to a pinned flow on that backend with that nat port;
//! - TCP: the flow still waits for its handshake (`FLOW_F_SYN_PENDING`, and
//!   `NAT_H_PENDING` in the reverse entry) and the quoted
//!   segment is that SYN. An unreachable about an established connection says little
//!   about the server (RFC 1122 makes it a soft error) and is what a forger would send.
//!
//! Every other destination unreachable about a nat flow is counted `ICMP_IGNORED`
//! (side counter); it is still translated when it passes the rules above.
//! docs/passive-signals.md has the threat model, docs/icmp-nat.md the translation rules.

use aya_ebpf::bindings::xdp_action::XDP_TX;
use lb_common::{
    FAMILY_V4, IPPROTO_TCP, IPPROTO_UDP,
    counters::{ICMP_IGNORED, PASS_NOT_VIP, TX_ICMP_NAT},
    events::EVENT_ICMP_UNREACH,
    maps::{
        FLOW_F_REPORTED, FLOW_F_SYN_PENDING, FlowKey, FlowValue, NAT_H_PENDING, NAT_H_REPORTED,
        NatValue, SERVICE_F_NAT, ServiceMeta, VipKey,
    },
};

use crate::{
    Verdict,
    counters::count,
    events, flow,
    icmp_nat::{self, Target},
    nat::client_key,
    parse::{
        ETH_SRC, ICMP_HLEN, IPV4_HLEN, IPV6_HLEN, Icmp, Quote, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN,
    },
    pkt::ptr_at,
    rewrite::retarget_l2,
    vip,
};

const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PROT_UNREACH: u8 = 2;
const ICMP_PORT_UNREACH: u8 = 3;
const ICMP_FRAG_NEEDED: u8 = 4;
const ICMPV6_DEST_UNREACH: u8 = 1;
const ICMPV6_PKT_TOOBIG: u8 = 2;
const ICMPV6_TIME_EXCEED: u8 = 3;
const ICMPV6_PORT_UNREACH: u8 = 4;

/// IPv4 fragment offset (without the flags): a quoted non-first fragment has no ports.
const IPV4_FRAG_OFFSET: u16 = 0x1fffu16.to_be();
/// Quoted TCP bytes needed to see the flags.
const TCP_FLAGS_END: usize = 14;

/// What an ICMP error may mean, by type and code.
#[derive(Clone, Copy)]
struct Kind {
    /// Destination unreachable other than fragmentation needed: says the destination
    /// failed, so a candidate passive signal.
    unreachable: bool,
    /// Only the quoted packet's destination host sends it (port or protocol unreachable).
    end_host: bool,
}

/// Handles one ICMP message: translates an error about a nat flow (noting a believed
/// passive signal on the way), passes everything else.
#[inline(always)]
pub fn handle(icmp: &Icmp, end: usize) -> Verdict {
    let Some(hdr) = ptr_at::<ICMP_HLEN>(icmp.l4, end) else {
        return Verdict::pass(PASS_NOT_VIP);
    };
    let Some(kind) = classify(icmp.family, hdr.u8::<0>(), hdr.u8::<1>()) else {
        return Verdict::pass(PASS_NOT_VIP);
    };
    let Some(q) = quote(icmp, end) else {
        return Verdict::pass(PASS_NOT_VIP);
    };
    if !same_addr(&q.key.dst, &icmp.dst, icmp.family) {
        return Verdict::pass(PASS_NOT_VIP);
    }
    if let Some(nat) = crate::nat::entry(&q.key) {
        return backend_side(icmp, kind, &q, nat, end);
    }
    let vip = VipKey {
        addr: q.key.dst,
        port: q.key.dport,
        proto: q.key.proto,
        family: q.key.family,
    };
    match vip::service(&vip) {
        Some(svc) if svc.flags & SERVICE_F_NAT != 0 => client_side(icmp, kind, &q, svc, end),
        // dsr: the backend answers the client directly, so lb never carries the
        // packets an error could be about in that direction; nothing to translate.
        _ => Verdict::pass(PASS_NOT_VIP),
    }
}

#[inline(always)]
fn classify(family: u8, ty: u8, code: u8) -> Option<Kind> {
    let path = Kind {
        unreachable: false,
        end_host: false,
    };
    if family == FAMILY_V4 {
        match ty {
            ICMP_DEST_UNREACH => Some(Kind {
                unreachable: code != ICMP_FRAG_NEEDED,
                end_host: code == ICMP_PORT_UNREACH || code == ICMP_PROT_UNREACH,
            }),
            ICMP_TIME_EXCEEDED => Some(path),
            _ => None,
        }
    } else {
        match ty {
            ICMPV6_DEST_UNREACH => Some(Kind {
                unreachable: true,
                end_host: code == ICMPV6_PORT_UNREACH,
            }),
            ICMPV6_PKT_TOOBIG | ICMPV6_TIME_EXCEED => Some(path),
            _ => None,
        }
    }
}

/// The quoted TCP/UDP packet, if the message quotes one (first fragment, ports inside
/// the message).
#[inline(always)]
fn quote(icmp: &Icmp, end: usize) -> Option<Quote> {
    let msg_len = message_len(icmp, end)?;
    let inner = icmp.l4 + ICMP_HLEN;
    let (src, dst, proto, hlen) = if icmp.family == FAMILY_V4 {
        let ip = ptr_at::<IPV4_HLEN>(inner, end)?;
        let vihl = ip.u8::<0>();
        let ihl = (vihl & 0x0f) as usize;
        if vihl >> 4 != 4 || ihl < 5 || ip.u16::<6>() & IPV4_FRAG_OFFSET != 0 {
            return None;
        }
        (
            [ip.u32::<12>(), 0, 0, 0],
            [ip.u32::<16>(), 0, 0, 0],
            ip.u8::<9>(),
            ihl * 4,
        )
    } else {
        let ip = ptr_at::<IPV6_HLEN>(inner, end)?;
        if ip.u8::<0>() >> 4 != 6 {
            return None;
        }
        (ip.words4::<8>(), ip.words4::<24>(), ip.u8::<6>(), IPV6_HLEN)
    };
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return None;
    }
    let l4_off = ICMP_HLEN + hlen;
    if l4_off + 4 > msg_len {
        return None;
    }
    let ports = ptr_at::<4>(inner + hlen, end)?;
    Some(Quote {
        ip: inner,
        l4: ports.addr(),
        l4_len: msg_len - l4_off,
        key: FlowKey {
            src: dst,
            dst: src,
            sport: ports.u16::<2>(),
            dport: ports.u16::<0>(),
            proto,
            family: icmp.family,
            _pad: [0; 2],
        },
    })
}

/// Length of the ICMP message per the outer IP header.
#[inline(always)]
fn message_len(icmp: &Icmp, end: usize) -> Option<usize> {
    if icmp.family == FAMILY_V4 {
        let ip = ptr_at::<IPV4_HLEN>(icmp.l3, end)?;
        let total = u16::from_be(ip.u16::<2>()) as usize;
        let hlen = ((ip.u8::<0>() & 0x0f) as usize) * 4;
        total.checked_sub(hlen)
    } else {
        let ip = ptr_at::<IPV6_HLEN>(icmp.l3, end)?;
        Some(u16::from_be(ip.u16::<4>()) as usize)
    }
}

/// An error about a packet lb sent to a backend (`snat:nat_port -> backend:port`).
#[inline(always)]
fn backend_side(icmp: &Icmp, kind: Kind, q: &Quote, nat: &mut NatValue, end: usize) -> Verdict {
    // From the backend's side of the segment: the MAC lb sends the backend's packets
    // to (the backend, or the next hop toward it, which relays its path's errors).
    let (from_side, from_backend, service_id) = match flow::any_backend(nat.backend_id) {
        Some(b) => {
            let side = from_mac(icmp, &b.mac);
            (side, side && from_addr(icmp, &b.addr, end), b.service_id)
        }
        None => (false, false, 0),
    };
    if kind.unreachable {
        match believed_flow(nat, q, from_backend, end) {
            Some(f) => {
                // One report per flow, whichever path made it (the reply path notes its
                // own in the reverse entry).
                if f.flags & FLOW_F_REPORTED == 0 && nat.handshake & NAT_H_REPORTED == 0 {
                    f.flags |= FLOW_F_REPORTED;
                    nat.handshake |= NAT_H_REPORTED;
                    events::emit(EVENT_ICMP_UNREACH, nat.backend_id, service_id);
                }
            }
            None => count(ICMP_IGNORED),
        }
        if !from_side || (kind.end_host && !from_backend) {
            return Verdict::pass(PASS_NOT_VIP);
        }
    }
    // About `client:cport -> VIP:vport`, from the VIP to the client.
    let client = Target {
        src: &nat.client_addr,
        sport: nat.client_port,
        dst: &nat.vip_addr,
        dport: nat.vip_port,
    };
    send(icmp, q, &client, &nat.client_mac, end)
}

/// An error about a packet lb sent to a client (`VIP:vport -> client:cport`); the
/// quote reversed is the client's flow key.
#[inline(always)]
fn client_side(icmp: &Icmp, kind: Kind, q: &Quote, svc: &ServiceMeta, end: usize) -> Verdict {
    let family = q.key.family;
    let Some(f) = flow::lookup(&q.key) else {
        return Verdict::pass(PASS_NOT_VIP);
    };
    // SAFETY: read at once; a concurrent re-pin at worst sends this error to the
    // backend the flow just left, which finds no connection for it.
    let (backend_id, nat_port, nat_addr) =
        unsafe { ((*f).backend_id, (*f).nat_port, (*f).nat_addr) };
    let src = crate::nat::Source {
        addr: nat_addr,
        port: nat_port,
    };
    let snat = crate::nat::snat_addr(svc, src);
    let Some(b) = flow::any_backend(backend_id) else {
        return Verdict::pass(PASS_NOT_VIP);
    };
    if b.family != family {
        return Verdict::pass(PASS_NOT_VIP);
    }
    // About `backend:port -> snat:nat_port`: the flow's reverse entry, which must still
    // be its own (the port may have gone to another flow).
    let reverse = crate::nat::reply_key(&q.key, svc, b, src);
    let Some(v) = crate::nat::entry(&reverse) else {
        return Verdict::pass(PASS_NOT_VIP);
    };
    if !lb_common::maps::nat_owned_by(v, &q.key) {
        return Verdict::pass(PASS_NOT_VIP);
    }
    // From the client's side (the previous hop its packets came from), and a port or
    // protocol unreachable from the client itself.
    if kind.unreachable
        && (!from_mac(icmp, &v.client_mac) || (kind.end_host && !from_addr(icmp, &q.key.src, end)))
    {
        count(ICMP_IGNORED);
        return Verdict::pass(PASS_NOT_VIP);
    }
    let backend = Target {
        src: &b.addr,
        sport: b.port,
        dst: snat,
        dport: nat_port,
    };
    send(icmp, q, &backend, &b.mac, end)
}

/// Rewrites the message to be about `inner` (from `inner.dst` to `inner.src`) and
/// transmits it to `mac`.
#[inline(always)]
fn send(icmp: &Icmp, q: &Quote, inner: &Target<'_>, mac: &[u8; 6], end: usize) -> Verdict {
    match icmp_nat::rewrite(icmp, q, inner, end) {
        Ok(()) => {
            retarget_l2(icmp.eth, mac);
            Verdict::new(XDP_TX, TX_ICMP_NAT)
        }
        Err(counter) => Verdict::pass(counter),
    }
}

/// The flow a destination unreachable is about, if it is believed (see the module doc).
#[inline(always)]
fn believed_flow(
    nat: &NatValue,
    q: &Quote,
    from_backend: bool,
    end: usize,
) -> Option<&'static mut FlowValue> {
    if !from_backend {
        return None;
    }
    let f = flow::lookup(&client_key(nat, q.key.proto, q.key.family))?;
    // SAFETY: this flow's entry; no LB_FLOWS insert while the reference lives.
    let f = unsafe { &mut *f };
    if f.backend_id != nat.backend_id || f.nat_port != q.key.dport {
        return None;
    }
    // Still waiting: the flow's SYN unanswered, and no backend packet since (the reply
    // path ends the wait in the reverse entry, the flow learns it from the client).
    let waiting = f.flags & FLOW_F_SYN_PENDING != 0 && nat.handshake & NAT_H_PENDING != 0;
    if q.key.proto == IPPROTO_TCP && (!waiting || !quotes_syn(q, end)) {
        return None;
    }
    Some(f)
}

/// Whether the quoted TCP segment is a SYN (its flags must be inside the quote).
#[inline(always)]
fn quotes_syn(q: &Quote, end: usize) -> bool {
    if q.l4_len < TCP_FLAGS_END {
        return false;
    }
    let Some(tcp) = ptr_at::<TCP_FLAGS_END>(q.l4, end) else {
        return false;
    };
    tcp.u8::<13>() & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN
}

/// Whether the frame comes from `mac`.
#[inline(always)]
fn from_mac(icmp: &Icmp, mac: &[u8; 6]) -> bool {
    let m = icmp.eth.mac::<ETH_SRC>();
    m[0] == mac[0]
        && m[1] == mac[1]
        && m[2] == mac[2]
        && m[3] == mac[3]
        && m[4] == mac[4]
        && m[5] == mac[5]
}

/// Whether the outer source address is `addr` (read from the header: not kept in
/// [`Icmp`], to spare stack on the path every packet takes).
#[inline(always)]
fn from_addr(icmp: &Icmp, addr: &[u32; 4], end: usize) -> bool {
    if icmp.family == FAMILY_V4 {
        ptr_at::<IPV4_HLEN>(icmp.l3, end).is_some_and(|ip| ip.u32::<12>() == addr[0])
    } else {
        ptr_at::<IPV6_HLEN>(icmp.l3, end).is_some_and(|ip| {
            ip.u32::<8>() == addr[0]
                && ip.u32::<12>() == addr[1]
                && ip.u32::<16>() == addr[2]
                && ip.u32::<20>() == addr[3]
        })
    }
}

/// Address equality word by word (a 16-byte comparison would be a `memcmp` call).
#[inline(always)]
fn same_addr(a: &[u32; 4], b: &[u32; 4], family: u8) -> bool {
    if family == FAMILY_V4 {
        a[0] == b[0]
    } else {
        a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]
    }
}
