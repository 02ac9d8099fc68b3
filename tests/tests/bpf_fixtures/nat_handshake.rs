//! The nat handshake signal kept in the reverse entry (`NAT_H_*`): a reply reads no
//! `LB_FLOWS`, and the passive signals count as before (conn_ok once per handshake, one
//! report per flow whichever path makes it, nothing for a forged reply).

use lb_common::maps::{NAT_H_PENDING, NAT_H_REPORTED, NAT_S_ACKED, NAT_S_ESTABLISHED};

use super::prelude::*;

/// Linux's initial SYN retransmission timeout (RFC 6298).
const INITIAL_RTO_NS: u64 = 1_000_000_000;

fn handshake_of(lb: &Lb, port: u16) -> u8 {
    lb.nat_entry(&reply_key(NAT4, port))
        .expect("reverse entry")
        .handshake
}

fn events(lb: &mut Lb) -> Vec<(u32, u32)> {
    lb.drain_events()
        .iter()
        .map(|e| (e.kind, e.backend_id))
        .collect()
}

fn open(lb: &mut Lb, cport: u16) -> u16 {
    nat_forward(
        lb,
        "SYN",
        &to_vip(NAT4, cport, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    )
}

#[test]
fn nat_syn_ack_counts_conn_ok_once_from_the_reverse_entry() {
    let mut lb = world(&[NAT4]);
    let port = open(&mut lb, CPORT);
    assert_eq!(
        handshake_of(&lb, port),
        NAT_H_PENDING,
        "the SYN's entry waits"
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
    assert_eq!(lb.backend_stats(2).conn_ok, 1, "SYN-ACK after SYN: conn_ok");
    assert_eq!(handshake_of(&lb, port), 0, "the wait ended in the entry");
    let flow = lb.flow(&client_key(NAT4, CPORT)).expect("flow");
    assert_eq!(
        flow.flags & (FLOW_F_SYN_PENDING | FLOW_F_NAT_AWAIT),
        FLOW_F_SYN_PENDING,
        "the reply did not touch the flow entry"
    );
    nat_reply(
        &mut lb,
        "retransmitted SYN-ACK",
        &synack,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(
        lb.backend_stats(2).conn_ok,
        1,
        "a retransmission counts nothing"
    );
    nat_forward(
        &mut lb,
        "the client's ACK",
        &to_vip(NAT4, CPORT, TCP_ACK),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    let flow = lb.flow(&client_key(NAT4, CPORT)).expect("flow");
    assert_eq!(flow.flags, 0, "the flow learnt the answer: settled");
    let entry = lb.nat_entry(&reply_key(NAT4, port)).expect("entry");
    assert_eq!(
        entry.state & (NAT_S_ESTABLISHED | NAT_S_ACKED),
        NAT_S_ESTABLISHED | NAT_S_ACKED,
        "the ACK of the SYN-ACK noted"
    );
    nat_reply(
        &mut lb,
        "SYN-ACK after the handshake",
        &synack,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(lb.backend_stats(2).conn_ok, 1, "still once");
    assert_eq!(events(&mut lb), vec![], "no event");

    // A new connection on the same 5-tuple waits and counts again.
    nat_forward(
        &mut lb,
        "a new SYN on the settled flow",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(handshake_of(&lb, port), NAT_H_PENDING, "waits again");
    nat_reply(
        &mut lb,
        "its SYN-ACK",
        &synack,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(lb.backend_stats(2).conn_ok, 2, "one conn_ok per handshake");
}

#[test]
fn nat_forged_syn_ack_for_an_unknown_port_counts_nothing() {
    let mut lb = world(&[NAT4]);
    let port = open(&mut lb, CPORT);
    let other = if port == u16::MAX { port - 1 } else { port + 1 };
    assert!(
        lb.nat_entry(&reply_key(NAT4, other)).is_none(),
        "setup: unused"
    );
    for flags in [TCP_SYN | TCP_ACK, TCP_RST | TCP_ACK, TCP_RST] {
        check(
            &mut lb,
            Fixture {
                desc: "a reply to a port no flow holds",
                input: backend_reply(NAT4, other, flags).bytes(),
                action: XDP_PASS,
                output: Out::Unchanged,
                counters: &[(PASS_NOT_VIP, 1)],
            },
        );
    }
    assert_eq!(lb.backend_stats(2).conn_ok, 0, "no conn_ok");
    assert_eq!(events(&mut lb), vec![], "no event");
    assert_eq!(
        handshake_of(&lb, port),
        NAT_H_PENDING,
        "the real flow still waits"
    );
}

#[test]
fn nat_rst_on_syn_and_a_later_retransmission_make_one_report() {
    let mut lb = world(&[NAT4]);
    let port = open(&mut lb, CPORT);
    nat_reply(
        &mut lb,
        "the backend refuses the SYN",
        &backend_reply(NAT4, port, TCP_RST | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1), (EVENTS_SENT, 1)],
    );
    assert_eq!(
        handshake_of(&lb, port),
        NAT_H_REPORTED,
        "answered and reported"
    );
    assert_eq!(events(&mut lb), vec![(EVENT_RST_ON_SYN, 2)]);
    // The client tries again: a new connection on the flow, then a real retransmission
    // an RTO later, unanswered. The flow has had its report.
    nat_forward(
        &mut lb,
        "the client's new SYN",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(
        handshake_of(&lb, port),
        NAT_H_PENDING | NAT_H_REPORTED,
        "waits again, the report kept"
    );
    let flow = lb.flow(&client_key(NAT4, CPORT)).expect("flow");
    assert_eq!(
        flow.flags & (FLOW_F_SYN_PENDING | FLOW_F_REPORTED),
        FLOW_F_SYN_PENDING | FLOW_F_REPORTED,
        "the flow learnt the report"
    );
    let mut f = flow;
    f.last_seen_ns -= INITIAL_RTO_NS;
    lb.set_flow(&client_key(NAT4, CPORT), f);
    nat_forward(
        &mut lb,
        "retransmitted an RTO later",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    nat_reply(
        &mut lb,
        "refused again",
        &backend_reply(NAT4, port, TCP_RST | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(events(&mut lb), vec![], "one report per flow");
}

#[test]
fn nat_retransmission_report_reaches_the_reply_path() {
    let mut lb = world(&[NAT4]);
    let port = open(&mut lb, CPORT);
    let key = client_key(NAT4, CPORT);
    let mut f = lb.flow(&key).expect("flow");
    f.last_seen_ns -= INITIAL_RTO_NS;
    lb.set_flow(&key, f);
    nat_forward(
        &mut lb,
        "retransmitted SYN, the backend silent",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
    );
    assert_eq!(events(&mut lb), vec![(EVENT_SYN_RETRANSMIT, 2)]);
    assert_eq!(
        handshake_of(&lb, port),
        NAT_H_PENDING | NAT_H_REPORTED,
        "the report noted in the entry"
    );
    nat_reply(
        &mut lb,
        "then the backend refuses it",
        &backend_reply(NAT4, port, TCP_RST | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(events(&mut lb), vec![], "no second report");
}

#[test]
fn nat_reinserted_entry_keeps_the_handshake_wait() {
    let mut lb = world(&[NAT4]);
    let port = open(&mut lb, CPORT);
    let key = client_key(NAT4, CPORT);
    // The entry is lost (its bucket was busy, or its port reclaimed); the flow's next
    // packet claims it again (a waiting flow verifies its entry with every packet: its
    // `nat_tick` holds the SYN's ISN, not a tick).
    lb.remove_nat(&reply_key(NAT4, port));
    assert_eq!(
        lb.flow(&key).expect("flow").flags & FLOW_F_SYN_PENDING,
        FLOW_F_SYN_PENDING
    );
    nat_forward(
        &mut lb,
        "the client's SYN again, at once",
        &to_vip(NAT4, CPORT, TCP_SYN),
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(
        handshake_of(&lb, port),
        NAT_H_PENDING,
        "claimed again, waiting"
    );
    nat_reply(
        &mut lb,
        "SYN-ACK",
        &backend_reply(NAT4, port, TCP_SYN | TCP_ACK),
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    assert_eq!(lb.backend_stats(2).conn_ok, 1, "the handshake counts");
}
