//! Cluster mode: a nat connection made on one node ("A", one loaded program) and
//! installed into another's peer tables ("B", a second program with maps of its own) as
//! the agent installs it, from A's connection event and flow entry. B forwards the
//! client's next packet to the same backend from the same SNAT address and port and
//! translates the backend's replies back exactly as A does; without the peer entry B
//! does what a node without cluster mode does; the allocation skips a pair a peer entry
//! holds; a reply no table knows goes on to the member that owns its port, and only a
//! reply inside a shared range is handed over to look for it; events come
//! once per connection; without the cluster flag none of it runs.

use super::prelude::*;
use lb_agent::dataplane::peers::PeerConnection;
use lb_common::{
    events::{CONN_ENDED, CONN_ESTABLISHED, ConnEvent},
    map_names,
    maps::{ClusterMembers, ClusterSnat, HopMove, NAT_H_ADOPTED, PeerFlow},
    table::{Bucket, SLOT_LIVE, SLOT_TAG_SHIFT},
};

/// Node A's MAC in B's `LB_CLUSTER`: the address the fixtures' frames are sent to, so
/// that a frame B sends on reaches A as the original would.
const MAC_A: [u8; 6] = LB_MAC;
/// Node B's own MAC: the frames B receives are addressed to it.
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x2b];

/// B's `LB_CLUSTER`: two members, A (index 0, `mac_a`) and B (index 1), sharing NAT4's
/// SNAT address with the range `first..=first + 1`: A owns `first`, B `first + 1`.
fn two_members(first: u16, mac_a: [u8; 6]) -> ClusterMembers {
    let vip = svc(NAT4).vip;
    let (addr, family) = (addr_words(snat(vip)), family(vip));
    let mut members = ClusterMembers {
        count: 2,
        own: 1,
        snat_count: 1,
        ..ClusterMembers::default()
    };
    members.macs[0] = mac_a;
    members.snat[0] = ClusterSnat {
        addr,
        family,
        port_min: first,
        port_max: first + 1,
        ..ClusterSnat::default()
    };
    members
}

/// What the agent installs on another node from `a`'s event `e` (its backend ids are
/// the same here: both nodes load the same world).
fn peer_connection(a: &Lb, e: &ConnEvent) -> PeerConnection {
    let f = a.flow(&e.client).expect("A's flow entry");
    PeerConnection {
        client: e.client,
        flow: PeerFlow {
            backend_id: f.backend_id,
            nat_port: f.nat_port,
            nat_addr: f.nat_addr,
            _pad: 0,
        },
        reply: e.reply,
        nat: e.nat,
    }
}

/// Node A with one established connection (client port `CPORT`), the connection as
/// another node installs it, and its source port.
fn node_a_with_a_connection() -> (Lb, PeerConnection, u16) {
    let mut a = world_in(Lb::load_cluster(), &[NAT4]);
    let port = nat_handshake(&mut a, NAT4, CPORT, &[(CONN_EVENTS_SENT, 1)]);
    let events = a.drain_conn_events();
    assert_eq!(events.len(), 1, "one event: {events:?}");
    let e = events[0];
    assert_eq!(e.kind, CONN_ESTABLISHED);
    assert_eq!(e.client, client_key(NAT4, CPORT));
    assert_eq!(e.reply, reply_key(NAT4, port));
    assert_eq!(Some(e.nat), a.nat_entry(&e.reply), "the entry as it stands");
    assert_eq!(e.nat.backend_id, svc(NAT4).backend);
    let conn = peer_connection(&a, &e);
    (a, conn, port)
}

