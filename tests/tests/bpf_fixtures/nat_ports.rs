//! nat port lifecycle (docs/nat-ports.md): when each kind of entry gives its port back,
//! how packets move an entry through the states, fresh ports before reclaimed ones,
//! several SNAT addresses, the per-source bucket and the port-pressure counters.

use super::nat::{now_nat_seconds, one_port_service_of};
use super::prelude::*;
use lb_common::maps::{
    NAT_CLOSED_REUSE, NAT_HALF_OPEN_REUSE, NAT_S_ACKED, NAT_S_ASSURED, NAT_S_BACKEND_FIRST,
    NAT_S_ESTABLISHED, NAT_S_FIN_BACKEND, NAT_S_FIN_CLIENT, NAT_S_REPLIED, NAT_S_RST,
    NAT_TCP_IDLE_REUSE, NAT_TIME_WAIT_REUSE, NAT_UDP_ASSURED_REUSE, NAT_UDP_REUSE,
    NAT_UNANSWERED_REUSE, nat_reuse_after,
};

use lb_common::{NAT_HANDSHAKE_DISPLACE, NAT_PORT_ATTEMPTS};

const EST: u8 = NAT_S_ESTABLISHED | NAT_S_ACKED;
const BOTH_FINS: u8 = NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND;

/// Every row of the lifecycle table: (row, protocol, state, held for).
const LIFECYCLE: [(&str, u8, u8, u32); 14] = [
    (
        "tcp: SYN never answered",
        IPPROTO_TCP,
        0,
        NAT_UNANSWERED_REUSE,
    ),
    (
        "tcp: half-open",
        IPPROTO_TCP,
        NAT_S_ESTABLISHED,
        NAT_HALF_OPEN_REUSE,
    ),
    ("tcp: established", IPPROTO_TCP, EST, NAT_TCP_IDLE_REUSE),
    (
        "tcp: client half-closed",
        IPPROTO_TCP,
        EST | NAT_S_FIN_CLIENT,
        NAT_TCP_IDLE_REUSE,
    ),
    (
        "tcp: backend half-closed",
        IPPROTO_TCP,
        EST | NAT_S_FIN_BACKEND | NAT_S_BACKEND_FIRST,
        NAT_TCP_IDLE_REUSE,
    ),
    (
        "tcp: closed, client first",
        IPPROTO_TCP,
        EST | BOTH_FINS,
        NAT_CLOSED_REUSE,
    ),
    (
        "tcp: closed, backend first",
        IPPROTO_TCP,
        EST | BOTH_FINS | NAT_S_BACKEND_FIRST,
        NAT_TIME_WAIT_REUSE,
    ),
    (
        "tcp: reset before the handshake",
        IPPROTO_TCP,
        NAT_S_RST,
        NAT_CLOSED_REUSE,
    ),
    (
        "tcp: reset while established",
        IPPROTO_TCP,
        EST | NAT_S_RST,
        NAT_CLOSED_REUSE,
    ),
    (
        "tcp: reset after the backend's FIN only",
        IPPROTO_TCP,
        EST | NAT_S_FIN_BACKEND | NAT_S_BACKEND_FIRST | NAT_S_RST,
        NAT_CLOSED_REUSE,
    ),
    (
        "tcp: reset on a half-open entry",
        IPPROTO_TCP,
        NAT_S_ESTABLISHED | NAT_S_RST,
        NAT_CLOSED_REUSE,
    ),
    ("udp: no reply", IPPROTO_UDP, 0, NAT_UDP_REUSE),
    (
        "udp: replied once",
        IPPROTO_UDP,
        NAT_S_REPLIED,
        NAT_UDP_REUSE,
    ),
    (
        "udp: assured",
        IPPROTO_UDP,
        NAT_S_REPLIED | NAT_S_ASSURED,
        NAT_UDP_ASSURED_REUSE,
    ),
];

/// The current coarse second, read where the next one is at least 50 ms away: a
/// fixture that ages an entry to the edge of its rule must not see the second change.
fn steady_nat_seconds() -> u32 {
    const COARSE_NS: u64 = 1 << 30;
    loop {
        let ns = lb_tests::bpf::clock::monotonic_ns();
        let left = COARSE_NS - ns % COARSE_NS;
        if left > 50_000_000 {
            return now_nat_seconds();
        }
        std::thread::sleep(std::time::Duration::from_nanos(left + 1_000_000));
    }
}

fn first_packet(vip: IpAddr, proto: u8, sport: u16) -> Frame {
    let f = if proto == IPPROTO_TCP {
        Frame::tcp(client4(), sport, vip, 80, TCP_SYN)
    } else {
        Frame::udp(client4(), sport, vip, 80)
    };
    f.macs(CLIENT_MAC, LB_MAC)
}

