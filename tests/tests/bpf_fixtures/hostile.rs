//! Hostile input: frames not addressed to this host, IP/TCP/UDP lengths that
//! disagree with the frame, bad IPv4 header checksums, expiring TTLs, impossible sources
//! and TCP flag combinations. Each is passed untouched or dropped, counted, and takes no
//! flow entry, no nat source port and no service packet (docs/packet-rules.md).

use super::prelude::*;

const FOREIGN_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];
const BROADCAST_MAC: [u8; 6] = [0xff; 6];
const IPV4_MCAST_MAC: [u8; 6] = [0x01, 0x00, 0x5e, 0, 0, 0x01];
const IPV6_MCAST_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 0x01];
const TCP_URG: u8 = 0x20;

/// Recomputes the IPv4 header checksum of the header at `l3`.
fn fix_ipv4_checksum(b: &mut [u8], l3: usize) {
    let hlen = usize::from(b[l3] & 0x0f) * 4;
    b[l3 + 10] = 0;
    b[l3 + 11] = 0;
    let c = checksum(&b[l3..l3 + hlen]);
    b[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

/// `frame` rendered and edited; an IPv4 header checksum is recomputed afterwards, so
/// the edit is the only defect.
fn edited(frame: &Frame, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = frame.bytes();
    edit(&mut b);
    if frame.src.is_ipv4() {
        fix_ipv4_checksum(&mut b, frame.l3_offset());
    }
    b
}

fn set16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Runs `input`, expecting it refused with `action` and `counter`: a passed frame is
/// byte for byte the input; no flow entry, nat entry or service packet appears.
fn refused(lb: &mut Lb, desc: &str, input: Vec<u8>, action: u32, counter: u32) {
    let (flows, nats) = (lb.flow_count(), lb.nat_count());
    let packets: u64 = [DSR4, NAT4, NAT4_UDP, DSR6, DSR4_UDP]
        .iter()
        .map(|&id| lb.service_stats(id).packets)
        .sum();
    check(
        lb,
        Fixture {
            desc,
            input,
            action,
            output: if action == XDP_PASS {
                Out::Unchanged
            } else {
                Out::Any
            },
            counters: &[(counter, 1)],
        },
    );
    assert_eq!(lb.flow_count(), flows, "{desc}: no flow entry taken");
    assert_eq!(lb.nat_count(), nats, "{desc}: no nat source port taken");
    let after: u64 = [DSR4, NAT4, NAT4_UDP, DSR6, DSR4_UDP]
        .iter()
        .map(|&id| lb.service_stats(id).packets)
        .sum();
    assert_eq!(after, packets, "{desc}: no service packet counted");
}

fn forwarded_dsr(lb: &mut Lb, desc: &str, frame: &[u8], backend_id: u32, counters: &[(u32, u64)]) {
    let mut expected = frame.to_vec();
    expected[..6].copy_from_slice(&backend_mac(backend_id));
    expected[6..12].copy_from_slice(&LB_MAC);
    check(
        lb,
        Fixture {
            desc,
            input: frame.to_vec(),
            action: XDP_TX,
            output: Out::Frame(expected),
            counters,
        },
    );
}

#[test]
fn frames_for_other_macs_pass_untouched() {
    let mut lb = world(&[DSR4, NAT4, DSR6]);
    for (desc, frame) in [
        (
            "dsr SYN to a foreign unicast MAC",
            to_vip(DSR4, CPORT, TCP_SYN).macs(CLIENT_MAC, FOREIGN_MAC),
        ),
        (
            "nat SYN to a foreign unicast MAC",
            to_vip(NAT4, CPORT, TCP_SYN).macs(CLIENT_MAC, FOREIGN_MAC),
        ),
        (
            "dsr SYN to the broadcast MAC",
            to_vip(DSR4, CPORT, TCP_SYN).macs(CLIENT_MAC, BROADCAST_MAC),
        ),
        (
            "nat SYN to an IPv4 multicast MAC",
            to_vip(NAT4, CPORT, TCP_SYN).macs(CLIENT_MAC, IPV4_MCAST_MAC),
        ),
        (
            "IPv6 dsr SYN to an IPv6 multicast MAC",
            to_vip(DSR6, CPORT, TCP_SYN).macs(CLIENT_MAC, IPV6_MCAST_MAC),
        ),
        (
            "VLAN-tagged dsr ACK to a foreign MAC",
            to_vip(DSR4, CPORT, TCP_ACK)
                .vlan(5)
                .macs(CLIENT_MAC, FOREIGN_MAC),
        ),
        (
            "ICMP echo to the VIP at a foreign MAC",
            Frame::icmp(client4(), svc(DSR4).vip, 8, 0).macs(CLIENT_MAC, FOREIGN_MAC),
        ),
    ] {
        refused(&mut lb, desc, frame.bytes(), XDP_PASS, PASS_NOT_FOR_HOST);
    }

    // A nat reply addressed to another MAC is not translated (its entry stays as it was).
    let port = nat_forward(
        &mut lb,
        "nat SYN to our MAC",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let entry = lb.nat_entry(&reply_key(NAT4, port)).expect("reverse entry");
    let reply = backend_reply(NAT4, port, TCP_SYN | TCP_ACK);
    refused(
        &mut lb,
        "nat SYN-ACK to a foreign MAC",
        reply.clone().macs(backend_mac(2), FOREIGN_MAC).bytes(),
        XDP_PASS,
        PASS_NOT_FOR_HOST,
    );
    assert_eq!(
        lb.nat_entry(&reply_key(NAT4, port)),
        Some(entry),
        "the foreign-MAC reply left the reverse entry alone"
    );
    nat_reply(
        &mut lb,
        "the same SYN-ACK to our MAC is translated",
        &reply,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
}

#[test]
fn an_unconfigured_mac_checks_only_group_addresses() {
    let mut lb = world(&[DSR4]);
    lb.set_interface_mac([0; 6]);
    let foreign = to_vip(DSR4, CPORT, TCP_SYN).macs(CLIENT_MAC, FOREIGN_MAC);
    // dsr sends from the MAC the frame was addressed to.
    let expected = foreign.clone().macs(FOREIGN_MAC, backend_mac(1)).bytes();
    check(
        &mut lb,
        Fixture {
            desc: "MAC not configured: a unicast frame to any MAC is balanced",
            input: foreign.bytes(),
            action: XDP_TX,
            output: Out::Frame(expected),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
    refused(
        &mut lb,
        "MAC not configured: broadcast still passes",
        to_vip(DSR4, CPORT + 1, TCP_SYN)
            .macs(CLIENT_MAC, BROADCAST_MAC)
            .bytes(),
        XDP_PASS,
        PASS_NOT_FOR_HOST,
    );
}

#[test]
fn ip_lengths_must_agree_with_the_frame() {
    let mut lb = world(&[DSR4, NAT4, DSR6]);
    let syn4 = to_vip(DSR4, CPORT, TCP_SYN).payload(b"data");
    let nat4 = to_vip(NAT4, CPORT, TCP_SYN).payload(b"data");
    let syn6 = to_vip(DSR6, CPORT, TCP_SYN).payload(b"data");
    let tot = |f: &Frame| f.bytes().len() - f.l3_offset();
    let drop = [
        (
            "IPv4 total length one byte past the frame",
            edited(&syn4, |b| set16(b, 16, tot(&syn4) as u16 + 1)),
        ),
        (
            "IPv4 total length cuts the TCP header (39 of 44 bytes)",
            edited(&syn4, |b| set16(b, 16, 39)),
        ),
        (
            "nat: IPv4 total length past the frame",
            edited(&nat4, |b| set16(b, 16, tot(&nat4) as u16 + 100)),
        ),
        (
            "IPv6 payload length one byte past the frame",
            edited(&syn6, |b| set16(b, 18, 24 + 1)),
        ),
        (
            "IPv6 payload length cuts the TCP header (19)",
            edited(&syn6, |b| set16(b, 18, 19)),
        ),
        ("IPv6 payload length 0", edited(&syn6, |b| set16(b, 18, 0))),
    ];
    for (desc, input) in drop {
        refused(&mut lb, desc, input, XDP_DROP, DROP_MALFORMED);
    }
    for (desc, input) in [
        (
            "IPv4 total length shorter than the header (19)",
            edited(&syn4, |b| set16(b, 16, 19)),
        ),
        ("IPv4 total length 0", edited(&syn4, |b| set16(b, 16, 0))),
    ] {
        refused(&mut lb, desc, input, XDP_PASS, PASS_MALFORMED);
    }

    // Bytes after the IP total length are Ethernet padding: balanced, kept as they are.
    let mut padded = to_vip(DSR4, CPORT, TCP_SYN).bytes();
    assert_eq!(
        padded.len(),
        54,
        "a bare IPv4 SYN is under the 60-byte minimum"
    );
    padded.extend_from_slice(&[0xee; 6]);
    forwarded_dsr(
        &mut lb,
        "dsr SYN with 6 bytes of Ethernet padding",
        &padded,
        1,
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );
    let syn = to_vip(NAT4, CPORT + 1, TCP_SYN);
    let mut input = syn.bytes();
    input.extend_from_slice(&[0xee; 6]);
    let run = check(
        &mut lb,
        Fixture {
            desc: "nat SYN with Ethernet padding",
            input,
            action: XDP_TX,
            output: Out::Any,
            counters: &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
        },
    );
    let s = svc(NAT4);
    let port = out_sport(&syn, &run.out);
    let mut expected = retuple(&syn, snat(s.vip), port, s.backend_addr, s.backend_port)
        .macs(LB_MAC, backend_mac(s.backend))
        .bytes();
    expected.extend_from_slice(&[0xee; 6]);
    assert_frames_eq("nat: translated, padding kept", &expected, &run.out);
    assert_checksums_valid("nat: translated with padding", &run.out);
}

#[test]
fn ipv4_header_checksum_is_verified_before_a_flow_opens() {
    let mut lb = world(&[DSR4]);
    let syn = to_vip(DSR4, CPORT, TCP_SYN);
    let mut bad = syn.bytes();
    bad[14 + 10] ^= 0x01;
    refused(
        &mut lb,
        "IPv4 header checksum off by one bit",
        bad,
        XDP_DROP,
        DROP_MALFORMED,
    );

    let mut with_options = to_vip(DSR4, CPORT, TCP_SYN);
    with_options.v4.options = vec![1, 1, 1, 0, 1, 1, 1, 0]; // NOPs, end of options
    let mut bad = with_options.bytes();
    bad[14 + 20 + 2] = 0x07; // inside the options: only the checksum notices
    refused(
        &mut lb,
        "IPv4 options changed after the checksum",
        bad,
        XDP_DROP,
        DROP_MALFORMED,
    );
    forwarded_dsr(
        &mut lb,
        "IPv4 options with a good checksum",
        &with_options.bytes(),
        1,
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );

    // A packet of a pinned flow takes no new state: forwarded, its backend verifies it.
    let mut pinned_bad = to_vip(DSR4, CPORT, TCP_ACK).bytes();
    pinned_bad[14 + 10] ^= 0x01;
    forwarded_dsr(
        &mut lb,
        "bad checksum on a pinned flow",
        &pinned_bad,
        1,
        &[(TX_DSR, 1), (FLOW_HIT, 1)],
    );

    // Off the VIP path the kernel verifies it: lb does not spend the cycles.
    let mut other = Frame::tcp(client4(), CPORT, ip4(10, 0, 0, 7), 80, TCP_SYN)
        .macs(CLIENT_MAC, LB_MAC)
        .bytes();
    other[14 + 10] ^= 0x01;
    refused(
        &mut lb,
        "bad checksum, not for a VIP",
        other,
        XDP_PASS,
        PASS_NOT_VIP,
    );
}

#[test]
fn tcp_data_offset_and_udp_length_must_fit_the_segment() {
    let mut lb = world(&[DSR4, DSR4_UDP, NAT4_UDP]);
    let syn = to_vip(DSR4, CPORT, TCP_SYN);
    let doff = |d: u8| edited(&syn, move |b| b[14 + 20 + 12] = d << 4);
    for (desc, input) in [
        ("TCP data offset 4", doff(4)),
        ("TCP data offset 0", doff(0)),
        ("TCP data offset 6 past a 20-byte segment", doff(6)),
        ("TCP data offset 15", doff(15)),
    ] {
        refused(&mut lb, desc, input, XDP_DROP, DROP_MALFORMED);
    }
    let with_option = to_vip(DSR4, CPORT, TCP_SYN).payload(&[1, 1, 1, 0]);
    forwarded_dsr(
        &mut lb,
        "TCP data offset 6 with 4 option bytes",
        &edited(&with_option, |b| b[14 + 20 + 12] = 6 << 4),
        1,
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );

    let udp = to_vip(DSR4_UDP, CPORT, 0).payload(b"query");
    let ulen = |v: u16| edited(&udp, move |b| set16(b, 14 + 20 + 4, v));
    for (desc, input) in [
        ("UDP length one more than the segment", ulen(14)),
        ("UDP length one less than the segment", ulen(12)),
        ("UDP length 7", ulen(7)),
        ("UDP length 0", ulen(0)),
    ] {
        refused(&mut lb, desc, input, XDP_DROP, DROP_MALFORMED);
    }
    forwarded_dsr(
        &mut lb,
        "UDP length equal to the segment",
        &ulen(13),
        1,
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );

    // The nat reply path applies the same length checks (and passes).
    let port = nat_forward(
        &mut lb,
        "nat UDP query",
        &to_vip(NAT4_UDP, CPORT, 0).payload(b"q"),
        NAT4_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let reply = backend_reply(NAT4_UDP, port, 0).payload(b"answer");
    refused(
        &mut lb,
        "nat reply with a UDP length past its segment",
        edited(&reply, |b| set16(b, 14 + 20 + 4, 8 + 6 + 1)),
        XDP_PASS,
        PASS_MALFORMED,
    );
    refused(
        &mut lb,
        "nat reply with an IPv4 total length past the frame",
        edited(&reply, |b| set16(b, 16, 20 + 8 + 6 + 1)),
        XDP_PASS,
        PASS_MALFORMED,
    );
    nat_reply(
        &mut lb,
        "the well-formed reply is translated",
        &reply,
        NAT4_UDP,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
}

#[test]
fn expiring_ttl_goes_to_the_kernel() {
    let mut lb = world(&[DSR4, NAT4, DSR6]);
    for (desc, id, ttl) in [
        ("dsr IPv4 TTL 1", DSR4, 1u8),
        ("dsr IPv4 TTL 0", DSR4, 0),
        ("nat IPv4 TTL 1", NAT4, 1),
        ("dsr IPv6 hop limit 1", DSR6, 1),
        ("dsr IPv6 hop limit 0", DSR6, 0),
    ] {
        let mut f = to_vip(id, CPORT, TCP_SYN);
        f.ttl = ttl;
        refused(&mut lb, desc, f.bytes(), XDP_PASS, PASS_TTL_EXPIRED);
    }
    let mut f = to_vip(DSR4, CPORT, TCP_SYN);
    f.ttl = 2;
    forwarded_dsr(
        &mut lb,
        "TTL 2 is balanced",
        &f.bytes(),
        1,
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );
}

#[test]
fn sources_that_cannot_be_clients_are_dropped() {
    let mut lb = world(&[DSR4, NAT4, DSR6]);
    let case = |desc: &'static str, id: u32, src: IpAddr| (desc, id, src);
    for (desc, id, src) in [
        case("source = the VIP", DSR4, svc(DSR4).vip),
        case("nat: source = the VIP", NAT4, svc(NAT4).vip),
        case("source 0.0.0.0", DSR4, ip4(0, 0, 0, 0)),
        case("source 0.1.2.3 (this network)", NAT4, ip4(0, 1, 2, 3)),
        case("source 255.255.255.255", DSR4, ip4(255, 255, 255, 255)),
        case("source 224.0.0.5 (multicast)", NAT4, ip4(224, 0, 0, 5)),
        case(
            "source 239.255.255.250 (multicast)",
            DSR4,
            ip4(239, 255, 255, 250),
        ),
        case("source 127.0.0.1", DSR4, ip4(127, 0, 0, 1)),
        case("IPv6 source = the VIP", DSR6, svc(DSR6).vip),
        case("IPv6 source ::", DSR6, ip6("::")),
        case("IPv6 source ::1", DSR6, ip6("::1")),
        case("IPv6 source ff02::1 (multicast)", DSR6, ip6("ff02::1")),
    ] {
        let s = svc(id);
        let f = Frame::tcp(src, CPORT, s.vip, s.port, TCP_SYN).macs(CLIENT_MAC, LB_MAC);
        refused(&mut lb, desc, f.bytes(), XDP_DROP, DROP_BAD_SOURCE);
    }
    let near = Frame::tcp(ip4(223, 255, 255, 255), CPORT, svc(DSR4).vip, 80, TCP_SYN)
        .macs(CLIENT_MAC, LB_MAC);
    forwarded_dsr(
        &mut lb,
        "source 223.255.255.255 is a unicast client",
        &near.bytes(),
        1,
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );
}

#[test]
fn flag_combinations_that_cannot_open_a_connection_take_nothing() {
    let mut lb = world(&[DSR4, NAT4]);
    for id in [DSR4, NAT4] {
        for (desc, flags) in [
            ("SYN+FIN", TCP_SYN | TCP_FIN),
            ("SYN+RST", TCP_SYN | TCP_RST),
            ("SYN+ACK from a client", TCP_SYN | TCP_ACK),
            ("no flags (null scan)", 0),
            ("FIN alone (FIN scan)", TCP_FIN),
            ("FIN+PSH+URG (Xmas scan)", TCP_FIN | TCP_PSH | TCP_URG),
            ("PSH alone", TCP_PSH),
            ("RST without a flow", TCP_RST),
            ("RST+ACK without a flow", TCP_RST | TCP_ACK),
        ] {
            let desc = format!("{}: {desc}", if id == DSR4 { "dsr" } else { "nat" });
            let f = to_vip(id, CPORT, flags);
            refused(&mut lb, &desc, f.bytes(), XDP_DROP, DROP_BAD_FLAGS);
        }
    }

    // A FIN+ACK without a flow is balanced like any ACK (the flow table may have lost the
    // connection; the client would retransmit a dropped FIN forever).
    let fin = to_vip(DSR4, CPORT, TCP_FIN | TCP_ACK);
    forwarded_dsr(
        &mut lb,
        "FIN+ACK without a flow",
        &fin.bytes(),
        1,
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );
    // nat: any segment but a SYN without a flow can make no connection (the backend
    // never saw the source port it would get): dropped, no port taken.
    for (desc, flags) in [
        ("nat: ACK without a flow", TCP_ACK),
        ("nat: FIN+ACK without a flow", TCP_FIN | TCP_ACK),
        ("nat: PSH+ACK without a flow", TCP_PSH | TCP_ACK),
    ] {
        let f = to_vip(NAT4, CPORT, flags);
        refused(&mut lb, desc, f.bytes(), XDP_DROP, DROP_NO_FLOW);
    }
    // An RST of a pinned flow goes to its backend.
    let rst = to_vip(DSR4, CPORT, TCP_RST);
    forwarded_dsr(
        &mut lb,
        "RST of a pinned flow",
        &rst.bytes(),
        1,
        &[(TX_DSR, 1), (FLOW_HIT, 1)],
    );
}
