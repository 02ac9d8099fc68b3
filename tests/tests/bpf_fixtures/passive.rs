//! Passive signals: SYN retransmit, RST on SYN, ICMP unreachable, conn_ok.

use super::prelude::*;

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
            "retransmitted SYN",
            &[(TX_DSR, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
        ),
    );
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
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1)],
    );
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
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1)],
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