#[test]
fn every_lifecycle_row_holds_its_port_exactly_as_long_as_the_table_says() {
    for (row, proto, state, row_after) in LIFECYCLE {
        assert_eq!(nat_reuse_after(state, proto), row_after, "{row}: the rule");
        // A TCP entry still waiting for its handshake gives its pair to a new TCP flow
        // whose other candidates are held (here: its only one) once silent for
        // `NAT_HANDSHAKE_DISPLACE`, before its row's time (docs/nat-ports.md,
        // "Spoofed SYN floods").
        let after = if proto == IPPROTO_TCP && state & !NAT_S_ESTABLISHED == 0 {
            NAT_HANDSHAKE_DISPLACE
        } else {
            row_after
        };
        let mut lb = world(&[]);
        let (vip, taken) = one_port_service_of(&mut lb, proto);
        let holder = NatValue {
            client_port: 1234u16.to_be(),
            state,
            ..NatValue::default()
        };
        let now = steady_nat_seconds();
        lb.insert_nat(
            taken,
            NatValue {
                last_seen: now.wrapping_sub(after - 1),
                ..holder
            },
        );
        let pkt = first_packet(vip, proto, CPORT);
        check(
            &mut lb,
            Fixture {
                desc: &format!("{row}: idle {} s: the port is held", after - 1),
                input: pkt.bytes(),
                action: XDP_DROP,
                output: Out::Any,
                counters: &[(DROP_NAT_PORTS, 1)],
            },
        );
        assert_eq!(
            lb.nat_entry(&taken).expect("entry").client_port,
            holder.client_port,
            "{row}: still the old connection's"
        );
        let now = steady_nat_seconds();
        lb.insert_nat(
            taken,
            NatValue {
                last_seen: now.wrapping_sub(after),
                ..holder
            },
        );
        check(
            &mut lb,
            Fixture {
                desc: &format!("{row}: idle {after} s: the port is reclaimed"),
                input: pkt.bytes(),
                action: XDP_TX,
                output: Out::Any,
                counters: &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_RECLAIMED, 1)],
            },
        );
        let now_owner = lb.nat_entry(&taken).expect("entry");
        assert_eq!(
            (now_owner.client_port, now_owner.state),
            (CPORT.to_be(), 0),
            "{row}: the new flow's, from the start"
        );
    }
}

fn state_of(lb: &Lb, port: u16) -> u8 {
    lb.nat_entry(&reply_key(NAT4, port))
        .expect("reverse entry")
        .state
}

