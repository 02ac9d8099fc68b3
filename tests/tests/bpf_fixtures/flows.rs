//! The flow table and backend choice: pinning, table changes, liveness, no backend.

use super::prelude::*;

#[test]
fn flow_keeps_its_backend_across_a_table_change_and_rehashes_when_not_live() {
    let mut lb = world(&[DSR4]);
    lb.set_backend(9, backend(ip4(10, 0, 1, 19), 80, 9, DSR4));
    let first = to_vip(DSR4, CPORT, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "flow opened on backend 1",
            input: first.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&first, 1)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );

    lb.set_maglev_all(DSR4, 9);
    let next = to_vip(DSR4, CPORT, TCP_ACK);
    check(
        &mut lb,
        Fixture {
            desc: "after the table moved every slot to backend 9, the flow stays on 1",
            input: next.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&next, 1)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
    let other = to_vip(DSR4, CPORT + 1, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "a new flow follows the new table (backend 9)",
            input: other.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&other, 9)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );

    let mut b1 = lb.backend(1);
    b1.flags &= !BACKEND_F_LIVE;
    lb.set_backend(1, b1);
    check(
        &mut lb,
        Fixture {
            desc: "backend 1 lost LIVE: the pinned flow is re-hashed to backend 9",
            input: next.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&next, 9)),
            counters: &[(TX_DSR, 1), (FLOW_REHASH, 1)],
        },
    );
    let flow = lb.flow(&client_key(DSR4, CPORT)).expect("flow entry");
    assert_eq!(flow.backend_id, 9, "the flow entry now points at backend 9");
    assert_eq!(
        lb.backend_stats(9).new_flows,
        2,
        "backend 9: one new, one re-pinned"
    );
    check(
        &mut lb,
        Fixture {
            desc: "the re-pinned flow hits backend 9",
            input: next.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&next, 9)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
}

#[test]
fn nat_flow_rehash_moves_the_reverse_entry() {
    let mut lb = world(&[NAT4]);
    lb.set_backend(12, backend(ip4(10, 0, 1, 22), 8080, 12, NAT4));
    let syn = to_vip(NAT4, CPORT, TCP_SYN);
    let port = nat_forward(
        &mut lb,
        "nat: flow on backend 2",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    lb.set_maglev_all(NAT4, 12);
    let mut b2 = lb.backend(2);
    b2.flags = 0;
    lb.set_backend(2, b2);
    let ack = to_vip(NAT4, CPORT, TCP_ACK);
    let run = check(
        &mut lb,
        Fixture {
            desc: "nat: backend 2 not live -> re-hashed to backend 12",
            input: ack.bytes(),
            action: XDP_TX,
            output: Out::Any,
            counters: &[(TX_NAT_FORWARD, 1), (FLOW_REHASH, 1), (NAT_PORT_FIRST, 1)],
        },
    );
    let new_port = out_sport(&ack, &run.out);
    let expected = retuple(&ack, snat(svc(NAT4).vip), new_port, ip4(10, 0, 1, 22), 8080)
        .macs(LB_MAC, backend_mac(12))
        .bytes();
    assert_frames_eq("nat re-hash output", &expected, &run.out);
    assert_checksums_valid("nat re-hash output", &run.out);
    assert!(
        lb.nat_entry(&reply_key(NAT4, port)).is_none(),
        "the old backend's reverse entry is released"
    );
    let new_rev = flow_key(
        ip4(10, 0, 1, 22),
        8080,
        ip4(10, 0, 0, 2),
        new_port,
        IPPROTO_TCP,
    );
    let rev = lb
        .nat_entry(&new_rev)
        .expect("reverse entry for backend 12");
    assert_eq!(rev.backend_id, 12, "reverse entry names the new backend");
}

#[test]
fn no_backend_drops_and_counts() {
    let mut lb = world(&[]);
    let syn = to_vip(EMPTY, CPORT, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "service without a published table",
            input: syn.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_NO_BACKEND, 1)],
        },
    );
    lb.set_maglev_all(EMPTY, NO_BACKEND);
    check(
        &mut lb,
        Fixture {
            desc: "table slot holds NO_BACKEND (0)",
            input: syn.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_NO_BACKEND, 1)],
        },
    );
    let mut dead = backend(ip4(10, 0, 1, 30), 80, 30, EMPTY);
    dead.flags = 0;
    lb.set_backend(30, dead);
    lb.set_maglev_all(EMPTY, 30);
    check(
        &mut lb,
        Fixture {
            desc: "table slot holds a backend without LIVE",
            input: syn.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_NO_BACKEND, 1)],
        },
    );
    lb.set_maglev_all(EMPTY, MAX_BACKENDS + 5);
    check(
        &mut lb,
        Fixture {
            desc: "table slot holds an id outside LB_BACKENDS",
            input: syn.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_BAD_BACKEND, 1)],
        },
    );
    let s = lb.service_stats(EMPTY);
    assert_eq!(s.no_backend, 4, "service no_backend counts every drop");
    assert_eq!(s.packets, 0, "dropped packets are not service traffic");
    assert!(
        lb.flow(&client_key(EMPTY, CPORT)).is_none(),
        "no flow entry without a backend"
    );
}

