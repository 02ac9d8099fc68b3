//! Fixture machinery: run, compare frames and counters, verify checksums, build
//! the expected translated frames.

use super::prelude::*;

/// What the output frame must be.
pub enum Out {
    /// Byte for byte the input.
    Unchanged,
    /// Byte for byte this frame.
    Frame(Vec<u8>),
    /// Not compared (dropped packets).
    Any,
}

pub struct Fixture<'a> {
    pub desc: &'a str,
    pub input: Vec<u8>,
    pub action: u32,
    pub output: Out,
    /// Counter deltas besides `rx` (the sum of the outcome counters, which must be 1:
    /// exactly one outcome per packet); all others must be 0.
    pub counters: &'a [(u32, u64)],
}

pub fn counter_deltas(before: &[u64], after: &[u64]) -> Vec<(u32, u64)> {
    before
        .iter()
        .zip(after)
        .enumerate()
        .filter(|(_, (b, a))| a != b)
        .map(|(i, (b, a))| (i as u32, a - b))
        .collect()
}

pub fn named(deltas: &[(u32, u64)]) -> Vec<String> {
    deltas
        .iter()
        .map(|(i, d)| format!("{}+{d}", counters::NAMES[*i as usize]))
        .collect()
}

/// Runs one fixture and checks action, output and counter deltas.
pub fn check(lb: &mut Lb, f: Fixture<'_>) -> Run {
    let before = lb.counters();
    let run = lb.run(&f.input);
    let after = lb.counters();
    assert_eq!(
        run.action,
        f.action,
        "{}: expected {}, got {}",
        f.desc,
        action_name(f.action),
        action_name(run.action)
    );
    match &f.output {
        Out::Unchanged => assert_frames_eq(f.desc, &f.input, &run.out),
        Out::Frame(expected) => assert_frames_eq(f.desc, expected, &run.out),
        Out::Any => {}
    }
    let mut expected: Vec<(u32, u64)> = vec![(RX, 1)];
    expected.extend_from_slice(f.counters);
    expected.sort();
    let got = counter_deltas(&before, &after);
    assert_eq!(
        named(&got),
        named(&expected),
        "{}: counter deltas (expected on the right)",
        f.desc
    );
    run
}

pub fn assert_frames_eq(desc: &str, expected: &[u8], got: &[u8]) {
    if expected != got {
        let diff: Vec<String> = expected
            .iter()
            .zip(got)
            .enumerate()
            .filter(|(_, (e, g))| e != g)
            .map(|(i, (e, g))| format!("@{i}: expected {e:#04x} got {g:#04x}"))
            .collect();
        panic!(
            "{desc}: output frame differs (len expected {} got {}): {}\nexpected {:02x?}\ngot      {:02x?}",
            expected.len(),
            got.len(),
            diff.join(", "),
            expected,
            got
        );
    }
}