#[test]
fn a_client_flow_that_moves_keeps_its_backend_and_source() {
    let (mut a, conn, port) = node_a_with_a_connection();
    let mut b = world_in(Lb::load_cluster(), &[NAT4]);
    b.install_peer(&conn);

    let data = to_vip(NAT4, CPORT, TCP_ACK).payload(b"GET /");
    let on_a = a.run(&data.bytes());
    let on_b = nat_forward(
        &mut b,
        "B: the client's next packet, taken over",
        &data,
        NAT4,
        &[
            (TX_NAT_FORWARD, 1),
            (FLOW_HIT, 1),
            (PEER_FLOW_ADOPTED, 1),
            (PEER_NAT_ADOPTED, 1),
        ],
    );
    assert_eq!(on_b, port, "the same source port as on A");
    assert_frames_eq("B forwards as A does", &on_a.out, &b.run(&data.bytes()).out);
    let flow = b.flow(&conn.client).expect("B pinned the flow");
    assert_eq!(
        (flow.backend_id, flow.nat_port, flow.nat_addr, flow.flags),
        (
            conn.flow.backend_id,
            conn.flow.nat_port,
            conn.flow.nat_addr,
            0
        ),
        "pinned as on A, settled"
    );
    let rev = b.nat_entry(&conn.reply).expect("B's reverse entry");
    assert_eq!(
        (rev.state, rev.handshake, rev.client_mac, rev.backend_id),
        (
            conn.nat.state,
            conn.nat.handshake | NAT_H_ADOPTED,
            CLIENT_MAC,
            conn.nat.backend_id
        ),
        "the reverse entry as on A, marked as taken over"
    );

    let reply = backend_reply(NAT4, port, TCP_ACK).payload(b"HTTP/1.1 200 OK");
    nat_reply(
        &mut b,
        "B: the backend's reply",
        &reply,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_frames_eq(
        "B translates the reply as A does",
        &a.run(&reply.bytes()).out,
        &b.run(&reply.bytes()).out,
    );
}

#[test]
fn a_reply_that_moves_first_is_translated_as_on_the_node_that_made_it() {
    let (mut a, conn, port) = node_a_with_a_connection();
    let mut b = world_in(Lb::load_cluster(), &[NAT4]);
    b.install_peer(&conn);

    let reply = backend_reply(NAT4, port, TCP_ACK).payload(b"more");
    nat_reply(
        &mut b,
        "B: the backend's reply, taken over",
        &reply,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1), (PEER_NAT_ADOPTED, 1)],
    );
    assert_frames_eq(
        "B translates as A does",
        &a.run(&reply.bytes()).out,
        &b.run(&reply.bytes()).out,
    );
    let port_b = nat_forward(
        &mut b,
        "B: then the client's packet: the flow taken over, its reverse entry there",
        &to_vip(NAT4, CPORT, TCP_ACK).payload(b"x"),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (PEER_FLOW_ADOPTED, 1)],
    );
    assert_eq!(port_b, port);
}

/// How many live slots of `buckets` (a peer table as read) hold a key whose first
/// choice is another bucket: the keys the writer put into their second choice, or moved.
fn in_second_choice<V>(buckets: &[Bucket<V>]) -> usize {
    let mask = buckets.len() as u32 - 1;
    buckets
        .iter()
        .enumerate()
        .flat_map(|(i, b)| b.ways.iter().map(move |s| (i as u32, s.word)))
        .filter(|&(i, w)| w & SLOT_LIVE != 0 && (w >> SLOT_TAG_SHIFT) as u32 & mask != i)
        .count()
}