#[test]
fn maglev_slot_is_the_flow_hash_modulo_the_ring() {
    let mut lb = world(&[]);
    lb.set_backend(10, backend(ip4(10, 0, 1, 20), 80, 10, DSR4));
    let key = client_key(DSR4, CPORT);
    let slot = lb_common::hash::flow_hash(&key, lb_common::hash::SEED_MAGLEV) % MAGLEV_RING_SIZE;
    let mut table = vec![1u32; MAGLEV_RING_SIZE as usize];
    table[slot as usize] = 10;
    lb.set_maglev(DSR4, &table);
    let syn = to_vip(DSR4, CPORT, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "the flow lands on the one slot holding backend 10",
            input: syn.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&syn, 10)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
}

#[test]
fn a_backend_out_of_traffic_keeps_tcp_connections_but_not_new_syns_nor_udp() {
    let mut lb = world(&[DSR4, DSR4_UDP, NAT4]);
    lb.set_backend(9, backend(ip4(10, 0, 1, 19), 80, 9, DSR4));
    lb.set_backend(12, backend(ip4(10, 0, 1, 22), 8080, 12, NAT4));
    let syn = to_vip(DSR4, CPORT, TCP_SYN);
    lb.run(&syn.bytes());
    let q = to_vip(DSR4_UDP, CPORT, 0);
    lb.run(&q.bytes());
    let nat_port = nat_forward(
        &mut lb,
        "nat flow on backend 2",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    nat_reply(
        &mut lb,
        "SYN-ACK",
        &backend_reply(NAT4, nat_port, TCP_SYN | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    // Health takes backends 1 and 2 out of traffic: live, not serving; the tables
    // move to 9 and 12.
    lb.set_maglev_all(DSR4, 9);
    lb.set_maglev_all(DSR4_UDP, 9);
    lb.set_maglev_all(NAT4, 12);
    for id in [1, 2] {
        let mut b = lb.backend(id);
        b.flags = BACKEND_F_LIVE;
        lb.set_backend(id, b);
    }
    let ack = to_vip(DSR4, CPORT, TCP_ACK);
    check(
        &mut lb,
        Fixture {
            desc: "dsr: the established TCP connection stays on backend 1",
            input: ack.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&ack, 1)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
    let again = nat_forward(
        &mut lb,
        "nat: the established connection stays on backend 2, same port",
        &to_vip(NAT4, CPORT, TCP_ACK),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(again, nat_port);
    check(
        &mut lb,
        Fixture {
            desc: "dsr: a SYN reusing the 5-tuple is a new connection: re-hashed to 9",
            input: syn.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&syn, 9)),
            counters: &[(TX_DSR, 1), (FLOW_REHASH, 1)],
        },
    );
    check(
        &mut lb,
        Fixture {
            desc: "UDP flows move: re-hashed to 9",
            input: q.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&q, 9)),
            counters: &[(TX_DSR, 1), (FLOW_REHASH, 1)],
        },
    );
    // Removed outright (no LIVE): the TCP connection moves too.
    let mut b = lb.backend(2);
    b.flags = 0;
    lb.set_backend(2, b);
    let run = check(
        &mut lb,
        Fixture {
            desc: "nat: backend 2 not live: even the connection re-hashes",
            input: to_vip(NAT4, CPORT, TCP_ACK).bytes(),
            action: XDP_TX,
            output: Out::Any,
            counters: &[(TX_NAT_FORWARD, 1), (FLOW_REHASH, 1), (NAT_PORT_FIRST, 1)],
        },
    );
    assert_eq!(run.out[5], backend_mac(12)[5], "toward backend 12");
}
