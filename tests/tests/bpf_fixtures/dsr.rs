//! dsr: only the MACs change.

use super::prelude::*;

#[test]
fn dsr_ipv4_rewrites_only_the_macs() {
    let mut lb = world(&[DSR4, DSR4_UDP]);
    let syn = to_vip(DSR4, CPORT, TCP_SYN).payload(b"hello");
    check(
        &mut lb,
        Fixture {
            desc: "dsr: SYN to 10.0.0.100:80 goes to backend 1's MAC, IP/TCP untouched",
            input: syn.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&syn, 1)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
    let len = syn.bytes().len() as u64;
    let s = lb.service_stats(DSR4);
    assert_eq!(
        (s.packets, s.bytes, s.new_flows, s.no_backend),
        (1, len, 1, 0),
        "service stats (packets, bytes, new_flows, no_backend)"
    );
    let b = lb.backend_stats(1);
    assert_eq!(
        (b.packets, b.bytes, b.new_flows),
        (1, len, 1),
        "backend stats (packets, bytes, new_flows)"
    );
    let batched = lb.backend_stats_batched(4);
    assert_eq!(batched.len(), 4, "ids 0..4 read in one batch");
    for (id, stats) in batched.iter().enumerate() {
        assert_eq!(
            *stats,
            lb.backend_stats(id as u32),
            "backend {id}: the batch read (the agent's) equals the per-id read"
        );
    }
    let flow = lb
        .flow(&client_key(DSR4, CPORT))
        .expect("the SYN must create a flow entry");
    assert_eq!(flow.backend_id, 1, "flow pinned to backend 1");
    assert_eq!(
        flow.flags, FLOW_F_SYN_PENDING,
        "a SYN leaves the flow pending"
    );
    assert_ne!(flow.last_seen_ns, 0, "last_seen_ns set");

    let ack = to_vip(DSR4, CPORT, TCP_ACK | TCP_PSH).vlan(7);
    check(
        &mut lb,
        Fixture {
            desc: "dsr: VLAN-tagged packet of the same flow keeps its tag and backend",
            input: ack.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&ack, 1)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );

    let again = lb.flow(&client_key(DSR4, CPORT)).expect("flow entry");
    assert_eq!(
        again.last_seen_ns, flow.last_seen_ns,
        "last_seen_ns is refreshed at most once a second"
    );

    let udp = to_vip(DSR4_UDP, CPORT, 0).payload(b"q");
    check(
        &mut lb,
        Fixture {
            desc: "dsr: UDP to 10.0.0.100:53",
            input: udp.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&udp, 1)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
}

#[test]
fn dsr_ipv6() {
    let mut lb = world(&[DSR6]);
    let syn = to_vip(DSR6, CPORT, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "dsr: IPv6 SYN to [fd00::100]:80 goes to backend 4's MAC",
            input: syn.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&syn, 4)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
    let flow = lb.flow(&client_key(DSR6, CPORT)).expect("IPv6 flow entry");
    assert_eq!(flow.backend_id, 4, "IPv6 flow pinned to backend 4");
}

#[test]
fn ipv4_options_are_skipped_by_ihl() {
    let mut lb = world(&[DSR4, NAT4]);
    let mut syn = to_vip(DSR4, CPORT, TCP_SYN);
    syn.v4.options = vec![1, 1, 1, 0]; // NOP NOP NOP EOL: IHL 6
    check(
        &mut lb,
        Fixture {
            desc: "dsr: IPv4 with options (IHL 6): ports read after the options",
            input: syn.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&syn, 1)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
    let mut syn = to_vip(NAT4, CPORT, TCP_SYN);
    syn.v4.options = vec![1, 1, 1, 0];
    nat_forward(
        &mut lb,
        "nat: IPv4 with options translated, checksums valid",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
}