/// Verifies the IPv4 header and TCP/UDP checksums of `frame` with etherparse.
pub fn assert_checksums_valid(desc: &str, frame: &[u8]) {
    let p = SlicedPacket::from_ethernet(frame)
        .unwrap_or_else(|e| panic!("{desc}: output does not parse: {e:?}"));
    let (src, dst): (Vec<u8>, Vec<u8>) = match &p.net {
        Some(NetSlice::Ipv4(ip)) => {
            let h = ip.header();
            assert_eq!(
                h.header_checksum(),
                h.to_header().calc_header_checksum(),
                "{desc}: IPv4 header checksum must verify"
            );
            (h.source().to_vec(), h.destination().to_vec())
        }
        Some(NetSlice::Ipv6(ip)) => {
            let h = ip.header();
            (h.source().to_vec(), h.destination().to_vec())
        }
        other => panic!("{desc}: not IP: {other:?}"),
    };
    match &p.transport {
        Some(TransportSlice::Tcp(tcp)) => {
            let want = if src.len() == 4 {
                tcp.calc_checksum_ipv4(src[..].try_into().unwrap(), dst[..].try_into().unwrap())
            } else {
                tcp.calc_checksum_ipv6(src[..].try_into().unwrap(), dst[..].try_into().unwrap())
            }
            .expect("checksum");
            assert_eq!(tcp.checksum(), want, "{desc}: TCP checksum must verify");
        }
        Some(TransportSlice::Udp(udp)) => {
            let h = udp.to_header();
            if src.len() == 4 && h.checksum == 0 {
                return; // no checksum: nothing to verify
            }
            let want = if src.len() == 4 {
                h.calc_checksum_ipv4_raw(
                    src[..].try_into().unwrap(),
                    dst[..].try_into().unwrap(),
                    udp.payload(),
                )
            } else {
                h.calc_checksum_ipv6_raw(
                    src[..].try_into().unwrap(),
                    dst[..].try_into().unwrap(),
                    udp.payload(),
                )
            }
            .expect("checksum");
            assert_eq!(h.checksum, want, "{desc}: UDP checksum must verify");
        }
        other => panic!("{desc}: not TCP/UDP: {other:?}"),
    }
}

/// A client packet to service `id` (TCP flags ignored for UDP services).
pub fn to_vip(id: u32, sport: u16, flags: u8) -> Frame {
    let s = svc(id);
    let client = if s.vip.is_ipv4() {
        client4()
    } else {
        client6()
    };
    let f = if s.proto == IPPROTO_TCP {
        Frame::tcp(client, sport, s.vip, s.port, flags)
    } else {
        Frame::udp(client, sport, s.vip, s.port)
    };
    f.macs(CLIENT_MAC, LB_MAC)
}

pub fn client_key(id: u32, sport: u16) -> FlowKey {
    let s = svc(id);
    let client = if s.vip.is_ipv4() {
        client4()
    } else {
        client6()
    };
    flow_key(client, sport, s.vip, s.port, s.proto)
}

/// The reply 5-tuple of a nat flow that was given source port `nat_port`.
pub fn reply_key(id: u32, nat_port: u16) -> FlowKey {
    let s = svc(id);
    flow_key(
        s.backend_addr,
        s.backend_port,
        snat(s.vip),
        nat_port,
        s.proto,
    )
}

/// `frame` as a dsr balancer must send it to `backend_id`.
pub fn dsr_expected(frame: &Frame, backend_id: u32) -> Vec<u8> {
    frame.clone().macs(LB_MAC, backend_mac(backend_id)).bytes()
}

