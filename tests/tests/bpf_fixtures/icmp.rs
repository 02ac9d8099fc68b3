//! ICMP errors about nat flows: which are believed as passive signals (source and state
//! checks), and their translation to the other side of the flow, both directions, v4
//! and v6. Every translated frame is compared byte for byte with one built from
//! scratch, and its checksums are recomputed here.

use super::prelude::*;

/// A router between lb and the backends, and one on the clients' side.
const ROUTER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xee];

fn backend_router(v4: bool) -> IpAddr {
    if v4 {
        ip4(10, 0, 1, 1)
    } else {
        ip6("fd00:1::1")
    }
}

fn client_router(v4: bool) -> IpAddr {
    if v4 {
        ip4(10, 0, 0, 254)
    } else {
        ip6("fd00::fe")
    }
}

fn client_of(s: &Svc) -> IpAddr {
    if s.vip.is_ipv4() {
        client4()
    } else {
        client6()
    }
}

/// An ICMP error from `src` (frame from `src_mac`) to `dst` quoting `quote` (an IP
/// packet, possibly cut short); `rest` is the 4 bytes after the checksum (MTU).
fn icmp_error(
    src: IpAddr,
    src_mac: [u8; 6],
    dst: IpAddr,
    (ty, code): (u8, u8),
    rest: [u8; 4],
    quote: &[u8],
) -> Frame {
    let mut f = Frame::icmp(src, dst, ty, code)
        .payload(quote)
        .macs(src_mac, LB_MAC);
    f.transport = Transport::Icmp { ty, code, rest };
    f
}

/// Port unreachable in the family of `v4`.
fn port_unreachable(v4: bool) -> (u8, u8) {
    if v4 { (3, 3) } else { (1, 4) }
}

/// Fragmentation needed / packet too big, and the MTU it announces.
fn too_big(v4: bool) -> ((u8, u8), [u8; 4]) {
    if v4 {
        ((3, 4), [0, 0, 0x05, 0x00])
    } else {
        ((2, 0), 1280u32.to_be_bytes())
    }
}

fn assert_events(lb: &mut Lb, desc: &str, expected: &[(u32, u32, u32)]) {
    let got: Vec<(String, u32, u32)> = lb
        .drain_events()
        .iter()
        .map(|e| (event_name(e.kind).to_string(), e.backend_id, e.service_id))
        .collect();
    let want: Vec<(String, u32, u32)> = expected
        .iter()
        .map(|(k, b, s)| (event_name(*k).to_string(), *b, *s))
        .collect();
    assert_eq!(got, want, "{desc}: events (kind, backend, service)");
}

