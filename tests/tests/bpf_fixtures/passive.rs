//! Passive signals: SYN retransmit (only after an RTO, only when the backend said
//! nothing), RST on SYN, ICMP unreachable, conn_ok.

use super::prelude::*;

/// Linux's initial SYN retransmission timeout (RFC 6298): what a real resend waits.
const INITIAL_RTO_NS: u64 = 1_000_000_000;

/// Moves the start of `key`'s handshake wait `ns` into the past, as if the SYN had been
/// sent that long ago (the data plane reads the flow clock, which tests cannot move).
pub fn age_flow(lb: &mut Lb, key: &FlowKey, ns: u64) {
    let mut f = lb.flow(key).expect("flow entry to age");
    f.last_seen_ns -= ns;
    lb.set_flow(key, f);
}

fn assert_events(lb: &mut Lb, desc: &str, expected: &[(u32, u32, u32)]) {
    let got: Vec<(String, u32, u32)> = lb
        .drain_events()
        .iter()
        .map(|e| {
            assert_ne!(e.timestamp_ns, 0, "{desc}: event timestamp");
            (event_name(e.kind).to_string(), e.backend_id, e.service_id)
        })
        .collect();
    let want: Vec<(String, u32, u32)> = expected
        .iter()
        .map(|(k, b, s)| (event_name(*k).to_string(), *b, *s))
        .collect();
    assert_eq!(got, want, "{desc}: events (kind, backend, service)");
}