/// Rewrites `frame`'s 5-tuple (builder recomputes every checksum from scratch).
pub fn retuple(frame: &Frame, src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Frame {
    let mut f = frame.clone();
    f.src = src;
    f.dst = dst;
    match &mut f.transport {
        Transport::Tcp {
            sport: s, dport: d, ..
        }
        | Transport::Udp {
            sport: s, dport: d, ..
        } => {
            *s = sport;
            *d = dport;
        }
        _ => panic!("retuple of a non-TCP/UDP frame"),
    }
    f
}

/// The source port a nat forward chose, read from the output frame.
pub fn out_sport(frame: &Frame, out: &[u8]) -> u16 {
    let at = frame.l4_offset();
    u16::from_be_bytes([out[at], out[at + 1]])
}

/// A TCP connection of client port `cport` to nat service `id` through its handshake
/// (SYN, SYN-ACK, the client's ACK), each step checked; `extra` are the counters the
/// ACK moves beyond the forward itself. Returns its source port.
pub fn nat_handshake(lb: &mut Lb, id: u32, cport: u16, extra: &[(u32, u64)]) -> u16 {
    let port = nat_forward(
        lb,
        "nat: SYN",
        &to_vip(id, cport, TCP_SYN),
        id,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    nat_reply(
        lb,
        "nat: SYN-ACK",
        &backend_reply(id, port, TCP_SYN | TCP_ACK),
        id,
        cport,
        &[(TX_NAT_REPLY, 1)],
    );
    let mut counters = vec![(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)];
    counters.extend_from_slice(extra);
    nat_forward(
        lb,
        "nat: the client's ACK of the SYN-ACK",
        &to_vip(id, cport, TCP_ACK),
        id,
        &counters,
    );
    port
}

/// Sends a client packet of a nat service; checks the translation byte for byte and
/// with etherparse; returns the nat port.
pub fn nat_forward(
    lb: &mut Lb,
    desc: &str,
    frame: &Frame,
    id: u32,
    counters: &[(u32, u64)],
) -> u16 {
    nat_forward_bytes(lb, desc, frame, frame.bytes(), id, counters)
}

/// [`nat_forward`] of `input`, which must be translated as `frame` is (`frame`'s bytes
/// with other checksum bytes).
pub fn nat_forward_bytes(
    lb: &mut Lb,
    desc: &str,
    frame: &Frame,
    input: Vec<u8>,
    id: u32,
    counters: &[(u32, u64)],
) -> u16 {
    let s = svc(id);
    let run = transmitted(lb, desc, input, Out::Any, counters);
    let port = out_sport(frame, &run.out);
    assert!(
        (NAT_PORT_MIN..=NAT_PORT_MAX).contains(&port),
        "{desc}: nat source port {port} outside [{NAT_PORT_MIN}, {NAT_PORT_MAX}]"
    );
    let expected = retuple(frame, snat(s.vip), port, s.backend_addr, s.backend_port)
        .macs(LB_MAC, backend_mac(s.backend))
        .bytes();
    assert_frames_eq(desc, &expected, &run.out);
    assert_checksums_valid(desc, &run.out);
    port
}

/// A backend reply on a nat flow, as it arrives at the balancer.
pub fn backend_reply(id: u32, nat_port: u16, flags: u8) -> Frame {
    let s = svc(id);
    let f = if s.proto == IPPROTO_TCP {
        Frame::tcp(s.backend_addr, s.backend_port, snat(s.vip), nat_port, flags)
    } else {
        Frame::udp(s.backend_addr, s.backend_port, snat(s.vip), nat_port)
    };
    f.macs(backend_mac(s.backend), LB_MAC)
}

/// `reply` as the client must receive it.
pub fn reply_expected(reply: &Frame, id: u32, cport: u16) -> Vec<u8> {
    let s = svc(id);
    let client = if s.vip.is_ipv4() {
        client4()
    } else {
        client6()
    };
    retuple(reply, s.vip, s.port, client, cport)
        .macs(LB_MAC, CLIENT_MAC)
        .bytes()
}

pub fn nat_reply(
    lb: &mut Lb,
    desc: &str,
    reply: &Frame,
    id: u32,
    cport: u16,
    counters: &[(u32, u64)],
) {
    sent_as(
        lb,
        desc,
        reply.bytes(),
        reply_expected(reply, id, cport),
        counters,
    );
}

/// Runs `input` and checks that it is sent (`XDP_TX`) as `output`, with `counters`.
pub fn transmitted(
    lb: &mut Lb,
    desc: &str,
    input: Vec<u8>,
    output: Out,
    counters: &[(u32, u64)],
) -> Run {
    check(
        lb,
        Fixture {
            desc,
            input,
            action: XDP_TX,
            output,
            counters,
        },
    )
}

/// Runs `input` and checks that it is sent as `expected`, whose checksums etherparse
/// verifies too, with `counters`.
pub fn sent_as(
    lb: &mut Lb,
    desc: &str,
    input: Vec<u8>,
    expected: Vec<u8>,
    counters: &[(u32, u64)],
) {
    let run = transmitted(lb, desc, input, Out::Frame(expected), counters);
    assert_checksums_valid(desc, &run.out);
}
