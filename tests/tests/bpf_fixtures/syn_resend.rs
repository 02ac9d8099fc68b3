//! Which SYN on a flow that waits for its handshake is a resend (docs/passive-signals.md,
//! "Which SYN is a resend"), dsr and nat: the same ISN within the retransmission window
//! is one (reported once, after an RTO); another ISN, or the same one past the window, is
//! a new connection on the 5-tuple, decided as a new flow and never reported; a flow
//! still waiting past the window has failed and its way is free for the table.

use super::passive::age_flow;
use super::prelude::*;
use lb_common::{
    maps::{FlowValue, NAT_H_PENDING, nat_reclaimable, nat_seconds},
    table::{SYN_WAIT_MAX_NS, TABLE_WAYS},
};
use lb_tests::bpf::clock::monotonic_ns as now_ns;

/// Linux's initial SYN retransmission timeout.
const RTO_NS: u64 = 1_000_000_000;
/// The ISN of `Frame::tcp`'s SYNs (the flow keeps it as on the wire: `ISN.to_be()`).
const ISN: u32 = 0x1000_0000;
/// Another connection's ISN on the same 5-tuple.
const OTHER_ISN: u32 = 0x5eed_0001;

/// A client SYN to service `id` from `cport` with initial sequence number `isn`.
fn syn(id: u32, cport: u16, isn: u32) -> Frame {
    let mut f = to_vip(id, cport, TCP_SYN);
    if let Transport::Tcp { seq, .. } = &mut f.transport {
        *seq = isn;
    }
    f
}

/// Events sent since the last call: (kind, backend id).
fn events(lb: &mut Lb) -> Vec<(u32, u32)> {
    lb.drain_events()
        .iter()
        .map(|e| (e.kind, e.backend_id))
        .collect()
}

fn dsr_syn(lb: &mut Lb, desc: &str, frame: &Frame, backend: u32, counters: &[(u32, u64)]) {
    check(
        lb,
        Fixture {
            desc,
            input: frame.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(frame, backend)),
            counters,
        },
    );
}

/// The flow's wait started within the last second (a fresh wait, not the old one).
fn waits_from_now(f: &FlowValue) -> bool {
    now_ns().wrapping_sub(f.last_seen_ns) < RTO_NS
}