#[test]
fn connections_in_their_second_bucket_are_taken_over_too() {
    let (_a, conn, port) = node_a_with_a_connection();
    let mut b = world_in(Lb::load_cluster(), &[NAT4]);
    let conns: Vec<(u16, u16, PeerConnection)> = (NAT_PORT_MIN..=NAT_PORT_MAX)
        .filter(|&p| p != port)
        .enumerate()
        .map(|(i, p)| {
            let cport = CPORT + 1 + i as u16;
            let mut c = conn;
            c.client = client_key(NAT4, cport);
            c.flow.nat_port = p.to_be();
            c.reply = reply_key(NAT4, p);
            c.nat.client_port = cport.to_be();
            (cport, p, c)
        })
        .collect();
    for (_, _, c) in &conns {
        b.install_peer(c);
    }
    let second_flows = in_second_choice(&b.buckets::<PeerFlow>(map_names::PEER_FLOWS));
    let second_nat = in_second_choice(&b.buckets::<NatValue>(map_names::PEER_NAT));
    println!(
        "{} connections: {second_flows} client keys and {second_nat} reply keys in their \
         second bucket",
        conns.len()
    );
    assert!(
        second_flows > 0 && second_nat > 0,
        "some take their second choice"
    );

    for (i, (cport, p, _)) in conns.iter().enumerate() {
        let reply = backend_reply(NAT4, *p, TCP_ACK).payload(b"more");
        let data = to_vip(NAT4, *cport, TCP_ACK).payload(b"x");
        if i % 2 == 0 {
            nat_reply(
                &mut b,
                &format!("connection {i}: the backend's reply first, taken over"),
                &reply,
                NAT4,
                *cport,
                &[(TX_NAT_REPLY, 1), (PEER_NAT_ADOPTED, 1)],
            );
            let on_b = nat_forward(
                &mut b,
                "then the client's packet",
                &data,
                NAT4,
                &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (PEER_FLOW_ADOPTED, 1)],
            );
            assert_eq!(on_b, *p, "the connection's own source port");
        } else {
            let on_b = nat_forward(
                &mut b,
                "the client's packet first, taken over",
                &data,
                NAT4,
                &[
                    (TX_NAT_FORWARD, 1),
                    (FLOW_HIT, 1),
                    (PEER_FLOW_ADOPTED, 1),
                    (PEER_NAT_ADOPTED, 1),
                ],
            );
            assert_eq!(on_b, *p, "the connection's own source port");
            nat_reply(
                &mut b,
                "then the reply",
                &reply,
                NAT4,
                *cport,
                &[(TX_NAT_REPLY, 1)],
            );
        }
    }
}

#[test]
fn without_a_peer_entry_a_node_does_what_it_does_without_cluster_mode() {
    let (_a, conn, port) = node_a_with_a_connection();
    let mut cluster = world_in(Lb::load_cluster(), &[NAT4]);
    let mut plain = world(&[NAT4]);
    let ack = to_vip(NAT4, CPORT, TCP_ACK).payload(b"GET /");
    let reply = backend_reply(NAT4, port, TCP_ACK).payload(b"200");
    for (what, frame) in [
        ("the client's packet", &ack),
        ("the backend's reply", &reply),
    ] {
        let counters = |lb: &Lb| lb.counters();
        let (before_c, before_p) = (counters(&cluster), counters(&plain));
        let (on_c, on_p) = (cluster.run(&frame.bytes()), plain.run(&frame.bytes()));
        assert_eq!(on_c.action, on_p.action, "{what}: the same action");
        assert_frames_eq(what, &on_p.out, &on_c.out);
        assert_eq!(
            named(&counter_deltas(&before_c, &counters(&cluster))),
            named(&counter_deltas(&before_p, &counters(&plain))),
            "{what}: the same counters"
        );
    }
    assert!(cluster.drain_conn_events().is_empty());
    assert_eq!(
        cluster.flow(&conn.client).map(|f| f.nat_port),
        plain.flow(&conn.client).map(|f| f.nat_port),
        "the same new flow"
    );
}

#[test]
fn the_allocation_skips_a_pair_a_peer_entry_holds() {
    let mut b = world_in(Lb::load_cluster(), &[NAT4]);
    let client = client_key(NAT4, CPORT + 1);
    let range = u32::from(NAT_PORT_MAX - NAT_PORT_MIN) + 1;
    let hash = lb_common::hash::flow_hash(&client, lb_common::hash::SEED_NAT_PORT);
    let first = (u32::from(NAT_PORT_MIN) + hash % range) as u16;
    // Another client's connection, made on another node, holds the first candidate.
    let other = client_key(NAT4, CPORT + 2);
    b.install_peer(&PeerConnection {
        client: other,
        flow: PeerFlow {
            backend_id: svc(NAT4).backend,
            nat_port: first.to_be(),
            nat_addr: 0,
            _pad: 0,
        },
        reply: reply_key(NAT4, first),
        nat: NatValue {
            client_addr: other.src,
            vip_addr: other.dst,
            client_port: other.sport,
            vip_port: other.dport,
            backend_id: svc(NAT4).backend,
            client_mac: CLIENT_MAC,
            ..NatValue::default()
        },
    });
    let port = nat_forward(
        &mut b,
        "B: a new flow whose first candidate a peer entry holds",
        &to_vip(NAT4, CPORT + 1, TCP_SYN),
        NAT4,
        &[
            (TX_NAT_FORWARD, 1),
            (FLOW_NEW, 1),
            (NAT_PORT_PEER_HELD, 1),
            (NAT_PORT_RETRIED, 1),
        ],
    );
    assert_ne!(port, first);
    assert_eq!(b.nat_entry(&reply_key(NAT4, first)), None, "never claimed");
}