/// Recomputes every checksum of an ICMP error frame (no VLAN): outer IPv4 header, ICMP
/// (ICMPv6 with its pseudo-header), the quoted IPv4 header, and the quoted TCP/UDP
/// checksum when the quote holds the whole packet.
fn assert_icmp_checksums(desc: &str, frame: &[u8]) {
    let v4 = u16::from_be_bytes([frame[12], frame[13]]) == ETH_P_IP;
    let l3 = &frame[14..];
    let (src, dst, msg): (IpAddr, IpAddr, &[u8]) = if v4 {
        let hlen = usize::from(l3[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([l3[2], l3[3]]));
        assert_eq!(
            checksum(&l3[..hlen]),
            0,
            "{desc}: outer IPv4 header checksum"
        );
        assert_eq!(checksum(&l3[hlen..total]), 0, "{desc}: ICMP checksum");
        (ip_at(l3, 12, 4), ip_at(l3, 16, 4), &l3[hlen..total])
    } else {
        let len = usize::from(u16::from_be_bytes([l3[4], l3[5]]));
        let (src, dst) = (ip_at(l3, 8, 16), ip_at(l3, 24, 16));
        let msg = &l3[40..40 + len];
        let sum = pseudo_header_sum(src, dst, IPPROTO_ICMPV6, len) + sum_words(msg);
        assert_eq!(fold(sum), 0xffff, "{desc}: ICMPv6 checksum");
        (src, dst, msg)
    };
    let _ = (src, dst);
    let quote = &msg[8..];
    let (qsrc, qdst, proto, l4, whole) = if v4 {
        let hlen = usize::from(quote[0] & 0x0f) * 4;
        assert_eq!(
            checksum(&quote[..hlen]),
            0,
            "{desc}: quoted IPv4 header checksum"
        );
        let total = usize::from(u16::from_be_bytes([quote[2], quote[3]]));
        (
            ip_at(quote, 12, 4),
            ip_at(quote, 16, 4),
            quote[9],
            &quote[hlen..quote.len().min(total)],
            quote.len() >= total,
        )
    } else {
        let len = usize::from(u16::from_be_bytes([quote[4], quote[5]]));
        (
            ip_at(quote, 8, 16),
            ip_at(quote, 24, 16),
            quote[6],
            &quote[40..quote.len().min(40 + len)],
            quote.len() >= 40 + len,
        )
    };
    if whole && !(v4 && proto == IPPROTO_UDP && l4[6..8] == [0, 0]) {
        let sum = pseudo_header_sum(qsrc, qdst, proto, l4.len()) + sum_words(l4);
        assert_eq!(fold(sum), 0xffff, "{desc}: quoted TCP/UDP checksum");
    }
}

fn ip_at(b: &[u8], at: usize, len: usize) -> IpAddr {
    if len == 4 {
        IpAddr::from(<[u8; 4]>::try_from(&b[at..at + 4]).unwrap())
    } else {
        IpAddr::from(<[u8; 16]>::try_from(&b[at..at + 16]).unwrap())
    }
}

/// Opens a nat flow with `first` (a SYN, or a UDP datagram); returns the nat port and
/// the IP packet the backend received.
fn open_flow(lb: &mut Lb, id: u32, first: &Frame) -> (u16, Vec<u8>) {
    let before = lb.counters();
    let run = lb.run(&first.bytes());
    assert_eq!(run.action, XDP_TX, "opening a nat flow to service {id}");
    let after = lb.counters();
    assert_eq!(
        after[FLOW_NEW as usize] - before[FLOW_NEW as usize],
        1,
        "a new flow"
    );
    (out_sport(first, &run.out), run.out[14..].to_vec())
}

/// Runs an error that lb must translate; checks it against `expected` byte for byte
/// and recomputes its checksums.
fn translated(lb: &mut Lb, desc: &str, input: &Frame, expected: Vec<u8>, extra: &[(u32, u64)]) {
    let mut counters = vec![(TX_ICMP_NAT, 1)];
    counters.extend_from_slice(extra);
    let run = check(
        lb,
        Fixture {
            desc,
            input: input.bytes(),
            action: XDP_TX,
            output: Out::Frame(expected),
            counters: &counters,
        },
    );
    assert_icmp_checksums(desc, &run.out);
}

/// Runs an error that lb must pass untouched.
fn passed(lb: &mut Lb, desc: &str, input: &Frame, counters: &[(u32, u64)]) {
    check(
        lb,
        Fixture {
            desc,
            input: input.bytes(),
            action: XDP_PASS,
            output: Out::Unchanged,
            counters,
        },
    );
}

/// The backend-side error `(ty, code)` from `src` about the packet `sent`, cut to
/// `len` bytes, as the client must receive it: about `client_pkt` (the client's own
/// packet, which `sent` is the translation of), from the VIP, TTL one less.
fn to_client_expected(
    s: &Svc,
    (ty, code): (u8, u8),
    rest: [u8; 4],
    client_pkt: &Frame,
    len: usize,
) -> Vec<u8> {
    let mut f = icmp_error(
        s.vip,
        LB_MAC,
        client_of(s),
        (ty, code),
        rest,
        &client_pkt.ip_bytes()[..len],
    )
    .macs(LB_MAC, CLIENT_MAC);
    f.ttl = 63;
    f.bytes()
}

/// The client-side error `(ty, code)` about the reply quoted in `quote` as the backend
/// must receive it: from the snat address, TTL one less.
fn to_backend_expected(s: &Svc, (ty, code): (u8, u8), rest: [u8; 4], quote: &[u8]) -> Vec<u8> {
    let mut f = icmp_error(snat(s.vip), LB_MAC, s.backend_addr, (ty, code), rest, quote)
        .macs(LB_MAC, backend_mac(s.backend));
    f.ttl = 63;
    f.bytes()
}

/// The backend's `data` through lb (translated, XDP_TX): the IP packet sent to the client.
fn reply_through(lb: &mut Lb, data: &Frame) -> Vec<u8> {
    let run = lb.run(&data.bytes());
    assert_eq!(run.action, XDP_TX, "reply translated");
    run.out[14..].to_vec()
}

#[test]
fn icmp_backend_side_errors_are_translated_to_the_client() {
    let mut lb = world(&[NAT4, NAT6, NAT4_UDP, NAT6_UDP]);
    for id in [NAT4, NAT6] {
        let s = svc(id);
        let v4 = s.vip.is_ipv4();
        let syn = to_vip(id, CPORT, TCP_SYN).payload(&[0x5a; 64]);
        let (_, sent) = open_flow(&mut lb, id, &syn);
        let (ty, rest) = too_big(v4);
        // A router between lb and the backend: the whole packet quoted, then only the
        // IP header and 8 bytes (RFC 792's minimum, before the TCP checksum).
        let hlen = if v4 { 20 } else { 40 };
        for len in [sent.len(), hlen + 8] {
            let err = icmp_error(
                backend_router(v4),
                ROUTER_MAC,
                snat(s.vip),
                ty,
                rest,
                &sent[..len],
            );
            translated(
                &mut lb,
                &format!("service {id}: fragmentation needed / too big quoting {len} bytes"),
                &err,
                to_client_expected(&s, ty, rest, &syn, len),
                &[],
            );
        }
        // Time exceeded on the way to the backend.
        let te = if v4 { (11, 0) } else { (3, 0) };
        let err = icmp_error(
            backend_router(v4),
            ROUTER_MAC,
            snat(s.vip),
            te,
            [0; 4],
            &sent,
        );
        translated(
            &mut lb,
            &format!("service {id}: time exceeded"),
            &err,
            to_client_expected(&s, te, [0; 4], &syn, sent.len()),
            &[],
        );
    }
    // UDP, including an IPv4 datagram without a checksum (stays without).
    for (id, zero) in [(NAT4_UDP, false), (NAT4_UDP, true), (NAT6_UDP, false)] {
        let s = svc(id);
        let v4 = s.vip.is_ipv4();
        let mut q = to_vip(id, CPORT + u16::from(zero), 0).payload(b"query");
        if let Transport::Udp { zero_csum, .. } = &mut q.transport {
            *zero_csum = zero;
        }
        let (_, sent) = open_flow(&mut lb, id, &q);
        let (ty, rest) = too_big(v4);
        let err = icmp_error(backend_router(v4), ROUTER_MAC, snat(s.vip), ty, rest, &sent);
        translated(
            &mut lb,
            &format!("service {id} (UDP, zero checksum {zero}): too big"),
            &err,
            to_client_expected(&s, ty, rest, &q, sent.len()),
            &[],
        );
    }
    // Behind an 802.1Q tag: the tag stays, the rest is translated the same.
    let s = svc(NAT4);
    let syn = to_vip(NAT4, CPORT + 9, TCP_SYN).vlan(7);
    let (_, sent) = open_flow(&mut lb, NAT4, &syn);
    let sent = &sent[4..]; // the output frame's IP packet, after the tag
    let (ty, rest) = too_big(true);
    let err = icmp_error(
        backend_router(true),
        ROUTER_MAC,
        snat(s.vip),
        ty,
        rest,
        sent,
    )
    .vlan(7);
    let mut want = icmp_error(s.vip, LB_MAC, client4(), ty, rest, &syn.ip_bytes())
        .macs(LB_MAC, CLIENT_MAC)
        .vlan(7);
    want.ttl = 63;
    check(
        &mut lb,
        Fixture {
            desc: "VLAN-tagged fragmentation needed",
            input: err.bytes(),
            action: XDP_TX,
            output: Out::Frame(want.bytes()),
            counters: &[(TX_ICMP_NAT, 1)],
        },
    );
    assert_events(&mut lb, "path errors are no passive signal", &[]);
}

#[test]
fn icmp_client_side_errors_are_translated_to_the_backend() {
    let mut lb = world(&[NAT4, NAT6]);
    for id in [NAT4, NAT6] {
        let s = svc(id);
        let v4 = s.vip.is_ipv4();
        let syn = to_vip(id, CPORT, TCP_SYN);
        let (port, _) = open_flow(&mut lb, id, &syn);
        // The backend's big segment, and what lb sent on toward the client.
        let data = backend_reply(id, port, TCP_ACK | TCP_PSH).payload(&[0xa5; 200]);
        let to_client = reply_through(&mut lb, &data);
        let (ty, rest) = too_big(v4);
        let hlen = if v4 { 20 } else { 40 };
        for len in [to_client.len(), hlen + 8] {
            let err = icmp_error(
                client_router(v4),
                CLIENT_MAC,
                s.vip,
                ty,
                rest,
                &to_client[..len],
            );
            let want = to_backend_expected(&s, ty, rest, &data.ip_bytes()[..len]);
            translated(
                &mut lb,
                &format!("service {id}: too big on the client's path, quoting {len} bytes"),
                &err,
                want,
                &[],
            );
        }
        // Port unreachable about the reply must come from the client itself.
        let err = icmp_error(
            client_router(v4),
            CLIENT_MAC,
            s.vip,
            port_unreachable(v4),
            [0; 4],
            &to_client,
        );
        passed(
            &mut lb,
            &format!("service {id}: port unreachable from a third party about the client's flow"),
            &err,
            &[(PASS_NOT_VIP, 1), (ICMP_IGNORED, 1)],
        );
        let err = icmp_error(
            client_of(&s),
            CLIENT_MAC,
            s.vip,
            port_unreachable(v4),
            [0; 4],
            &to_client,
        );
        let want = to_backend_expected(&s, port_unreachable(v4), [0; 4], &data.ip_bytes());
        translated(
            &mut lb,
            &format!("service {id}: port unreachable from the client"),
            &err,
            want,
            &[],
        );
        // About a client port without a flow: nothing to translate.
        let stray = reply_expected(&data, id, CPORT + 1);
        let err = icmp_error(client_router(v4), CLIENT_MAC, s.vip, ty, rest, &stray[14..]);
        passed(
            &mut lb,
            &format!("service {id}: about no flow"),
            &err,
            &[(PASS_NOT_VIP, 1)],
        );
    }
    assert_events(&mut lb, "client-side errors are no passive signal", &[]);
}

#[test]
fn icmp_unreachable_from_the_backend_is_believed_only_for_a_pending_handshake() {
    let mut lb = world(&[NAT4, NAT6]);
    for id in [NAT4, NAT6] {
        let s = svc(id);
        let v4 = s.vip.is_ipv4();
        let unreach = port_unreachable(v4);
        let from_backend = |quote: &[u8]| {
            icmp_error(
                s.backend_addr,
                backend_mac(s.backend),
                snat(s.vip),
                unreach,
                [0; 4],
                quote,
            )
        };

        // Pending: the backend's port unreachable about the SYN is the signal.
        let syn = to_vip(id, CPORT, TCP_SYN);
        let (_, sent) = open_flow(&mut lb, id, &syn);
        let err = from_backend(&sent);
        let want = to_client_expected(&s, unreach, [0; 4], &syn, sent.len());
        translated(
            &mut lb,
            &format!("service {id}: port unreachable from the backend, SYN pending"),
            &err,
            want.clone(),
            &[(EVENTS_SENT, 1)],
        );
        translated(
            &mut lb,
            &format!("service {id}: the same again (one event per flow)"),
            &err,
            want,
            &[],
        );
        assert_events(
            &mut lb,
            "pending flow",
            &[(EVENT_ICMP_UNREACH, s.backend, id)],
        );

        // Pending, but the quote is not that SYN (an ACK of this 5-tuple).
        let syn2 = to_vip(id, CPORT + 1, TCP_SYN);
        let (port2, _) = open_flow(&mut lb, id, &syn2);
        let ack = to_vip(id, CPORT + 1, TCP_ACK);
        let ack_sent = retuple(&ack, snat(s.vip), port2, s.backend_addr, s.backend_port);
        translated(
            &mut lb,
            &format!("service {id}: quoting a segment that is no SYN"),
            &from_backend(&ack_sent.ip_bytes()),
            to_client_expected(&s, unreach, [0; 4], &ack, ack_sent.ip_bytes().len()),
            &[(ICMP_IGNORED, 1)],
        );
        // Pending, but the quote stops before the TCP flags.
        let cut = if v4 { 28 } else { 48 };
        let syn2_sent = retuple(&syn2, snat(s.vip), port2, s.backend_addr, s.backend_port);
        translated(
            &mut lb,
            &format!("service {id}: the SYN quoted without its flags"),
            &from_backend(&syn2_sent.ip_bytes()[..cut]),
            to_client_expected(&s, unreach, [0; 4], &syn2, cut),
            &[(ICMP_IGNORED, 1)],
        );

        // Established: translated, never believed.
        let syn3 = to_vip(id, CPORT + 2, TCP_SYN);
        let (port3, sent3) = open_flow(&mut lb, id, &syn3);
        nat_reply(
            &mut lb,
            "SYN-ACK",
            &backend_reply(id, port3, TCP_SYN | TCP_ACK),
            id,
            CPORT + 2,
            &[(TX_NAT_REPLY, 1)],
        );
        translated(
            &mut lb,
            &format!("service {id}: port unreachable about an established flow"),
            &from_backend(&sent3),
            to_client_expected(&s, unreach, [0; 4], &syn3, sent3.len()),
            &[(ICMP_IGNORED, 1)],
        );
        let f = lb.flow(&client_key(id, CPORT + 2)).expect("flow");
        assert_eq!(
            f.flags & FLOW_F_REPORTED,
            0,
            "established flow not reported"
        );

        // Fragmentation needed from the backend itself says nothing about failure.
        let syn4 = to_vip(id, CPORT + 3, TCP_SYN);
        let (_, sent4) = open_flow(&mut lb, id, &syn4);
        let (ty, rest) = too_big(v4);
        let err = icmp_error(
            s.backend_addr,
            backend_mac(s.backend),
            snat(s.vip),
            ty,
            rest,
            &sent4,
        );
        translated(
            &mut lb,
            &format!("service {id}: too big from the backend, SYN pending"),
            &err,
            to_client_expected(&s, ty, rest, &syn4, sent4.len()),
            &[],
        );
        assert_events(&mut lb, "nothing else believed", &[]);
    }
}

/// A client forges port unreachable to the lb address quoting
/// `snat:P -> backend:port` for every P of the snat range. None is believed or
/// translated; the ones that hit a live flow are counted `icmp_ignored`.
#[test]
fn icmp_forged_unreachable_across_the_snat_range_is_ignored() {
    let mut lb = world(&[NAT4, NAT4_UDP, NAT6]);
    let mut live = Vec::new();
    for (id, cport) in [
        (NAT4, CPORT),
        (NAT4, CPORT + 1),
        (NAT4_UDP, CPORT),
        (NAT6, CPORT),
    ] {
        let first = to_vip(id, cport, TCP_SYN);
        let (port, _) = open_flow(&mut lb, id, &first);
        live.push((id, port));
    }
    for id in [NAT4, NAT4_UDP, NAT6] {
        let s = svc(id);
        let v4 = s.vip.is_ipv4();
        for port in NAT_PORT_MIN..=NAT_PORT_MAX {
            let quoted = if s.proto == IPPROTO_TCP {
                Frame::tcp(snat(s.vip), port, s.backend_addr, s.backend_port, TCP_SYN)
            } else {
                Frame::udp(snat(s.vip), port, s.backend_addr, s.backend_port)
            };
            let hits = live.contains(&(id, port));
            let counters: &[(u32, u64)] = if hits {
                &[(PASS_NOT_VIP, 1), (ICMP_IGNORED, 1)]
            } else {
                &[(PASS_NOT_VIP, 1)]
            };
            // From the client's address, and with the backend's address spoofed (the
            // frame still comes from the client's MAC).
            for src in [client_of(&s), s.backend_addr] {
                let err = icmp_error(
                    src,
                    CLIENT_MAC,
                    snat(s.vip),
                    port_unreachable(v4),
                    [0; 4],
                    &quoted.ip_bytes(),
                );
                passed(
                    &mut lb,
                    &format!("service {id}: forged unreachable from {src} for port {port}"),
                    &err,
                    counters,
                );
            }
        }
    }
    assert_events(&mut lb, "forged unreachables", &[]);
    for (id, cport) in [
        (NAT4, CPORT),
        (NAT4, CPORT + 1),
        (NAT4_UDP, CPORT),
        (NAT6, CPORT),
    ] {
        let f = lb.flow(&client_key(id, cport)).expect("flow");
        assert_eq!(
            f.flags & FLOW_F_REPORTED,
            0,
            "service {id} flow {cport} not reported"
        );
    }
}

#[test]
fn icmp_udp_port_unreachable_from_the_backend_is_reported_once() {
    let mut lb = world(&[NAT4_UDP, NAT6_UDP]);
    for id in [NAT4_UDP, NAT6_UDP] {
        let s = svc(id);
        let v4 = s.vip.is_ipv4();
        let q = to_vip(id, CPORT, 0).payload(b"ping");
        let (_, sent) = open_flow(&mut lb, id, &q);
        let err = icmp_error(
            s.backend_addr,
            backend_mac(s.backend),
            snat(s.vip),
            port_unreachable(v4),
            [0; 4],
            &sent,
        );
        let want = to_client_expected(&s, port_unreachable(v4), [0; 4], &q, sent.len());
        translated(
            &mut lb,
            &format!("service {id}: UDP port unreachable from the backend"),
            &err,
            want.clone(),
            &[(EVENTS_SENT, 1)],
        );
        translated(&mut lb, "a second one", &err, want, &[]);
        assert_events(&mut lb, "UDP", &[(EVENT_ICMP_UNREACH, s.backend, id)]);
    }
}

#[test]
fn icmp_errors_lb_does_not_translate_are_passed() {
    let mut lb = world(&[NAT4, DSR4]);
    let s = svc(NAT4);
    let syn = to_vip(NAT4, CPORT, TCP_SYN);
    let (_, sent) = open_flow(&mut lb, NAT4, &syn);
    let (ty, rest) = too_big(true);

    let mut last_hop = icmp_error(
        backend_router(true),
        ROUTER_MAC,
        snat(s.vip),
        ty,
        rest,
        &sent,
    );
    last_hop.ttl = 1;
    passed(
        &mut lb,
        "TTL 1: the kernel's, not forwarded",
        &last_hop,
        &[(PASS_TTL_EXPIRED, 1)],
    );

    // dsr: the backend answers the client directly; lb never carried the packet.
    let d = svc(DSR4);
    let dsr_reply = Frame::tcp(d.vip, d.port, client4(), CPORT, TCP_ACK);
    let err = icmp_error(
        client_router(true),
        CLIENT_MAC,
        d.vip,
        ty,
        rest,
        &dsr_reply.ip_bytes(),
    );
    passed(&mut lb, "about a dsr service", &err, &[(PASS_NOT_VIP, 1)]);

    // Not an error: echo request to the snat address quoting nothing useful.
    let echo = Frame::icmp(client4(), snat(s.vip), 8, 0)
        .payload(&sent)
        .macs(CLIENT_MAC, LB_MAC);
    passed(&mut lb, "echo request", &echo, &[(PASS_NOT_VIP, 1)]);

    // The quote's source is not the address the error was sent to.
    let err = icmp_error(
        backend_router(true),
        ROUTER_MAC,
        ip4(10, 0, 0, 3),
        ty,
        rest,
        &sent,
    );
    passed(
        &mut lb,
        "sent to another address",
        &err,
        &[(PASS_NOT_VIP, 1)],
    );

    // A quote too short for the ports.
    let err = icmp_error(
        backend_router(true),
        ROUTER_MAC,
        snat(s.vip),
        ty,
        rest,
        &sent[..22],
    );
    passed(&mut lb, "quote without ports", &err, &[(PASS_NOT_VIP, 1)]);
    assert_events(&mut lb, "nothing", &[]);
}

/// Destination unreachables other than "too big" are translated only when the frame
/// comes from the flow's side of the segment: the backend's MAC (the backend or its
/// next hop) on the backend side, the client's previous hop on the client side.
#[test]
fn icmp_unreachables_are_translated_only_from_the_flows_side() {
    let mut lb = world(&[NAT4, NAT6]);
    for id in [NAT4, NAT6] {
        let s = svc(id);
        let v4 = s.vip.is_ipv4();
        // Host unreachable / address unreachable: what a router sends.
        let host_unreach = if v4 { (3, 1) } else { (1, 3) };
        let syn = to_vip(id, CPORT, TCP_SYN);
        let (port, sent) = open_flow(&mut lb, id, &syn);

        let stranger = icmp_error(
            backend_router(v4),
            ROUTER_MAC,
            snat(s.vip),
            host_unreach,
            [0; 4],
            &sent,
        );
        passed(
            &mut lb,
            &format!("service {id}: host unreachable from off the backend's side"),
            &stranger,
            &[(PASS_NOT_VIP, 1), (ICMP_IGNORED, 1)],
        );
        let next_hop = icmp_error(
            backend_router(v4),
            backend_mac(s.backend),
            snat(s.vip),
            host_unreach,
            [0; 4],
            &sent,
        );
        translated(
            &mut lb,
            &format!("service {id}: host unreachable from a router behind the backend's next hop"),
            &next_hop,
            to_client_expected(&s, host_unreach, [0; 4], &syn, sent.len()),
            &[(ICMP_IGNORED, 1)],
        );

        let data = backend_reply(id, port, TCP_ACK).payload(b"data");
        let to_client = reply_through(&mut lb, &data);
        let from_client_side = icmp_error(
            client_router(v4),
            CLIENT_MAC,
            s.vip,
            host_unreach,
            [0; 4],
            &to_client,
        );
        let want = to_backend_expected(&s, host_unreach, [0; 4], &data.ip_bytes());
        translated(
            &mut lb,
            &format!("service {id}: host unreachable from the client's previous hop"),
            &from_client_side,
            want,
            &[],
        );
        let off_side = icmp_error(
            client_router(v4),
            ROUTER_MAC,
            s.vip,
            host_unreach,
            [0; 4],
            &to_client,
        );
        passed(
            &mut lb,
            &format!("service {id}: host unreachable from off the client's side"),
            &off_side,
            &[(PASS_NOT_VIP, 1), (ICMP_IGNORED, 1)],
        );
    }
    assert_events(&mut lb, "none believed", &[]);
}