#[test]
fn dsr_a_resend_is_the_same_isn_within_the_window() {
    let mut lb = world(&[DSR4]);
    let key = client_key(DSR4, CPORT);
    let first = syn(DSR4, CPORT, ISN);
    dsr_syn(&mut lb, "SYN", &first, 1, &[(TX_DSR, 1), (FLOW_NEW, 1)]);
    let f = lb.flow(&key).expect("flow");
    assert_eq!(f.flags, FLOW_F_SYN_PENDING);
    assert_eq!(
        f.nat_tick,
        ISN.to_be(),
        "the waiting flow keeps its SYN's ISN"
    );
    age_flow(&mut lb, &key, RTO_NS);
    dsr_syn(
        &mut lb,
        "the same ISN an RTO later: a resend",
        &first,
        1,
        &[(TX_DSR, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
    );
    assert_eq!(events(&mut lb), vec![(EVENT_SYN_RETRANSMIT, 1)]);

    // Linux's last resends come 31 and 63 s after the first SYN: still in the window.
    for (n, waited) in [(1u16, 31 * RTO_NS), (2, SYN_WAIT_MAX_NS - RTO_NS)] {
        let late = syn(DSR4, CPORT + n, ISN);
        lb.run(&late.bytes());
        age_flow(&mut lb, &client_key(DSR4, CPORT + n), waited);
        dsr_syn(
            &mut lb,
            "a late resend inside the window",
            &late,
            1,
            &[(TX_DSR, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
        );
        assert_eq!(
            events(&mut lb),
            vec![(EVENT_SYN_RETRANSMIT, 1)],
            "resent {waited} ns after the SYN"
        );
    }
}

#[test]
fn dsr_another_isn_on_a_pending_tuple_is_a_new_flow() {
    let mut lb = world(&[DSR4, NAT4]);
    let key = client_key(DSR4, CPORT);
    let first = syn(DSR4, CPORT, ISN);
    dsr_syn(&mut lb, "SYN", &first, 1, &[(TX_DSR, 1), (FLOW_NEW, 1)]);
    age_flow(&mut lb, &key, RTO_NS);
    lb.run(&first.bytes());
    assert_eq!(events(&mut lb), vec![(EVENT_SYN_RETRANSMIT, 1)], "reported");
    // Pinned elsewhere than where Maglev sends the tuple now (backend 2 is live and in
    // traffic): a resend stays there, a new connection is decided afresh.
    let mut f = lb.flow(&key).expect("flow");
    f.backend_id = 2;
    lb.set_flow(&key, f);
    dsr_syn(
        &mut lb,
        "the same ISN again: a resend, kept on its backend, reported already",
        &first,
        2,
        &[(TX_DSR, 1), (FLOW_HIT, 1)],
    );

    let other = syn(DSR4, CPORT, OTHER_ISN);
    dsr_syn(
        &mut lb,
        "another ISN: a new connection, decided by Maglev as a new flow",
        &other,
        1,
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );
    assert_eq!(events(&mut lb), vec![], "a new connection is no failure");
    let f = lb.flow(&key).expect("flow");
    assert_eq!(f.backend_id, 1, "re-decided");
    assert_eq!(f.flags, FLOW_F_SYN_PENDING, "waits afresh, its report gone");
    assert_eq!(f.nat_tick, OTHER_ISN.to_be(), "with the new ISN");
    assert!(waits_from_now(&f), "from the new SYN");

    dsr_syn(
        &mut lb,
        "the old ISN once more: another new connection",
        &first,
        1,
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );
    assert_eq!(events(&mut lb), vec![]);
    age_flow(&mut lb, &key, RTO_NS);
    dsr_syn(
        &mut lb,
        "the new connection's own resend an RTO later",
        &first,
        1,
        &[(TX_DSR, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
    );
    assert_eq!(events(&mut lb), vec![(EVENT_SYN_RETRANSMIT, 1)]);
}

#[test]
fn dsr_the_same_isn_past_the_window_is_not_a_resend() {
    let mut lb = world(&[DSR4]);
    let key = client_key(DSR4, CPORT);
    let first = syn(DSR4, CPORT, ISN);
    lb.run(&first.bytes());
    age_flow(&mut lb, &key, SYN_WAIT_MAX_NS + RTO_NS);
    dsr_syn(
        &mut lb,
        "the same ISN past the window: a new flow, no event",
        &first,
        1,
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );
    assert_eq!(events(&mut lb), vec![]);
    let f = lb.flow(&key).expect("flow");
    assert_eq!((f.flags, f.nat_tick), (FLOW_F_SYN_PENDING, ISN.to_be()));
    assert!(waits_from_now(&f), "the wait starts again");
}

#[test]
fn nat_another_isn_on_a_pending_tuple_is_a_new_flow() {
    let mut lb = world(&[NAT4]);
    let key = client_key(NAT4, CPORT);
    let first = syn(NAT4, CPORT, ISN);
    let port = nat_forward(
        &mut lb,
        "SYN",
        &first,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    assert_eq!(lb.flow(&key).expect("flow").nat_tick, ISN.to_be());
    age_flow(&mut lb, &key, RTO_NS);
    nat_forward(
        &mut lb,
        "the same ISN an RTO later: a resend",
        &first,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
    );
    assert_eq!(events(&mut lb), vec![(EVENT_SYN_RETRANSMIT, 2)]);
    let entry = lb.nat_entry(&reply_key(NAT4, port)).expect("entry");
    assert_ne!(entry.handshake & lb_common::maps::NAT_H_REPORTED, 0);

    let other = syn(NAT4, CPORT, OTHER_ISN);
    let again = nat_forward(
        &mut lb,
        "another ISN: a new flow (the old entry released, a source allocated)",
        &other,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    assert_eq!(events(&mut lb), vec![], "a new connection is no failure");
    assert_eq!(
        again, port,
        "the released pair is the flow's first candidate"
    );
    let f = lb.flow(&key).expect("flow");
    assert_eq!(
        (f.flags, f.nat_tick),
        (FLOW_F_SYN_PENDING, OTHER_ISN.to_be())
    );
    assert!(waits_from_now(&f));
    let entry = lb.nat_entry(&reply_key(NAT4, again)).expect("entry");
    assert_eq!(
        (entry.state, entry.handshake),
        (0, NAT_H_PENDING),
        "a fresh reverse entry: waiting, not reported"
    );

    age_flow(&mut lb, &key, RTO_NS);
    nat_forward(
        &mut lb,
        "the new connection's own resend an RTO later",
        &other,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
    );
    assert_eq!(events(&mut lb), vec![(EVENT_SYN_RETRANSMIT, 2)]);
}

#[test]
fn nat_the_same_isn_past_the_window_is_not_a_resend() {
    let mut lb = world(&[NAT4]);
    let key = client_key(NAT4, CPORT);
    let first = syn(NAT4, CPORT, ISN);
    lb.run(&first.bytes());
    age_flow(&mut lb, &key, SYN_WAIT_MAX_NS + RTO_NS);
    nat_forward(
        &mut lb,
        "the same ISN past the window: a new flow, no event",
        &first,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    assert_eq!(events(&mut lb), vec![]);
    let f = lb.flow(&key).expect("flow");
    assert_eq!((f.flags, f.nat_tick), (FLOW_F_SYN_PENDING, ISN.to_be()));
    assert!(waits_from_now(&f));
}

/// A settled flow of another client on backend 1, last seen 1 s ago (active).
fn active() -> FlowValue {
    FlowValue {
        backend_id: 1,
        last_seen_ns: now_ns() - RTO_NS,
        ..FlowValue::default()
    }
}

/// A flow of another client whose SYN (ISN [`ISN`]) started its wait `ago` ns ago.
fn pending(ago: u64) -> FlowValue {
    FlowValue {
        backend_id: 1,
        flags: FLOW_F_SYN_PENDING,
        nat_tick: ISN.to_be(),
        last_seen_ns: now_ns() - ago,
        ..FlowValue::default()
    }
}

fn stranger(n: u16) -> FlowKey {
    flow_key(
        ip4(10, 77, 0, 1),
        9000 + n,
        ip4(10, 0, 0, 1),
        80,
        IPPROTO_TCP,
    )
}

#[test]
fn dsr_a_failed_handshake_past_the_window_frees_its_way() {
    let mut lb = world(&[DSR4]);
    for (cport, ago, counters) in [
        (
            CPORT,
            SYN_WAIT_MAX_NS + RTO_NS,
            &[(TX_DSR, 1), (FLOW_NEW, 1)][..],
        ),
        (
            CPORT + 1,
            SYN_WAIT_MAX_NS - RTO_NS,
            &[(TX_DSR, 1), (FLOW_NEW, 1)][..],
        ),
    ] {
        let key = client_key(DSR4, cport);
        let index = lb.layout().flow_bucket(&key);
        for way in 0..TABLE_WAYS as usize {
            let value = if way == 1 { pending(ago) } else { active() };
            lb.write_flow_way(index, way, stranger(way as u16 + cport), value);
        }
        let frame = syn(DSR4, cport, ISN);
        // Past the window the waiting flow's way is free (no eviction); inside it, the
        // flow is live and the bucket is full: a waiting flow's way goes first (it is
        // displaced, not counted as an established flow's eviction).
        dsr_syn(
            &mut lb,
            "a SYN into a bucket with a waiting flow",
            &frame,
            1,
            counters,
        );
        let (_, bucket) = lb.flow_bucket_of(&key);
        assert_eq!(bucket.ways[1].key, key, "way 1 holds the new flow");
    }
}

#[test]
fn nat_a_failed_handshake_past_the_window_frees_its_way_and_its_port() {
    let mut lb = world(&[NAT4]);
    let old = client_key(NAT4, CPORT);
    let port = nat_forward(
        &mut lb,
        "a SYN the backend never answers",
        &syn(NAT4, CPORT, ISN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    // Its client gave up (no resend) the window ago.
    age_flow(&mut lb, &old, SYN_WAIT_MAX_NS + RTO_NS);
    let rk = reply_key(NAT4, port);
    let mut entry = lb.nat_entry(&rk).expect("entry");
    entry.last_seen = entry
        .last_seen
        .wrapping_sub(nat_seconds(SYN_WAIT_MAX_NS + RTO_NS));
    lb.insert_nat(rk, entry);
    assert!(
        nat_reclaimable(&entry, IPPROTO_TCP, nat_seconds(now_ns())),
        "its pair is free by the port lifecycle (unanswered: 4.3 s) long before"
    );

    // Another client whose flow falls in the same bucket; the bucket's other ways
    // hold active flows.
    let (index, bucket) = lb.flow_bucket_of(&old);
    let way = lb_common::table::find_way(&bucket, &old).expect("the waiting flow");
    let vip = svc(NAT4).vip;
    let (client, cport) = (1..=250u8)
        .flat_map(|c| (1000..=60000u16).map(move |p| (ip4(10, 88, 0, c), p)))
        .find(|&(c, p)| {
            lb.layout()
                .flow_bucket(&flow_key(c, p, vip, 80, IPPROTO_TCP))
                == index
        })
        .expect("a client 5-tuple in the same bucket");
    for w in 0..TABLE_WAYS as usize {
        if w != way {
            lb.write_flow_way(index, w, stranger(w as u16), active());
        }
    }
    let frame = Frame::tcp(client, cport, vip, 80, TCP_SYN).macs(CLIENT_MAC, LB_MAC);
    let run = check(
        &mut lb,
        Fixture {
            desc: "a new client's SYN takes the failed handshake's way, no eviction",
            input: frame.bytes(),
            action: XDP_TX,
            output: Out::Any,
            counters: &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
        },
    );
    assert_eq!(run.action, XDP_TX);
    let (_, bucket) = lb.flow_bucket_of(&old);
    let new = flow_key(client, cport, vip, 80, IPPROTO_TCP);
    assert_eq!(bucket.ways[way].key, new, "the waiting flow's way");
    assert_eq!(lb.flow(&old), None, "the failed handshake is gone");
    assert_eq!(events(&mut lb), vec![]);
}