#[test]
fn connection_events_come_once_per_connection() {
    let mut a = world_in(Lb::load_cluster(), &[NAT4, NAT4_UDP]);
    let port = nat_handshake(&mut a, NAT4, CPORT, &[(CONN_EVENTS_SENT, 1)]);
    let quiet = [(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)];
    for _ in 0..3 {
        nat_forward(
            &mut a,
            "A: data",
            &to_vip(NAT4, CPORT, TCP_ACK).payload(b"d"),
            NAT4,
            &quiet,
        );
        nat_reply(
            &mut a,
            "A: data back",
            &backend_reply(NAT4, port, TCP_ACK).payload(b"d"),
            NAT4,
            CPORT,
            &[(TX_NAT_REPLY, 1)],
        );
    }
    nat_forward(
        &mut a,
        "A: the client's FIN (half-closed: no event)",
        &to_vip(NAT4, CPORT, TCP_FIN | TCP_ACK),
        NAT4,
        &quiet,
    );
    nat_reply(
        &mut a,
        "A: the backend's FIN ends the connection",
        &backend_reply(NAT4, port, TCP_FIN | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1), (CONN_EVENTS_SENT, 1)],
    );
    nat_forward(
        &mut a,
        "A: the last ACK",
        &to_vip(NAT4, CPORT, TCP_ACK),
        NAT4,
        &quiet,
    );
    nat_reply(
        &mut a,
        "A: a retransmitted FIN",
        &backend_reply(NAT4, port, TCP_FIN | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    let kinds: Vec<u32> = a.drain_conn_events().iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [CONN_ESTABLISHED, CONN_ENDED]);

    // UDP: the first reply establishes; nothing ends it.
    let udp = nat_forward(
        &mut a,
        "A: UDP query",
        &to_vip(NAT4_UDP, CPORT, 0).payload(b"q"),
        NAT4_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    nat_reply(
        &mut a,
        "A: UDP answer",
        &backend_reply(NAT4_UDP, udp, 0).payload(b"a"),
        NAT4_UDP,
        CPORT,
        &[(TX_NAT_REPLY, 1), (CONN_EVENTS_SENT, 1)],
    );
    nat_forward(
        &mut a,
        "A: UDP again",
        &to_vip(NAT4_UDP, CPORT, 0).payload(b"q"),
        NAT4_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    nat_reply(
        &mut a,
        "A: UDP answer again",
        &backend_reply(NAT4_UDP, udp, 0).payload(b"a"),
        NAT4_UDP,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    let events = a.drain_conn_events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, CONN_ESTABLISHED);
    assert_eq!(events[0].client, client_key(NAT4_UDP, CPORT));
    assert_eq!(events[0].reply, reply_key(NAT4_UDP, udp));
}

#[test]
fn without_the_cluster_flag_no_peer_lookup_and_no_event() {
    let (_a, conn, port) = node_a_with_a_connection();
    let mut lb = world(&[NAT4]);
    assert_eq!(lb.sizes().flags(), 0);
    // A connection installed as in cluster mode (the tables hold one entry here): the
    // program never looks.
    lb.install_peer(&conn);
    check(
        &mut lb,
        Fixture {
            desc: "no flag: a reply only the peer tables know is not ours",
            input: backend_reply(NAT4, port, TCP_ACK).bytes(),
            action: XDP_PASS,
            output: Out::Unchanged,
            counters: &[(PASS_NOT_VIP, 1)],
        },
    );
    check(
        &mut lb,
        Fixture {
            desc: "no flag: the client's ACK is not taken over (nor opens a flow of its own)",
            input: to_vip(NAT4, CPORT, TCP_ACK).bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_NO_FLOW, 1)],
        },
    );
    nat_handshake(&mut lb, NAT4, CPORT + 1, &[]);
    assert!(lb.drain_conn_events().is_empty(), "no connection event");
}

