//! nat: both directions, checksums, port allocation, reverse entries.

use super::prelude::*;
use lb_common::maps::{NAT_H_PENDING, NAT_S_ESTABLISHED};

#[test]
fn nat_ipv4_tcp_forward_and_reply() {
    let mut lb = world(&[NAT4]);
    let syn = to_vip(NAT4, CPORT, TCP_SYN).payload(b"abc");
    let port = nat_forward(
        &mut lb,
        "nat: SYN to 10.0.0.101:80 becomes 10.0.0.2:port -> 10.0.1.12:8080",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let flow = lb.flow(&client_key(NAT4, CPORT)).expect("nat flow entry");
    assert_eq!(flow.backend_id, 2, "pinned to backend 2");
    assert_eq!(
        u16::from_be(flow.nat_port),
        port,
        "flow stores the nat port"
    );
    let range = u32::from(NAT_PORT_MAX - NAT_PORT_MIN) + 1;
    let hash = lb_common::hash::flow_hash(&client_key(NAT4, CPORT), lb_common::hash::SEED_NAT_PORT);
    assert_eq!(
        u32::from(port),
        u32::from(NAT_PORT_MIN) + hash % range,
        "a free range gives the first candidate: min + flow_hash(client, SEED_NAT_PORT) % range"
    );
    let rev = lb
        .nat_entry(&reply_key(NAT4, port))
        .expect("reverse entry keyed by the reply 5-tuple");
    let now = now_nat_seconds();
    assert!(
        rev.last_seen.abs_diff(now) <= 1,
        "reverse entry stamped with the current coarse time ({} vs {now})",
        rev.last_seen
    );
    assert_eq!(
        rev,
        NatValue {
            client_addr: addr_words(client4()),
            vip_addr: addr_words(svc(NAT4).vip),
            client_port: CPORT.to_be(),
            vip_port: 80u16.to_be(),
            backend_id: 2,
            client_mac: CLIENT_MAC,
            state: 0,
            handshake: NAT_H_PENDING,
            last_seen: rev.last_seen,
            _pad2: 0,
        },
        "reverse entry contents"
    );

    let synack = backend_reply(NAT4, port, TCP_SYN | TCP_ACK).payload(b"xyz!");
    nat_reply(
        &mut lb,
        "nat reply: SYN-ACK 10.0.1.12:8080 -> 10.0.0.2:port becomes 10.0.0.101:80 -> client",
        &synack,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(
        lb.backend_stats(2).conn_ok,
        1,
        "SYN-ACK counts conn_ok once"
    );
    assert_eq!(
        lb.nat_entry(&reply_key(NAT4, port))
            .expect("entry")
            .handshake
            & NAT_H_PENDING,
        0,
        "SYN-ACK clears pending (in the reverse entry; the flow learns it from the client)"
    );

    let ack = to_vip(NAT4, CPORT, TCP_ACK).payload(b"GET /");
    let again = nat_forward(
        &mut lb,
        "nat: the next client packet uses the same port",
        &ack,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(again, port, "a pinned nat flow keeps its source port");
    let flow = lb.flow(&client_key(NAT4, CPORT)).expect("flow");
    assert_eq!(
        flow.flags & FLOW_F_SYN_PENDING,
        0,
        "the client's packet settles the flow"
    );

    let data = backend_reply(NAT4, port, TCP_ACK).payload(b"HTTP/1.1 200 OK");
    nat_reply(
        &mut lb,
        "nat reply: data",
        &data,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(
        lb.backend_stats(2).conn_ok,
        1,
        "conn_ok only on the handshake"
    );
}

#[test]
fn nat_ipv4_udp_checksums() {
    let mut lb = world(&[NAT4_UDP]);
    let q = to_vip(NAT4_UDP, CPORT, 0).payload(b"query");
    let port = nat_forward(
        &mut lb,
        "nat: UDP 10.0.0.101:53 becomes 10.0.0.2:port -> 10.0.1.13:5353",
        &q,
        NAT4_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let r = backend_reply(NAT4_UDP, port, 0).payload(b"answer");
    nat_reply(
        &mut lb,
        "nat reply: UDP answer back to the client",
        &r,
        NAT4_UDP,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );

    // UDP/IPv4 without checksum: it stays 0.
    let mut q0 = to_vip(NAT4_UDP, CPORT + 1, 0).payload(b"nocsum");
    q0.transport = Transport::Udp {
        sport: CPORT + 1,
        dport: 53,
        zero_csum: true,
    };
    let port0 = nat_forward(
        &mut lb,
        "nat: UDP/IPv4 with checksum 0 keeps checksum 0",
        &q0,
        NAT4_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );

    // A payload chosen so that the translated checksum computes to 0: it must be sent
    // as 0xffff. The builder fills checksums the same way, so the byte comparison in
    // nat_forward checks it; assert it explicitly too.
    let s = svc(NAT4_UDP);
    let mut payload = vec![0u8, 0u8];
    let probe = retuple(
        &q.clone().payload(&payload),
        snat(s.vip),
        port,
        s.backend_addr,
        5353,
    );
    let l4 = probe.l4_bytes();
    let c = u16::from_be_bytes([l4[6], l4[7]]);
    // Adding `c` to the one's-complement sum turns the checksum into 0 (sent as 0xffff).
    payload.copy_from_slice(&c.to_be_bytes());
    let zero = q.clone().payload(&payload);
    let run_port = nat_forward(
        &mut lb,
        "nat: a translated UDP checksum of 0 is sent as 0xffff",
        &zero,
        NAT4_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(run_port, port);
    let out = lb.run(&zero.bytes()).out;
    let at = zero.l4_offset() + 6;
    assert_eq!(
        [out[at], out[at + 1]],
        [0xff, 0xff],
        "UDP checksum that computes to 0 must be sent as 0xffff"
    );
    let _ = port0;
}

#[test]
fn nat_ipv6_tcp_and_udp() {
    let mut lb = world(&[NAT6, NAT6_UDP]);
    let syn = to_vip(NAT6, CPORT, TCP_SYN).payload(b"v6");
    let port = nat_forward(
        &mut lb,
        "nat: IPv6 SYN to [fd00::101]:443 becomes [fd00::2]:port -> [fd00::12]:8443",
        &syn,
        NAT6,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let synack = backend_reply(NAT6, port, TCP_SYN | TCP_ACK);
    nat_reply(
        &mut lb,
        "nat reply: IPv6 SYN-ACK back to the client",
        &synack,
        NAT6,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(
        lb.backend_stats(5).conn_ok,
        1,
        "IPv6 SYN-ACK counts conn_ok"
    );

    let q = to_vip(NAT6_UDP, CPORT, 0).payload(b"v6 query");
    let uport = nat_forward(
        &mut lb,
        "nat: IPv6 UDP translated",
        &q,
        NAT6_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let r = backend_reply(NAT6_UDP, uport, 0).payload(b"v6 answer");
    nat_reply(
        &mut lb,
        "nat reply: IPv6 UDP back to the client",
        &r,
        NAT6_UDP,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
}

#[test]
fn replies_follow_the_clients_previous_hop_to_its_new_mac() {
    // A router in front of the clients moves to another MAC (a VRRP failover): the
    // client's packets of an established connection come from the new one, and the
    // replies must go there, not to the old MAC, which no longer answers.
    const MOVED_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x3c, 0x02];
    let mut lb = world(&[NAT4]);
    let port = nat_handshake(&mut lb, NAT4, CPORT, &[]);
    // The reverse entry is verified on a flow's first packet of a kernel tick.
    std::thread::sleep(std::time::Duration::from_millis(25));
    nat_forward(
        &mut lb,
        "nat: the client's data, now from the moved router",
        &to_vip(NAT4, CPORT, TCP_ACK)
            .payload(b"GET /")
            .macs(MOVED_MAC, LB_MAC),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    let entry = lb.nat_entry(&reply_key(NAT4, port)).expect("entry");
    assert_eq!(
        entry.client_mac, MOVED_MAC,
        "the entry took the new previous hop"
    );
    let data = backend_reply(NAT4, port, TCP_ACK).payload(b"HTTP/1.1 200 OK");
    let client = client4();
    let s = svc(NAT4);
    check(
        &mut lb,
        Fixture {
            desc: "nat reply: to the new MAC",
            input: data.bytes(),
            action: XDP_TX,
            output: Out::Frame(
                retuple(&data, s.vip, s.port, client, CPORT)
                    .macs(LB_MAC, MOVED_MAC)
                    .bytes(),
            ),
            counters: &[(TX_NAT_REPLY, 1)],
        },
    );
}

#[test]
fn nat_reinserts_an_evicted_reverse_entry() {
    let mut lb = world(&[NAT4]);
    let syn = to_vip(NAT4, CPORT, TCP_SYN);
    let port = nat_forward(
        &mut lb,
        "nat: first packet",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    lb.remove_nat(&reply_key(NAT4, port));
    // A pinned flow verifies its reverse entry once per kernel tick (1/CONFIG_HZ s, at
    // most 10 ms): the next packet must come in a later tick.
    std::thread::sleep(std::time::Duration::from_millis(25));
    let ack = to_vip(NAT4, CPORT, TCP_ACK);
    let again = nat_forward(
        &mut lb,
        "nat: packet (a tick later) after the reverse entry was evicted",
        &ack,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(again, port, "same port re-claimed");
    assert!(
        lb.nat_entry(&reply_key(NAT4, port)).is_some(),
        "the reverse entry must be back"
    );
}

/// `lb_common::maps::nat_seconds` of CLOCK_MONOTONIC now (the clock of bpf_ktime_get_ns).
pub fn now_nat_seconds() -> u32 {
    lb_tests::bpf::clock::nat_seconds_now()
}

/// A TCP service with a single source port (30000) toward one backend, plus the key of
/// that port's reverse entry.
fn one_port_service(lb: &mut Lb) -> (std::net::IpAddr, FlowKey) {
    one_port_service_of(lb, IPPROTO_TCP)
}

/// [`one_port_service`] of protocol `proto`.
pub fn one_port_service_of(lb: &mut Lb, proto: u8) -> (std::net::IpAddr, FlowKey) {
    let vip = ip4(10, 0, 0, 103);
    lb.add_service(
        vip,
        80,
        proto,
        ServiceMeta {
            service_id: 9,
            flags: SERVICE_F_NAT,
            snat_addrs: [addr_words(ip4(10, 0, 0, 2)), [0; 4], [0; 4], [0; 4]],
            snat_count: 1,
            nat_port_min: 30000,
            nat_port_max: 30000,
            ..ServiceMeta::default()
        },
    );
    lb.set_backend(9, backend(ip4(10, 0, 1, 19), 80, 9, 9));
    lb.set_maglev_all(9, 9);
    let key = flow_key(ip4(10, 0, 1, 19), 80, ip4(10, 0, 0, 2), 30000, proto);
    (vip, key)
}

#[test]
fn nat_drops_when_every_port_is_taken() {
    let mut lb = world(&[]);
    // The only port is held by an open connection that carried a packet just now.
    let (vip, taken) = one_port_service(&mut lb);
    lb.insert_nat(
        taken,
        NatValue {
            state: NAT_S_ESTABLISHED,
            last_seen: now_nat_seconds(),
            ..NatValue::default()
        },
    );
    let syn = Frame::tcp(client4(), CPORT, vip, 80, TCP_SYN).macs(CLIENT_MAC, LB_MAC);
    check(
        &mut lb,
        Fixture {
            desc: "nat: the only source port is taken -> drop",
            input: syn.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_NAT_PORTS, 1)],
        },
    );
    assert!(
        lb.flow(&flow_key(client4(), CPORT, vip, 80, IPPROTO_TCP))
            .is_none(),
        "no flow entry for a flow that could not be translated"
    );
}

/// A nat SYN reads its `LB_FLOWS` bucket and its first candidate's `LB_NAT` bucket before
/// choosing (`nat::prefetch_open`): with a Maglev slot naming no backend, a backend of
/// the other family or an empty port range, those early reads change nothing — the same
/// drop and counter as before, no flow and no reverse entry written.
#[test]
fn nat_syn_early_bucket_reads_leave_bad_choices_as_they_were() {
    let mut lb = world(&[]);
    let (vip, _) = one_port_service(&mut lb);
    let syn = Frame::tcp(client4(), CPORT, vip, 80, TCP_SYN).macs(CLIENT_MAC, LB_MAC);
    let client = flow_key(client4(), CPORT, vip, 80, IPPROTO_TCP);
    // The SYN is dropped with `counter`, and nothing is written.
    let dropped = |lb: &mut Lb, desc: &'static str, counter| {
        check(
            lb,
            Fixture {
                desc,
                input: syn.bytes(),
                action: XDP_DROP,
                output: Out::Any,
                counters: &[(counter, 1)],
            },
        );
        assert!(lb.flow(&client).is_none(), "{desc}: no flow entry");
        assert_eq!(lb.nat_count(), 0, "{desc}: no reverse entry");
    };

    lb.set_maglev_all(9, MAX_BACKENDS + 5);
    dropped(
        &mut lb,
        "nat SYN, Maglev slot outside LB_BACKENDS -> drop",
        DROP_BAD_BACKEND,
    );

    lb.set_backend(9, backend(ip6("fd00:1::19"), 80, 9, 9));
    lb.set_maglev_all(9, 9);
    dropped(
        &mut lb,
        "nat SYN from IPv4 to an IPv6 backend -> drop",
        DROP_BAD_BACKEND,
    );

    lb.set_backend(9, backend(ip4(10, 0, 1, 19), 80, 9, 9));
    let mut meta = lb.service_meta(vip, 80, IPPROTO_TCP).expect("service 9");
    (meta.nat_port_min, meta.nat_port_max) = (30001, 30000);
    lb.add_service(vip, 80, IPPROTO_TCP, meta);
    dropped(&mut lb, "nat SYN, empty port range -> drop", DROP_NAT_PORTS);
}

#[test]
fn nat_notes_fin_and_rst_on_both_sides() {
    use lb_common::maps::{NAT_S_ACKED, NAT_S_FIN_BACKEND, NAT_S_FIN_CLIENT, NAT_S_RST};
    let mut lb = world(&[NAT4]);
    let port = nat_forward(
        &mut lb,
        "nat: SYN",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let key = reply_key(NAT4, port);
    assert_eq!(lb.nat_entry(&key).unwrap().state, 0);
    nat_reply(
        &mut lb,
        "nat reply: SYN-ACK",
        &backend_reply(NAT4, port, TCP_SYN | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(
        lb.nat_entry(&key).unwrap().state,
        NAT_S_ESTABLISHED,
        "SYN-ACK noted"
    );
    nat_forward(
        &mut lb,
        "nat: client FIN",
        &to_vip(NAT4, CPORT, TCP_FIN | TCP_ACK),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(
        lb.nat_entry(&key).unwrap().state,
        NAT_S_ESTABLISHED | NAT_S_ACKED | NAT_S_FIN_CLIENT,
        "the client's FIN, which also acknowledges the SYN-ACK, noted"
    );
    nat_reply(
        &mut lb,
        "nat reply: backend FIN",
        &backend_reply(NAT4, port, TCP_FIN | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(
        lb.nat_entry(&key).unwrap().state,
        NAT_S_ESTABLISHED | NAT_S_ACKED | NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND,
        "backend FIN noted (second: no NAT_S_BACKEND_FIRST)"
    );
    nat_reply(
        &mut lb,
        "nat reply: backend RST",
        &backend_reply(NAT4, port, TCP_RST),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_ne!(
        lb.nat_entry(&key).unwrap().state & NAT_S_RST,
        0,
        "RST noted"
    );
}

#[test]
fn nat_keeps_the_vlan_tag() {
    let mut lb = world(&[NAT4]);
    let syn = to_vip(NAT4, CPORT, TCP_SYN).vlan(42);
    let port = nat_forward(
        &mut lb,
        "nat: VLAN-tagged SYN translated behind its tag",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let synack = backend_reply(NAT4, port, TCP_SYN | TCP_ACK).vlan(42);
    nat_reply(
        &mut lb,
        "nat reply: VLAN-tagged SYN-ACK",
        &synack,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
}