#[test]
fn dsr_syn_retransmit_event_once_and_ack_completes() {
    let mut lb = world(&[DSR4]);
    let syn = to_vip(DSR4, CPORT, TCP_SYN);
    let fx = |desc, counters| Fixture {
        desc,
        input: syn.bytes(),
        action: XDP_TX,
        output: Out::Frame(dsr_expected(&syn, 1)),
        counters,
    };
    check(&mut lb, fx("SYN", &[(TX_DSR, 1), (FLOW_NEW, 1)]));
    assert_events(&mut lb, "after the first SYN", &[]);
    check(
        &mut lb,
        fx(
            "a SYN resent at once (no RTO passed): not a retransmission",
            &[(TX_DSR, 1), (FLOW_HIT, 1)],
        ),
    );
    assert_events(&mut lb, "after an immediate resend", &[]);
    age_flow(&mut lb, &client_key(DSR4, CPORT), INITIAL_RTO_NS);
    check(
        &mut lb,
        fx(
            "SYN retransmitted an initial RTO later",
            &[(TX_DSR, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
        ),
    );
    age_flow(&mut lb, &client_key(DSR4, CPORT), 2 * INITIAL_RTO_NS);
    check(
        &mut lb,
        fx("second retransmission", &[(TX_DSR, 1), (FLOW_HIT, 1)]),
    );
    assert_events(
        &mut lb,
        "after three SYNs",
        &[(EVENT_SYN_RETRANSMIT, 1, DSR4)],
    );
    let flow = lb.flow(&client_key(DSR4, CPORT)).expect("flow");
    assert_eq!(
        flow.flags,
        FLOW_F_SYN_PENDING | FLOW_F_REPORTED,
        "pending and reported"
    );
    let ack = to_vip(DSR4, CPORT, TCP_ACK);
    check(
        &mut lb,
        Fixture {
            desc: "the client's ACK completes the handshake",
            input: ack.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&ack, 1)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
    assert_eq!(lb.backend_stats(1).conn_ok, 1, "ACK counts conn_ok");
    check(
        &mut lb,
        fx(
            "a SYN after the handshake: new connection, no event",
            &[(TX_DSR, 1), (FLOW_HIT, 1)],
        ),
    );
    assert_events(&mut lb, "after the reconnect", &[]);

    // A fresh flow whose handshake completes gets no event and one conn_ok.
    let syn2 = to_vip(DSR4, CPORT + 1, TCP_SYN);
    lb.run(&syn2.bytes());
    lb.run(&to_vip(DSR4, CPORT + 1, TCP_ACK).bytes());
    lb.run(&to_vip(DSR4, CPORT + 1, TCP_ACK | TCP_PSH).bytes());
    assert_eq!(lb.backend_stats(1).conn_ok, 2, "one conn_ok per handshake");
    assert_events(&mut lb, "completed handshake", &[]);
}

#[test]
fn nat_syn_retransmit_and_rst_on_syn_events() {
    let mut lb = world(&[NAT4]);
    let syn = to_vip(NAT4, CPORT, TCP_SYN);
    let port = nat_forward(
        &mut lb,
        "SYN",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    age_flow(&mut lb, &client_key(NAT4, CPORT), INITIAL_RTO_NS);
    nat_forward(
        &mut lb,
        "retransmitted SYN",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
    );
    assert_events(
        &mut lb,
        "nat SYN retransmit",
        &[(EVENT_SYN_RETRANSMIT, 2, NAT4)],
    );

    // Another flow refused by the backend.
    let syn2 = to_vip(NAT4, CPORT + 7, TCP_SYN);
    let port2 = nat_forward(
        &mut lb,
        "SYN 2",
        &syn2,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let rst = backend_reply(NAT4, port2, TCP_RST | TCP_ACK);
    nat_reply(
        &mut lb,
        "backend RST answering the SYN: translated and reported",
        &rst,
        NAT4,
        CPORT + 7,
        &[(TX_NAT_REPLY, 1), (EVENTS_SENT, 1)],
    );
    nat_reply(
        &mut lb,
        "second RST: no second event",
        &rst,
        NAT4,
        CPORT + 7,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_events(&mut lb, "RST on SYN", &[(EVENT_RST_ON_SYN, 2, NAT4)]);
    assert_eq!(lb.backend_stats(2).conn_ok, 0, "no handshake completed");

    // The first flow completes after all.
    let synack = backend_reply(NAT4, port, TCP_SYN | TCP_ACK);
    nat_reply(
        &mut lb,
        "late SYN-ACK",
        &synack,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(lb.backend_stats(2).conn_ok, 1, "SYN-ACK counts conn_ok");
}

// ICMP unreachable: bpf_fixtures/icmp.rs (with its source and state checks).

#[test]
fn a_full_ring_buffer_drops_events_and_counts_them() {
    let mut lb = world(&[DSR4]);
    // 24-byte records + 8-byte headers: 8192 slots in EVENT_RING_BYTES (256 KiB), of
    // which the kernel fills one less (a completely full ring would look empty).
    let capacity = (lb_common::EVENT_RING_BYTES / 32 - 1) as u16;
    let flows = capacity + 50;
    for i in 0..flows {
        let syn = to_vip(DSR4, 1000 + i, TCP_SYN).bytes();
        lb.run(&syn);
        age_flow(&mut lb, &client_key(DSR4, 1000 + i), INITIAL_RTO_NS);
        let again = lb.run(&syn);
        assert_eq!(again.action, XDP_TX, "a full ring never blocks forwarding");
    }
    let c = lb.counters();
    assert_eq!(
        (c[EVENTS_SENT as usize], c[EVENTS_LOST as usize]),
        (u64::from(capacity), 50),
        "(events_sent, events_lost) with a ring of {capacity} records"
    );
    assert_eq!(
        lb.drain_events().len(),
        usize::from(capacity),
        "events in the ring"
    );
}

#[test]
fn nat_syn_resent_after_any_backend_answer_is_not_a_failure() {
    // The PAWS case: the backend's TIME_WAIT socket answers the SYN with a bare ACK, the
    // client resets and sends its SYN again ~10 ms later.
    let mut lb = world(&[NAT4]);
    let syn = to_vip(NAT4, CPORT, TCP_SYN);
    let port = nat_forward(
        &mut lb,
        "SYN",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    nat_reply(
        &mut lb,
        "the backend answers with a bare ACK",
        &backend_reply(NAT4, port, TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(
        lb.nat_entry(&reply_key(NAT4, port))
            .expect("entry")
            .handshake
            & lb_common::maps::NAT_H_PENDING,
        0,
        "any answer ends the wait (in the reverse entry)"
    );
    assert_eq!(lb.backend_stats(2).conn_ok, 0, "a bare ACK is no handshake");
    nat_forward(
        &mut lb,
        "the client's RST",
        &to_vip(NAT4, CPORT, TCP_RST),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    let flow = lb.flow(&client_key(NAT4, CPORT)).expect("flow");
    assert_eq!(
        flow.flags & FLOW_F_SYN_PENDING,
        0,
        "the client's next packet ends the flow's wait"
    );
    age_flow(&mut lb, &client_key(NAT4, CPORT), INITIAL_RTO_NS);
    let again = nat_forward(
        &mut lb,
        "the SYN again, even an RTO later: a new connection, no event",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(
        again, port,
        "a reset connection's port is reused by the same flow"
    );
    assert_events(&mut lb, "answered handshake", &[]);
    let flow = lb.flow(&client_key(NAT4, CPORT)).expect("flow");
    assert_eq!(
        flow.flags & FLOW_F_SYN_PENDING,
        FLOW_F_SYN_PENDING,
        "the new SYN waits again"
    );
    assert_eq!(
        lb.nat_entry(&reply_key(NAT4, port)).expect("entry").state,
        0,
        "the reverse entry starts over for the new connection"
    );

    // A resend of the new SYN before an RTO: still nothing; after one: the backend
    // has been silent since, which is a failure.
    nat_forward(
        &mut lb,
        "resent at once",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    age_flow(&mut lb, &client_key(NAT4, CPORT), INITIAL_RTO_NS);
    nat_forward(
        &mut lb,
        "resent an RTO later, the backend silent",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
    );
    assert_events(
        &mut lb,
        "silent backend",
        &[(EVENT_SYN_RETRANSMIT, 2, NAT4)],
    );
}

#[test]
fn syn_resend_threshold_is_just_under_the_initial_rto() {
    let mut lb = world(&[DSR4]);
    let syn = to_vip(DSR4, CPORT, TCP_SYN);
    lb.run(&syn.bytes());
    // 700 ms: below the threshold (800 ms) even with a tick of clock lag.
    age_flow(&mut lb, &client_key(DSR4, CPORT), 700_000_000);
    lb.run(&syn.bytes());
    assert_events(&mut lb, "a resend 0.7 s after the SYN", &[]);
    age_flow(&mut lb, &client_key(DSR4, CPORT), 100_000_000);
    lb.run(&syn.bytes());
    assert_events(
        &mut lb,
        "a resend 0.8 s after the SYN",
        &[(EVENT_SYN_RETRANSMIT, 1, DSR4)],
    );
}