#[test]
fn the_verifier_explores_cluster_mode_only_when_loaded_with_it() {
    let plain = Lb::load();
    let cluster = Lb::load_cluster();
    let count = |lb: &Lb, name| lb.verified_instructions(name);
    for name in [
        lb_common::PROGRAM_NAME,
        lb_common::FULL_PROGRAM_NAME,
        lb_common::PEER_PROGRAM_NAME,
    ] {
        println!(
            "{name}: {} instructions verified without cluster mode, {} with it",
            count(&plain, name),
            count(&cluster, name)
        );
    }
    // `lb_xdp_peer` is loaded in both modes (entered only in cluster mode): its parse
    // and service lookup are most of it either way.
    let full = lb_common::FULL_PROGRAM_NAME;
    assert!(
        count(&plain, full) < count(&cluster, full),
        "{full}: the cluster code is pruned without the flag"
    );
}

#[test]
fn a_reply_no_table_knows_goes_on_to_the_member_that_owns_its_port() {
    // A made the connection; B has not heard of it yet (the SYN-ACK outruns the sync).
    let mut a = world_in(Lb::load_cluster(), &[NAT4]);
    let port = nat_forward(
        &mut a,
        "A: SYN",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let mut b = world_in(Lb::load_cluster(), &[NAT4]);
    b.set_interface_mac(MAC_B);
    b.set_cluster_members(&two_members(port, MAC_A));
    let syn_ack =
        backend_reply(NAT4, port, TCP_SYN | TCP_ACK).macs(backend_mac(svc(NAT4).backend), MAC_B);

    let before = b.counters();
    let run = b.run(&syn_ack.bytes());
    assert_eq!(action_name(run.action), "XDP_TX", "B sends the SYN-ACK on");
    assert_eq!(
        named(&counter_deltas(&before, &b.counters())),
        named(&[(RX, 1), (TX_PEER_BOUNCE, 1)]),
    );
    let sent_on = syn_ack.clone().macs(MAC_B, MAC_A).bytes();
    assert_frames_eq("only the Ethernet addresses change", &sent_on, &run.out);

    // A translates what B sent on exactly as the SYN-ACK itself.
    let from_b = a.run(&sent_on);
    assert_eq!(action_name(from_b.action), "XDP_TX");
    assert_frames_eq(
        "A answers the client as for the original",
        &reply_expected(&syn_ack, NAT4, CPORT),
        &from_b.out,
    );
}

#[test]
fn a_reply_is_not_sent_on_when_this_node_owns_it_or_it_came_from_a_member() {
    let port = NAT_PORT_MIN;
    let reply = |src: [u8; 6], port: u16| {
        backend_reply(NAT4, port, TCP_SYN | TCP_ACK)
            .macs(src, MAC_B)
            .bytes()
    };
    let router = backend_mac(svc(NAT4).backend);
    for (what, members, frame) in [
        (
            "its port is this node's",
            two_members(port, MAC_A),
            reply(router, port + 1),
        ),
        (
            "it came from a member",
            two_members(port, MAC_A),
            reply(MAC_A, port),
        ),
        (
            "the owner's MAC is not known",
            two_members(port, [0; 6]),
            reply(router, port),
        ),
        (
            "its port is outside the shared range",
            two_members(port, MAC_A),
            reply(router, port + 2),
        ),
        (
            "no member is known yet",
            ClusterMembers::default(),
            reply(router, port),
        ),
    ] {
        let mut b = world_in(Lb::load_cluster(), &[NAT4]);
        b.set_interface_mac(MAC_B);
        b.set_cluster_members(&members);
        let before = b.counters();
        let run = b.run(&frame);
        assert_eq!(action_name(run.action), "XDP_PASS", "{what}");
        assert_eq!(
            named(&counter_deltas(&before, &b.counters())),
            named(&[(RX, 1), (PASS_NOT_VIP, 1)]),
            "{what}"
        );
        assert_frames_eq(what, &frame, &run.out);
    }
}

#[test]
fn only_a_reply_inside_a_shared_range_is_handed_over() {
    // B's own ports are NAT_PORT_MIN..=NAT_PORT_MAX; the SNAT address is shared with A,
    // which owns the first port of the range `first..=first + 1` above B's. Without
    // `lb_xdp_peer` in `LB_PROGRAMS`, a packet handed over to it is dropped: that shows
    // which ones are.
    let first = NAT_PORT_MAX + 100;
    let router = backend_mac(svc(NAT4).backend);
    let reply = |port: u16| {
        backend_reply(NAT4, port, TCP_SYN | TCP_ACK)
            .macs(router, MAC_B)
            .bytes()
    };
    for (what, port, peer_path, action, counter) in [
        (
            "another member's port, above this node's own: sent on",
            first,
            true,
            "XDP_TX",
            TX_PEER_BOUNCE,
        ),
        (
            "another member's port, above this node's own: handed over",
            first,
            false,
            "XDP_DROP",
            DROP_NO_FULL_PATH,
        ),
        (
            "a port outside every range: passed without a hand-over",
            first + 2,
            false,
            "XDP_PASS",
            PASS_NOT_VIP,
        ),
        (
            "a port below every range: passed without a hand-over",
            NAT_PORT_MIN - 1,
            false,
            "XDP_PASS",
            PASS_NOT_VIP,
        ),
    ] {
        let mut b = world_in(Lb::load_cluster(), &[NAT4]);
        b.set_interface_mac(MAC_B);
        b.set_cluster_members(&two_members(first, MAC_A));
        if !peer_path {
            b.clear_peer_path();
        }
        let before = b.counters();
        let run = b.run(&reply(port));
        assert_eq!(action_name(run.action), action, "{what}");
        assert_eq!(
            named(&counter_deltas(&before, &b.counters())),
            named(&[(RX, 1), (counter, 1)]),
            "{what}"
        );
    }
}

#[test]
fn a_taken_over_entry_that_may_be_over_gives_way_to_the_owners_new_connection() {
    // B took connection 1 over (its reply came through B), and the connection ended:
    // its replica is gone from B's peer tables, B's entry stays.
    let (_a, first, port) = node_a_with_a_connection();
    let mut b = world_in(Lb::load_cluster(), &[NAT4]);
    b.set_interface_mac(MAC_B);
    b.install_peer(&first);
    let to_b = |f: Frame| f.macs(backend_mac(svc(NAT4).backend), MAC_B);
    let data = to_b(backend_reply(NAT4, port, TCP_ACK).payload(b"1"));
    let run = b.run(&data.bytes());
    assert_eq!(action_name(run.action), "XDP_TX", "B translates the reply");
    let taken = b
        .nat_entry(&first.reply)
        .expect("B's entry of connection 1");
    assert_ne!(taken.handshake & NAT_H_ADOPTED, 0, "marked as taken over");
    b.remove_peer(&first);
    b.set_cluster_members(&two_members(port, MAC_A));

    // The owner gave the pair to a new connection: its SYN-ACK is not connection 1's,
    // B forgets that entry and sends the SYN-ACK on to the owner.
    let syn_ack = to_b(backend_reply(NAT4, port, TCP_SYN | TCP_ACK));
    let before = b.counters();
    let run = b.run(&syn_ack.bytes());
    assert_eq!(action_name(run.action), "XDP_TX");
    assert_eq!(
        named(&counter_deltas(&before, &b.counters())),
        named(&[(RX, 1), (TX_PEER_BOUNCE, 1)]),
    );
    assert_frames_eq(
        "sent on unchanged",
        &syn_ack.clone().macs(MAC_B, MAC_A).bytes(),
        &run.out,
    );
    assert_eq!(
        b.nat_entry(&first.reply),
        None,
        "connection 1's entry is gone"
    );

    // Once the new connection's replica is here, a reply to it while B still held
    // connection 1's entry, past its reuse time, takes the new one.
    b.install_peer(&first);
    b.run(&data.bytes());
    let mut old = b.nat_entry(&first.reply).expect("taken over again");
    old.last_seen = old.last_seen.wrapping_sub(2 * 900);
    b.insert_nat(first.reply, old);
    b.remove_peer(&first);
    let second = PeerConnection {
        client: client_key(NAT4, CPORT + 1),
        nat: NatValue {
            client_port: (CPORT + 1).to_be(),
            ..first.nat
        },
        ..first
    };
    b.install_peer(&second);
    let reply = to_b(backend_reply(NAT4, port, TCP_ACK).payload(b"2"));
    let run = b.run(&reply.bytes());
    assert_eq!(action_name(run.action), "XDP_TX");
    let mut expected = reply_expected(&reply, NAT4, CPORT + 1);
    expected[6..12].copy_from_slice(&MAC_B);
    assert_frames_eq(
        "the reply reaches the new connection's client",
        &expected,
        &run.out,
    );
}

#[test]
fn a_syn_on_a_shared_connections_tuple_opens_a_new_connection() {
    // The connection ended on A (the backend closed first and holds the pair in
    // TIME_WAIT); its replica stays on B for a while, open or closed as B last heard.
    // The client reuses its port and the router sends it to B: the SYN opens a new flow
    // on B, on another source port (the old pair is still held).
    let (_a, conn, port) = node_a_with_a_connection();
    let mut b = world_in(Lb::load_cluster(), &[NAT4]);
    b.install_peer(&conn);
    let before = b.counters();
    let run = b.run(&to_vip(NAT4, CPORT, TCP_SYN).bytes());
    assert_eq!(action_name(run.action), "XDP_TX");
    let moved = named(&counter_deltas(&before, &b.counters()));
    assert!(
        moved.contains(&"flow_new+1".to_string()) && !moved.iter().any(|c| c.starts_with("peer_")),
        "a new flow, nothing taken over: {moved:?}"
    );
    let flow = b.flow(&conn.client).expect("the new flow");
    assert_ne!(
        u16::from_be(flow.nat_port),
        port,
        "not the closed connection's pair"
    );

    // Any other packet of that 5-tuple still belongs to the shared connection.
    let mut c = world_in(Lb::load_cluster(), &[NAT4]);
    c.install_peer(&conn);
    nat_forward(
        &mut c,
        "the shared connection's next ACK, taken over",
        &to_vip(NAT4, CPORT, TCP_ACK),
        NAT4,
        &[
            (TX_NAT_FORWARD, 1),
            (FLOW_HIT, 1),
            (PEER_FLOW_ADOPTED, 1),
            (PEER_NAT_ADOPTED, 1),
        ],
    );
}

#[test]
fn replies_follow_a_next_hop_move_lb_cluster_names() {
    let moved = [0x02, 0, 0, 0, 0x4d, 0x0f];
    // A connection this node made, whose client's packets now reach another node.
    let (mut a, conn, port) = node_a_with_a_connection();
    let mut members = two_members(port, MAC_A);
    members.hop_move_count = 1;
    members.hop_moves[0] = HopMove {
        old: CLIENT_MAC,
        new: moved,
    };
    let reply = backend_reply(NAT4, port, TCP_ACK).payload(b"more");
    assert_eq!(a.run(&reply.bytes()).out[..6], CLIENT_MAC, "no move yet");
    a.set_cluster_members(&members);
    assert_eq!(a.run(&reply.bytes()).out[..6], moved, "after the move");
    assert_eq!(
        a.nat_entry(&conn.reply).map(|v| v.client_mac),
        Some(moved),
        "the entry took it"
    );

    // A connection taken over from a replica before the move.
    let mut b = world_in(Lb::load_cluster(), &[NAT4]);
    b.install_peer(&conn);
    nat_reply(
        &mut b,
        "B: the backend's reply, taken over",
        &reply,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1), (PEER_NAT_ADOPTED, 1)],
    );
    b.set_cluster_members(&members);
    assert_eq!(b.run(&reply.bytes()).out[..6], moved, "B too");

    // A MAC no move names is left as it is.
    members.hop_moves[0].old = [0x02, 0, 0, 0, 0x4d, 0x10];
    let (mut c, _, port) = node_a_with_a_connection();
    c.set_cluster_members(&members);
    let reply = backend_reply(NAT4, port, TCP_ACK).payload(b"more");
    assert_eq!(c.run(&reply.bytes()).out[..6], CLIENT_MAC);
}