/// Opens a NAT4 connection from `cport` through the handshake; returns its port.
fn established(lb: &mut Lb, cport: u16) -> u16 {
    let port = nat_forward(
        lb,
        "SYN",
        &to_vip(NAT4, cport, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    assert_eq!(state_of(lb, port), 0, "SYN: unanswered");
    nat_reply(
        lb,
        "SYN-ACK",
        &backend_reply(NAT4, port, TCP_SYN | TCP_ACK),
        NAT4,
        cport,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(state_of(lb, port), NAT_S_ESTABLISHED, "SYN-ACK: half-open");
    assert_eq!(
        lb.nat_entry(&reply_key(NAT4, port))
            .expect("entry")
            .handshake,
        0,
        "the handshake answered: the client's ACK is awaited (NAT_S_ESTABLISHED only)"
    );
    nat_forward(
        lb,
        "the client's ACK",
        &to_vip(NAT4, cport, TCP_ACK),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(state_of(lb, port), EST, "ACK: established");
    let flow = lb.flow(&client_key(NAT4, cport)).expect("flow");
    assert_eq!(flow.flags & FLOW_F_NAT_AWAIT, 0, "no longer awaited");
    port
}

#[test]
fn packets_move_a_tcp_entry_through_the_lifecycle() {
    let mut lb = world(&[NAT4]);

    // Backend closes first: its TIME_WAIT holds the port.
    let port = established(&mut lb, CPORT);
    nat_reply(
        &mut lb,
        "backend FIN first",
        &backend_reply(NAT4, port, TCP_FIN | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(
        state_of(&lb, port),
        EST | NAT_S_FIN_BACKEND | NAT_S_BACKEND_FIRST
    );
    nat_forward(
        &mut lb,
        "client FIN second",
        &to_vip(NAT4, CPORT, TCP_FIN | TCP_ACK),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    let tw = EST | BOTH_FINS | NAT_S_BACKEND_FIRST;
    assert_eq!(state_of(&lb, port), tw);
    assert_eq!(nat_reuse_after(tw, IPPROTO_TCP), NAT_TIME_WAIT_REUSE);
    nat_forward(
        &mut lb,
        "a client RST after the close",
        &to_vip(NAT4, CPORT, TCP_RST),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(
        state_of(&lb, port),
        tw,
        "an RST after a completed backend-first close does not shorten TIME_WAIT"
    );

    // Client closes first: quick reuse.
    let port2 = established(&mut lb, CPORT + 1);
    nat_forward(
        &mut lb,
        "client FIN first",
        &to_vip(NAT4, CPORT + 1, TCP_FIN | TCP_ACK),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    nat_reply(
        &mut lb,
        "backend FIN second",
        &backend_reply(NAT4, port2, TCP_FIN | TCP_ACK),
        NAT4,
        CPORT + 1,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(state_of(&lb, port2), EST | BOTH_FINS);
    assert_eq!(
        nat_reuse_after(EST | BOTH_FINS, IPPROTO_TCP),
        NAT_CLOSED_REUSE
    );

    // Backend FIN, then a reset before the client's FIN: no TIME_WAIT anywhere.
    let port3 = established(&mut lb, CPORT + 2);
    nat_reply(
        &mut lb,
        "backend FIN",
        &backend_reply(NAT4, port3, TCP_FIN | TCP_ACK),
        NAT4,
        CPORT + 2,
        &[(TX_NAT_REPLY, 1)],
    );
    nat_forward(
        &mut lb,
        "client RST instead of its FIN",
        &to_vip(NAT4, CPORT + 2, TCP_RST),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_ne!(state_of(&lb, port3) & NAT_S_RST, 0, "reset noted");
}

#[test]
fn a_backends_syn_ack_retransmissions_do_not_keep_a_half_open_entry() {
    let mut lb = world(&[NAT4]);
    let port = nat_forward(
        &mut lb,
        "spoofed-looking SYN",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let synack = backend_reply(NAT4, port, TCP_SYN | TCP_ACK);
    nat_reply(
        &mut lb,
        "SYN-ACK",
        &synack,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    let key = reply_key(NAT4, port);
    let mut v = lb.nat_entry(&key).expect("entry");
    let old = v.last_seen.wrapping_sub(NAT_HALF_OPEN_REUSE - 2);
    v.last_seen = old;
    lb.insert_nat(key, v);
    nat_reply(
        &mut lb,
        "the backend retransmits its SYN-ACK",
        &synack,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(
        lb.nat_entry(&key).expect("entry").last_seen,
        old,
        "half-open: only the client's packets refresh the entry"
    );
}

#[test]
fn packets_make_a_udp_entry_replied_then_assured() {
    let mut lb = world(&[NAT4_UDP]);
    let q = to_vip(NAT4_UDP, CPORT, 0).payload(b"q1");
    let port = nat_forward(
        &mut lb,
        "query",
        &q,
        NAT4_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let key = reply_key(NAT4_UDP, port);
    assert_eq!(lb.nat_entry(&key).unwrap().state, 0, "unreplied");
    nat_reply(
        &mut lb,
        "answer",
        &backend_reply(NAT4_UDP, port, 0).payload(b"a1"),
        NAT4_UDP,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(lb.nat_entry(&key).unwrap().state, NAT_S_REPLIED);
    let flow = lb.flow(&client_key(NAT4_UDP, CPORT)).expect("flow");
    assert_eq!(flow.flags & FLOW_F_NAT_AWAIT, FLOW_F_NAT_AWAIT);
    nat_forward(
        &mut lb,
        "the client's next datagram",
        &q,
        NAT4_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(
        lb.nat_entry(&key).unwrap().state,
        NAT_S_REPLIED | NAT_S_ASSURED,
        "assured"
    );
    let flow = lb.flow(&client_key(NAT4_UDP, CPORT)).expect("flow");
    assert_eq!(flow.flags & FLOW_F_NAT_AWAIT, 0);
}

/// The backend's FIN first, then the client's: the entry of `CPORT`'s connection on
/// `port` ends in row 6 (the backend's TIME_WAIT).
fn close_backend_first(lb: &mut Lb, port: u16) {
    nat_reply(
        lb,
        "backend FIN first",
        &backend_reply(NAT4, port, TCP_FIN | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    nat_forward(
        lb,
        "client FIN",
        &to_vip(NAT4, CPORT, TCP_FIN | TCP_ACK),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
}

#[test]
fn a_new_connection_on_a_tuple_in_the_backends_time_wait_gets_a_fresh_port() {
    let mut lb = world(&[NAT4]);
    let port = established(&mut lb, CPORT);
    close_backend_first(&mut lb, port);
    let fresh = nat_forward(
        &mut lb,
        "the client reuses its 5-tuple for a new connection",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (NAT_PORT_RETRIED, 1)],
    );
    assert_ne!(fresh, port, "not into the backend's TIME_WAIT");
    assert_eq!(
        state_of(&lb, port),
        EST | BOTH_FINS | NAT_S_BACKEND_FIRST,
        "the old entry keeps the old port until TIME_WAIT is over"
    );
    assert_eq!(state_of(&lb, fresh), 0, "the new connection's entry");
    let flow = lb.flow(&client_key(NAT4, CPORT)).expect("flow");
    assert_eq!(u16::from_be(flow.nat_port), fresh, "the flow moved");
    nat_reply(
        &mut lb,
        "the new connection's SYN-ACK comes back through the fresh port",
        &backend_reply(NAT4, fresh, TCP_SYN | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
}

/// A client that reuses its 5-tuple for one connection after another, each closed by the
/// backend first (Linux clients do: a source port whose peer closed first is free again
/// at once, and `connect` hands it out again within seconds), fills the
/// `NAT_PORT_ATTEMPTS` candidates of the allocation's first pass with pairs waiting out
/// the backend's TIME_WAIT, then the second pass's first. Its next SYN gets that pair
/// back — the backend sees that client reuse its own 4-tuple, as it would without lb in
/// between — instead of being refused (`drop_nat_ports`) or walking on.
#[test]
fn a_client_reusing_its_5_tuple_past_its_candidates_gets_its_own_pair_back() {
    let mut lb = world(&[NAT4]);
    let mut held = vec![established(&mut lb, CPORT)];
    loop {
        let port = *held.last().expect("a connection");
        close_backend_first(&mut lb, port);
        if held.len() == NAT_PORT_ATTEMPTS as usize + 1 {
            break;
        }
        let fresh = nat_forward(
            &mut lb,
            &format!("the client reuses its 5-tuple ({} held)", held.len()),
            &to_vip(NAT4, CPORT, TCP_SYN),
            NAT4,
            &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (NAT_PORT_RETRIED, 1)],
        );
        assert!(!held.contains(&fresh), "a fresh pair while one is free");
        nat_reply(
            &mut lb,
            "SYN-ACK",
            &backend_reply(NAT4, fresh, TCP_SYN | TCP_ACK),
            NAT4,
            CPORT,
            &[(TX_NAT_REPLY, 1)],
        );
        nat_forward(
            &mut lb,
            "the client's ACK",
            &to_vip(NAT4, CPORT, TCP_ACK),
            NAT4,
            &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
        );
        held.push(fresh);
    }
    for &p in &held {
        assert_eq!(
            state_of(&lb, p),
            EST | BOTH_FINS | NAT_S_BACKEND_FIRST,
            "port {p}: in the backend's TIME_WAIT"
        );
    }
    let again = nat_forward(
        &mut lb,
        "the client reuses its 5-tuple once more",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (NAT_PORT_RECLAIMED, 1)],
    );
    assert_eq!(
        again, held[NAT_PORT_ATTEMPTS as usize],
        "its own pair, the second pass's first, not a refusal"
    );
    assert_eq!(
        state_of(&lb, again),
        0,
        "the new connection's entry starts over"
    );
    nat_reply(
        &mut lb,
        "the new connection's SYN-ACK comes back through it",
        &backend_reply(NAT4, again, TCP_SYN | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(lb.counters()[DROP_NAT_PORTS as usize], 0, "nothing refused");
}

/// A client reusing its 5-tuple faster than the backend's TIME_WAIT ends, whose other
/// 15 candidates are all held by other clients' connections in the backend's TIME_WAIT
/// (rows nobody may take over), gets its own pair back: the walk's last candidate is the
/// pair the flow held. Without it the SYN and its resends were refused
/// (`drop_nat_ports`): `netns_chaos` saw one such connection time out in about one run
/// of three, its client ports coming back every 15 s at 200 connections a second.
#[test]
fn a_client_whose_candidates_others_hold_gets_its_own_pair_back() {
    let mut lb = world(&[NAT4]);
    let own = established(&mut lb, CPORT);
    close_backend_first(&mut lb, own);
    let s = svc(NAT4);
    let client = flow_key(client4(), CPORT, s.vip, s.port, IPPROTO_TCP);
    let h = lb_common::hash::flow_hash(&client, lb_common::hash::SEED_NAT_PORT);
    let (min, range) = (
        NAT_PORT_MIN as u32,
        (NAT_PORT_MAX - NAT_PORT_MIN) as u32 + 1,
    );
    let stride = lb_common::nat_stride(h, range);
    let candidates: Vec<u16> = (0..2 * NAT_PORT_ATTEMPTS)
        .map(|i| (min + (h % range + i * stride) % range) as u16)
        .collect();
    assert_eq!(
        candidates[0], own,
        "the first pass took the first candidate"
    );
    for (i, &port) in candidates.iter().enumerate().skip(1) {
        let other = NatValue {
            client_port: (CPORT + 1 + i as u16).to_be(),
            state: EST | BOTH_FINS | NAT_S_BACKEND_FIRST,
            last_seen: now_nat_seconds(),
            ..NatValue::default()
        };
        lb.insert_nat(reply_key(NAT4, port), other);
    }
    let again = nat_forward(
        &mut lb,
        "the client reuses its 5-tuple, every other candidate held",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (NAT_PORT_RECLAIMED, 1)],
    );
    assert_eq!(again, own, "its own pair, not a refusal");
    assert_eq!(
        state_of(&lb, again),
        0,
        "the new connection's entry starts over"
    );
    for &port in &candidates[1..] {
        assert_ne!(
            lb.nat_entry(&reply_key(NAT4, port))
                .expect("held")
                .client_port,
            CPORT.to_be(),
            "port {port}: another client's entry is left alone"
        );
    }
    assert_eq!(lb.counters()[DROP_NAT_PORTS as usize], 0, "nothing refused");
}

/// A nat TCP service 10.0.0.104:80 toward backend 20 with `snat` addresses, ports
/// `ports`, per-source `interval_ns`/`burst`.
pub(super) fn custom_service(
    lb: &mut Lb,
    snat: &[IpAddr],
    ports: (u16, u16),
    interval_ns: u32,
    burst: u32,
) -> IpAddr {
    let vip = ip4(10, 0, 0, 104);
    let mut snat_addrs = [[0u32; 4]; 4];
    for (slot, ip) in snat_addrs.iter_mut().zip(snat) {
        *slot = addr_words(*ip);
    }
    lb.add_service(
        vip,
        80,
        IPPROTO_TCP,
        ServiceMeta {
            service_id: 10,
            flags: SERVICE_F_NAT,
            snat_addrs,
            snat_count: snat.len() as u32,
            nat_port_min: ports.0,
            nat_port_max: ports.1,
            source_interval_ns: interval_ns,
            source_burst: burst,
            ..ServiceMeta::default()
        },
    );
    lb.set_backend(20, backend(ip4(10, 0, 1, 20), 80, 20, 10));
    lb.set_maglev_all(10, 20);
    vip
}

pub(super) fn syn_from(client: IpAddr, sport: u16, vip: IpAddr) -> Frame {
    Frame::tcp(client, sport, vip, 80, TCP_SYN).macs(CLIENT_MAC, LB_MAC)
}

/// [`check`]s a SYN from `client` to `vip`:80 for `action` and `counters`, output not
/// compared.
pub(super) fn check_syn(
    lb: &mut Lb,
    desc: &str,
    client: (IpAddr, u16),
    vip: IpAddr,
    action: u32,
    counters: &[(u32, u64)],
) -> Run {
    check(
        lb,
        Fixture {
            desc,
            input: syn_from(client.0, client.1, vip).bytes(),
            action,
            output: Out::Any,
            counters,
        },
    )
}

#[test]
fn allocation_takes_a_fresh_port_before_a_reclaimable_one() {
    let mut lb = world(&[]);
    let vip = custom_service(&mut lb, &[ip4(10, 0, 0, 2)], (30000, 30001), 0, 1);
    let client = flow_key(client4(), CPORT, vip, 80, IPPROTO_TCP);
    let h = lb_common::hash::flow_hash(&client, lb_common::hash::SEED_NAT_PORT);
    let first = 30000 + (h % 2) as u16;
    let other = 30000 + 30001 - first;
    let key = |port| flow_key(ip4(10, 0, 1, 20), 80, ip4(10, 0, 0, 2), port, IPPROTO_TCP);
    let closed = NatValue {
        client_port: 1234u16.to_be(),
        state: EST | BOTH_FINS,
        last_seen: now_nat_seconds().wrapping_sub(NAT_CLOSED_REUSE + 1),
        ..NatValue::default()
    };
    lb.insert_nat(key(first), closed);
    let run = check_syn(
        &mut lb,
        "first candidate reclaimable, second free: the free one",
        (client4(), CPORT),
        vip,
        XDP_TX,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_RETRIED, 1)],
    );
    let f = syn_from(client4(), CPORT, vip);
    assert_eq!(out_sport(&f, &run.out), other);
    assert_eq!(
        lb.nat_entry(&key(first)).unwrap().client_port,
        1234u16.to_be(),
        "the reclaimable entry is left alone"
    );
    check_syn(
        &mut lb,
        "nothing free: now the reclaimable one",
        (client4(), CPORT + 1),
        vip,
        XDP_TX,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_RECLAIMED, 1)],
    );
    check_syn(
        &mut lb,
        "nothing free nor reclaimable",
        (client4(), CPORT + 2),
        vip,
        XDP_DROP,
        &[(DROP_NAT_PORTS, 1)],
    );
}

/// A new flow's candidates are distinct pairs whatever its hash. A stride drawn from the
/// whole space (`1 + (h >> 16) % (total - 1)`) would not do: a client whose hash drew
/// half the space would try 2 pairs 4 times each and, with those 2 held by other
/// clients, be refused while most pairs were free (23 of a Linux client's 28,232
/// ephemeral ports draw such a short cycle toward one VIP with 10,000 ports).
#[test]
fn a_new_flows_candidates_are_distinct_pairs_whatever_its_hash() {
    let mut lb = world(&[]);
    let snat = ip4(10, 0, 0, 2);
    let vip = custom_service(&mut lb, &[snat], (30000, 30009), 0, 1);
    // A client port whose hash draws the old rule's stride of 5 in this space of 10.
    let (cport, h) = (CPORT..)
        .map(|p| {
            let key = flow_key(client4(), p, vip, 80, IPPROTO_TCP);
            (
                p,
                lb_common::hash::flow_hash(&key, lb_common::hash::SEED_NAT_PORT),
            )
        })
        .find(|(_, h)| 1 + (h >> 16) % 9 == 5)
        .expect("a client port with that hash");
    let held = [h % 10, (h + 5) % 10].map(|off| 30000 + off as u16);
    let key = |port| flow_key(ip4(10, 0, 1, 20), 80, snat, port, IPPROTO_TCP);
    let live = NatValue {
        client_port: 1234u16.to_be(),
        state: EST,
        last_seen: now_nat_seconds(),
        ..NatValue::default()
    };
    for port in held {
        lb.insert_nat(key(port), live);
    }
    let run = check_syn(
        &mut lb,
        "2 of 10 pairs held, among them the old rule's only 2 candidates",
        (client4(), cport),
        vip,
        XDP_TX,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_RETRIED, 1)],
    );
    let port = out_sport(&syn_from(client4(), cport, vip), &run.out);
    assert!(
        (30000..=30009).contains(&port) && !held.contains(&port),
        "a free pair: {port}, held {held:?}"
    );
}

#[test]
fn flows_spread_over_several_snat_addresses() {
    let mut lb = world(&[]);
    let snat = [ip4(10, 0, 0, 2), ip4(10, 0, 0, 3)];
    // One port per address: two (address, port) pairs in all.
    let vip = custom_service(&mut lb, &snat, (30000, 30000), 0, 1);
    let mut used: Vec<(IpAddr, u16)> = Vec::new();
    for cport in [CPORT, CPORT + 1] {
        let f = syn_from(client4(), cport, vip);
        let h = lb_common::hash::flow_hash(
            &flow_key(client4(), cport, vip, 80, IPPROTO_TCP),
            lb_common::hash::SEED_NAT_PORT,
        );
        // The first candidate of the combined space (2 addresses x 1 port) is h % 2.
        let first_free = !used.iter().any(|(ip, _)| *ip == snat[(h % 2) as usize]);
        let run = check(
            &mut lb,
            Fixture {
                desc: "a new flow",
                input: f.bytes(),
                action: XDP_TX,
                output: Out::Any,
                counters: &[
                    (TX_NAT_FORWARD, 1),
                    (FLOW_NEW, 1),
                    (
                        if first_free {
                            NAT_PORT_FIRST
                        } else {
                            NAT_PORT_RETRIED
                        },
                        1,
                    ),
                ],
            },
        );
        let at = f.l3_offset() + 12; // IPv4 source address
        let src = IpAddr::from([
            run.out[at],
            run.out[at + 1],
            run.out[at + 2],
            run.out[at + 3],
        ]);
        assert!(snat.contains(&src), "source {src} is a snat address");
        assert_eq!(out_sport(&f, &run.out), 30000);
        let expected = retuple(&f, src, 30000, ip4(10, 0, 1, 20), 80)
            .macs(LB_MAC, backend_mac(20))
            .bytes();
        assert_frames_eq("translated from the chosen address", &expected, &run.out);
        assert_checksums_valid("several snat addresses", &run.out);
        used.push((src, cport));
    }
    assert_ne!(
        used[0].0, used[1].0,
        "the second flow took the other address"
    );
    for (src, cport) in &used {
        let reply = Frame::tcp(ip4(10, 0, 1, 20), 80, *src, 30000, TCP_SYN | TCP_ACK)
            .macs(backend_mac(20), LB_MAC);
        let expected = retuple(&reply, vip, 80, client4(), *cport)
            .macs(LB_MAC, CLIENT_MAC)
            .bytes();
        check(
            &mut lb,
            Fixture {
                desc: "a reply to either address finds its client",
                input: reply.bytes(),
                action: XDP_TX,
                output: Out::Frame(expected),
                counters: &[(TX_NAT_REPLY, 1)],
            },
        );
    }
    check_syn(
        &mut lb,
        "both pairs taken",
        (client4(), CPORT + 2),
        vip,
        XDP_DROP,
        &[(DROP_NAT_PORTS, 1)],
    );
}

#[test]
fn one_source_cannot_open_more_than_its_bucket() {
    let mut lb = world(&[]);
    // One new flow per second on average, three at once.
    let vip = custom_service(
        &mut lb,
        &[ip4(10, 0, 0, 2)],
        (30000, 30999),
        1_000_000_000,
        3,
    );
    for i in 0..3 {
        check_syn(
            &mut lb,
            "within the burst",
            (client4(), CPORT + i),
            vip,
            XDP_TX,
            &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
        );
    }
    check_syn(
        &mut lb,
        "the fourth new flow at once: refused",
        (client4(), CPORT + 3),
        vip,
        XDP_DROP,
        &[(DROP_SOURCE_LIMIT, 1)],
    );
    assert!(
        lb.flow(&flow_key(client4(), CPORT + 3, vip, 80, IPPROTO_TCP))
            .is_none(),
        "a refused flow is not pinned"
    );
    check(
        &mut lb,
        Fixture {
            desc: "the same source's pinned flows go on",
            input: Frame::tcp(client4(), CPORT, vip, 80, TCP_ACK)
                .macs(CLIENT_MAC, LB_MAC)
                .bytes(),
            action: XDP_TX,
            output: Out::Any,
            counters: &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
        },
    );
    check_syn(
        &mut lb,
        "another source has its own bucket",
        (ip4(10, 0, 0, 9), CPORT),
        vip,
        XDP_TX,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    std::thread::sleep(std::time::Duration::from_millis(1_050));
    check_syn(
        &mut lb,
        "a second later: one more",
        (client4(), CPORT + 4),
        vip,
        XDP_TX,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    check_syn(
        &mut lb,
        "and no more",
        (client4(), CPORT + 5),
        vip,
        XDP_DROP,
        &[(DROP_SOURCE_LIMIT, 1)],
    );
}

/// Moves every given reverse entry's `last_seen` back by `secs` coarse seconds.
fn age_entries(lb: &mut Lb, keys: &[FlowKey], secs: u32) {
    for key in keys {
        let mut v = lb.nat_entry(key).expect("entry to age");
        v.last_seen = v.last_seen.wrapping_sub(secs);
        lb.insert_nat(*key, v);
    }
}

fn counter_delta(before: &[u64], after: &[u64], idx: u32) -> u64 {
    after[idx as usize] - before[idx as usize]
}

/// In the data plane: spoofed SYNs that the backend answers (its
/// SYN-ACKs go nowhere) hold their ports only while half-open, however often the backend
/// retransmits; then legitimate clients get every port back.
#[test]
fn spoofed_syns_hold_ports_only_seconds() {
    let mut lb = world(&[]);
    let vip = custom_service(&mut lb, &[ip4(10, 0, 0, 2)], (30000, 30199), 0, 1);
    let reverse = |port| flow_key(ip4(10, 0, 1, 20), 80, ip4(10, 0, 0, 2), port, IPPROTO_TCP);
    let mut spoofed = Vec::new();
    // 150 of the 200 pairs taken. Near that fill a few SYNs find all 8 of their candidates
    // held (about u^8 of them at utilisation u) and are refused; the loop goes on until
    // 150 were forwarded.
    let before = lb.counters();
    let mut sent = 0u16;
    while spoofed.len() < 150 {
        assert!(sent < 300, "150 of 300 spoofed SYNs forwarded");
        let i = sent;
        sent += 1;
        let src = ip4(198, 18, (i >> 8) as u8, i as u8);
        let syn = syn_from(src, 40000 + i, vip);
        let run = lb.run(&syn.bytes());
        if run.action == XDP_DROP {
            continue;
        }
        assert_eq!(run.action, XDP_TX, "spoofed SYN {i} forwarded");
        let port = out_sport(&syn, &run.out);
        let synack = Frame::tcp(
            ip4(10, 0, 1, 20),
            80,
            ip4(10, 0, 0, 2),
            port,
            TCP_SYN | TCP_ACK,
        )
        .macs(backend_mac(20), LB_MAC);
        assert_eq!(lb.run(&synack.bytes()).action, XDP_TX, "SYN-ACK sent back");
        spoofed.push((reverse(port), synack));
    }
    assert_eq!(
        counter_delta(&before, &lb.counters(), DROP_NAT_PORTS),
        u64::from(sent) - 150,
        "every spoofed SYN not forwarded was refused for want of a pair"
    );
    let keys: Vec<FlowKey> = spoofed.iter().map(|(k, _)| *k).collect();
    for k in &keys {
        assert_eq!(
            lb.nat_entry(k).unwrap().state,
            NAT_S_ESTABLISHED,
            "half-open"
        );
    }
    // The client never acknowledges; the backend keeps retransmitting its SYN-ACKs.
    age_entries(&mut lb, &keys, NAT_HALF_OPEN_REUSE);
    for (_, synack) in &spoofed {
        lb.run(&synack.bytes());
    }
    // 120 legitimate connections from one client: more than the 50 ports never used.
    let before = lb.counters();
    for i in 0..120u16 {
        let run = lb.run(&syn_from(client4(), 20000 + i, vip).bytes());
        assert_eq!(run.action, XDP_TX, "legitimate connection {i} translated");
    }
    let after = lb.counters();
    assert_eq!(counter_delta(&before, &after, DROP_NAT_PORTS), 0);
    let reclaimed = counter_delta(&before, &after, NAT_PORT_RECLAIMED);
    assert!(
        reclaimed >= 70,
        "at least 70 of the half-open ports came back, got {reclaimed}"
    );
}

/// Spoofed SYNs that take every pair of a backend, answered (half-open) or not
/// (unanswered), hold them against real clients only while younger than
/// `NAT_HANDSHAKE_DISPLACE` (1.07–2.1 s), not for their rows' 4.3–8.6 s: a flood must
/// then renew every pair within that time to starve real clients. Established
/// connections are never taken that way, and a real client past its handshake keeps its
/// pair through the next wave of the flood.
#[test]
fn a_spoofed_syn_flood_holds_ports_against_real_clients_only_briefly() {
    const PAIRS: u16 = 200;
    let mut lb = world(&[]);
    let vip = custom_service(
        &mut lb,
        &[ip4(10, 0, 0, 2)],
        (30000, 30000 + PAIRS - 1),
        0,
        1,
    );
    let reverse = |port| flow_key(ip4(10, 0, 1, 20), 80, ip4(10, 0, 0, 2), port, IPPROTO_TCP);
    let synack = |port| {
        Frame::tcp(
            ip4(10, 0, 1, 20),
            80,
            ip4(10, 0, 0, 2),
            port,
            TCP_SYN | TCP_ACK,
        )
        .macs(backend_mac(20), LB_MAC)
    };
    // A wave of spoofed SYNs from distinct sources: every pair held, the rest refused.
    let wave = |lb: &mut Lb, first: u16, count: u16| -> (Vec<FlowKey>, u64) {
        let before = lb.counters();
        let mut held = Vec::new();
        for i in first..first + count {
            let syn = syn_from(ip4(198, 18, (i >> 8) as u8, i as u8), 40000, vip);
            let run = lb.run(&syn.bytes());
            if run.action != XDP_TX {
                continue;
            }
            let port = out_sport(&syn, &run.out);
            // Half of them answered by the backend (half-open), half not (unanswered).
            if i % 2 == 0 {
                assert_eq!(lb.run(&synack(port).bytes()).action, XDP_TX, "SYN-ACK");
            }
            held.push(reverse(port));
        }
        (held, counter_delta(&before, &lb.counters(), DROP_NAT_PORTS))
    };
    let now = steady_nat_seconds();
    let (flood, refused) = wave(&mut lb, 0, 4 * PAIRS);
    assert_eq!(flood.len(), usize::from(PAIRS), "the flood took every pair");
    assert_eq!(refused, u64::from(3 * PAIRS), "and the rest was refused");
    let real = |i: u16| (client4(), 20000 + i);

    // Silent for less than NAT_HANDSHAKE_DISPLACE: a real client is refused (its SYN
    // is retransmitted a second later).
    age_entries(&mut lb, &flood, NAT_HANDSHAKE_DISPLACE - 1);
    assert_eq!(
        now,
        now_nat_seconds(),
        "the fixture ran within one coarse second"
    );
    check_syn(
        &mut lb,
        "a real client against a fresh flood",
        real(0),
        vip,
        XDP_DROP,
        &[(DROP_NAT_PORTS, 1)],
    );
    // Silent for NAT_HANDSHAKE_DISPLACE (well within the 4.3 s and 8.6 s of rows 1-2):
    // every real client gets a pair, each one the flood held.
    age_entries(&mut lb, &flood, 1);
    let before = lb.counters();
    let mut real_keys = Vec::new();
    // 60 of the 200: with more, the last ones' 8 second-pass candidates could all be
    // real connections already (about (k/200)^8 for the k-th).
    for i in 1..=60u16 {
        let (ip, port) = real(i);
        let syn = syn_from(ip, port, vip);
        let run = lb.run(&syn.bytes());
        assert_eq!(run.action, XDP_TX, "real client {i} got a pair");
        let nat_port = out_sport(&syn, &run.out);
        assert_eq!(
            lb.run(&synack(nat_port).bytes()).action,
            XDP_TX,
            "its SYN-ACK"
        );
        let ack = Frame::tcp(ip, port, vip, 80, TCP_ACK).macs(CLIENT_MAC, LB_MAC);
        assert_eq!(lb.run(&ack.bytes()).action, XDP_TX, "its ACK");
        let key = reverse(nat_port);
        assert_eq!(
            lb.nat_entry(&key).expect("its entry").state,
            NAT_S_ESTABLISHED | NAT_S_ACKED,
            "real client {i} established"
        );
        real_keys.push((key, port));
    }
    let after = lb.counters();
    assert_eq!(counter_delta(&before, &after, DROP_NAT_PORTS), 0);
    assert_eq!(counter_delta(&before, &after, NAT_PORT_RECLAIMED), 60);

    // The flood goes on: its older entries and the real connections, all silent for
    // as long, meet a new wave. The wave takes the flood's pairs, never a connection's.
    let rest: Vec<FlowKey> = flood
        .iter()
        .filter(|k| !real_keys.iter().any(|(r, _)| r == *k))
        .copied()
        .collect();
    let reals: Vec<FlowKey> = real_keys.iter().map(|(k, _)| *k).collect();
    age_entries(&mut lb, &reals, NAT_HANDSHAKE_DISPLACE);
    let (second, _) = wave(&mut lb, 4 * PAIRS, 4 * PAIRS);
    assert_eq!(
        second.len(),
        rest.len(),
        "the new wave took the flood's old pairs"
    );
    for (i, (key, port)) in real_keys.iter().enumerate() {
        let v = lb.nat_entry(key).expect("the real connection's entry");
        assert_eq!(
            v.client_port,
            port.to_be(),
            "real connection {i} kept its pair through the second wave"
        );
    }
    // And established connections silent that long are not taken by a real client
    // either: with every pair held by one, a new flow is refused.
    let mut lb = world(&[]);
    let vip = custom_service(&mut lb, &[ip4(10, 0, 0, 2)], (30000, 30000), 0, 1);
    lb.insert_nat(
        reverse(30000),
        NatValue {
            client_port: 1234u16.to_be(),
            state: NAT_S_ESTABLISHED | NAT_S_ACKED,
            last_seen: now_nat_seconds().wrapping_sub(NAT_HANDSHAKE_DISPLACE + 1),
            ..NatValue::default()
        },
    );
    check_syn(
        &mut lb,
        "an established connection's pair",
        real(200),
        vip,
        XDP_DROP,
        &[(DROP_NAT_PORTS, 1)],
    );
}

/// In the data plane: one client's flood of one-datagram UDP flows is
/// cut by its bucket, other clients keep getting ports, and the flood's ports come back
/// after the unassured timeout.
#[test]
fn one_clients_udp_flood_cannot_take_the_port_range() {
    let mut lb = world(&[]);
    let vip = ip4(10, 0, 0, 105);
    lb.add_service(
        vip,
        53,
        IPPROTO_UDP,
        ServiceMeta {
            service_id: 11,
            flags: SERVICE_F_NAT,
            snat_addrs: [addr_words(ip4(10, 0, 0, 2)), [0; 4], [0; 4], [0; 4]],
            snat_count: 1,
            nat_port_min: 30000,
            nat_port_max: 30999,
            // 1000 new flows/s, 200 at once.
            source_interval_ns: 1_000_000,
            source_burst: 200,
            ..ServiceMeta::default()
        },
    );
    lb.set_backend(21, backend(ip4(10, 0, 1, 21), 53, 21, 11));
    lb.set_maglev_all(11, 21);
    let query = |src: IpAddr, sport: u16| {
        Frame::udp(src, sport, vip, 53)
            .payload(b"q")
            .macs(CLIENT_MAC, LB_MAC)
    };
    let before = lb.counters();
    let mut flood_ports = Vec::new();
    for i in 0..600u16 {
        let q = query(client4(), 10000 + i);
        let run = lb.run(&q.bytes());
        if run.action == XDP_TX {
            flood_ports.push(out_sport(&q, &run.out));
        }
    }
    let after = lb.counters();
    let refused = counter_delta(&before, &after, DROP_SOURCE_LIMIT);
    assert_eq!(
        counter_delta(&before, &after, DROP_NAT_PORTS),
        0,
        "ports to spare"
    );
    // The burst, plus what the bucket refilled while the loop ran (1 per ms).
    assert!(
        (200..=260).contains(&flood_ports.len()),
        "the flood got its burst and little more: {} flows, {refused} refused",
        flood_ports.len()
    );
    assert_eq!(flood_ports.len() as u64 + refused, 600);
    for i in 0..50u8 {
        let run = lb.run(&query(ip4(10, 0, 3, i), 5353).bytes());
        assert_eq!(run.action, XDP_TX, "another client's query {i} gets a port");
    }
    // 10.7 s later (unassured), the flood's ports are reclaimable: fill the range.
    let keys: Vec<FlowKey> = flood_ports
        .iter()
        .map(|&p| flow_key(ip4(10, 0, 1, 21), 53, ip4(10, 0, 0, 2), p, IPPROTO_UDP))
        .collect();
    age_entries(&mut lb, &keys, NAT_UDP_REUSE);
    let before = lb.counters();
    let mut ok = 0;
    for i in 0..700u16 {
        let run = lb.run(&query(ip4(10, 0, 4 + (i / 200) as u8, i as u8), 6000 + i).bytes());
        ok += usize::from(run.action == XDP_TX);
    }
    let after = lb.counters();
    assert!(
        ok >= 650,
        "after the timeout, at least 650 of 700 other clients get ports, got {ok}"
    );
    assert!(
        counter_delta(&before, &after, NAT_PORT_RECLAIMED) > 0,
        "some of them on the flood's reclaimed ports"
    );
}

/// An entry written by an agent older than the lifecycle (no `NAT_S_ACKED`, no awaited
/// ACK in the flow) must not look half-open while its client keeps sending.
#[test]
fn an_adopted_established_entry_becomes_established_with_the_clients_next_packet() {
    let mut lb = world(&[NAT4]);
    let port = established(&mut lb, CPORT);
    let key = reply_key(NAT4, port);
    let mut v = lb.nat_entry(&key).expect("entry");
    v.state = NAT_S_ESTABLISHED;
    lb.insert_nat(key, v);
    let ck = client_key(NAT4, CPORT);
    let mut f = lb.flow(&ck).expect("flow");
    f.flags = 0;
    lb.set_flow(&ck, f);
    // The reverse entry is checked once per kernel tick (at most 10 ms).
    std::thread::sleep(std::time::Duration::from_millis(25));
    nat_forward(
        &mut lb,
        "the client's next packet",
        &to_vip(NAT4, CPORT, TCP_ACK | TCP_PSH),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(state_of(&lb, port), EST, "established, not half-open");
}
