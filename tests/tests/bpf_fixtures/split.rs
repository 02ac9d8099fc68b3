//! The two programs (`lb-ebpf/src/full.rs`): `lb_xdp` serves a VIP miss, a nat reply
//! that notes no handshake or close, a refused VIP packet and a settled flow from the cache itself, and hands every other
//! packet to `lb_xdp_full` by a tail call through `LB_PROGRAMS`. With the array
//! emptied, the packets `lb_xdp` serves keep their verdicts (they never enter the
//! second program) and the others are dropped and counted `drop_no_full_path`; filled
//! again, they take the full path with the verdicts they had.

use super::prelude::*;
use lb_common::maps::{FlowCacheEntry, FlowValue};
use lb_tests::bench::cpu::pin_self;

/// Flows cached by hand for the ticks after the one a flow was cached in: more than the
/// ticks that writing them and emptying `LB_PROGRAMS` may take.
const CACHED_FLOWS: usize = 1500;

/// Puts `sport`'s dsr flow into `LB_FLOWS` (pinned to backend 1) and, through one ACK
/// that takes the full path, into CPU 0's cache.
fn cache_flow(lb: &mut Lb, sport: u16) {
    let key = client_key(DSR4, sport);
    lb.set_flow(
        &key,
        FlowValue {
            backend_id: 1,
            ..FlowValue::default()
        },
    );
    let ack = to_vip(DSR4, sport, TCP_ACK).payload(b"data");
    check(
        lb,
        Fixture {
            desc: "a pinned flow's ACK through lb_xdp_full caches it",
            input: ack.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&ack, 1)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
    assert!(lb.cached_flow(0, &key).is_some(), "cached on CPU 0");
}

#[test]
fn without_the_full_path_only_the_packets_that_need_it_are_dropped() {
    pin_self(0).expect("pinning to CPU 0");
    let mut lb = world(&[DSR4, NAT4]);
    // A nat flow opened through the full path, for its reply below.
    let syn = to_vip(NAT4, CPORT, TCP_SYN).payload(b"abc");
    let port = nat_forward(
        &mut lb,
        "nat SYN through lb_xdp_full",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );

    // The SYN-ACK ends the handshake the reverse entry waits for: the full path.
    let synack = backend_reply(NAT4, port, TCP_SYN | TCP_ACK).payload(b"xyz!");
    nat_reply(
        &mut lb,
        "a nat SYN-ACK through lb_xdp_full",
        &synack,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );

    // Settled flows served from the cache with the array empty: the tail call was never
    // made (or their packets would have been dropped). A cached copy serves only the
    // tick it was made in, and emptying the array can take longer than a tick, so the
    // flows are cached by hand for the ticks that follow the one the full path cached a
    // flow in (`t0`), flow i for tick t0 + i, and sent in that order: tick(i) - t0 - i
    // starts at >= 0 and falls by one or by nothing per packet, so at least one flow
    // meets its tick. Every other one misses and is dropped.
    cache_flow(&mut lb, 41_000);
    let t0 = lb
        .cached_flow(0, &client_key(DSR4, 41_000))
        .expect("cached")
        .tick;
    lb.clear_full_path();
    let mut slots = std::collections::BTreeSet::new();
    let flows: Vec<u16> = (41_001..60_000)
        .filter(|&sport| slots.insert(lb_common::hash::flow_cache_slot(&client_key(DSR4, sport))))
        .take(CACHED_FLOWS)
        .collect();
    for (i, &sport) in flows.iter().enumerate() {
        lb.set_cached_flow(
            0,
            FlowCacheEntry {
                key: client_key(DSR4, sport),
                backend_id: 1,
                tick: t0.wrapping_add(i as u32),
                ..FlowCacheEntry::default()
            },
        );
    }
    let before = lb.counters();
    let mut served = 0;
    for &sport in &flows {
        let ack = to_vip(DSR4, sport, TCP_ACK).payload(b"more");
        let run = lb.run(&ack.bytes());
        if run.action == XDP_TX {
            assert_frames_eq("served from the cache", &dsr_expected(&ack, 1), &run.out);
            served += 1;
        } else {
            assert_eq!(run.action, XDP_DROP, "a cache miss without the full path");
        }
    }
    let deltas = counter_deltas(&before, &lb.counters());
    assert!(served >= 1, "no flow was served from the cache in its tick");
    let n = flows.len() as u64;
    assert_eq!(
        named(&deltas),
        named(&[
            (RX, n),
            (TX_DSR, served),
            (FLOW_HIT, served),
            (DROP_NO_FULL_PATH, n - served)
        ]),
        "{served} of {n} flows served from the cache"
    );
    lb.fill_full_path();

    lb.clear_full_path();
    let mut miss = to_vip(DSR4, CPORT, TCP_ACK).payload(b"x");
    miss.dst = ip4(10, 9, 9, 9);
    check(
        &mut lb,
        Fixture {
            desc: "a packet to no service is passed by lb_xdp",
            input: miss.bytes(),
            action: XDP_PASS,
            output: Out::Unchanged,
            counters: &[(PASS_NOT_VIP, 1)],
        },
    );
    let ack = backend_reply(NAT4, port, TCP_ACK).payload(b"data");
    nat_reply(
        &mut lb,
        "a settled nat reply is translated by lb_xdp",
        &ack,
        NAT4,
        CPORT,
        &[(TX_NAT_REPLY, 1)],
    );
    let fin = backend_reply(NAT4, port, TCP_FIN | TCP_ACK);
    check(
        &mut lb,
        Fixture {
            desc: "a nat reply that closes (noted by the full path) without it",
            input: fin.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_NO_FULL_PATH, 1)],
        },
    );
    let mut expired = to_vip(DSR4, 42_000, TCP_SYN);
    expired.ttl = 1;
    check(
        &mut lb,
        Fixture {
            desc: "a VIP packet to_vip refuses is refused by lb_xdp",
            input: expired.bytes(),
            action: XDP_PASS,
            output: Out::Unchanged,
            counters: &[(PASS_TTL_EXPIRED, 1)],
        },
    );

    let new = to_vip(DSR4, 42_001, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "a new flow without the full path",
            input: new.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_NO_FULL_PATH, 1)],
        },
    );
    assert!(
        lb.flow(&client_key(DSR4, 42_001)).is_none(),
        "no flow opened"
    );
    let key = client_key(DSR4, 42_002);
    lb.set_flow(
        &key,
        FlowValue {
            backend_id: 1,
            ..FlowValue::default()
        },
    );
    let uncached = to_vip(DSR4, 42_002, TCP_ACK).payload(b"data");
    check(
        &mut lb,
        Fixture {
            desc: "an established packet this CPU has not cached, without the full path",
            input: uncached.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_NO_FULL_PATH, 1)],
        },
    );
    let mut icmp = to_vip(NAT4, CPORT, 0);
    let lb_side = icmp.dst_mac;
    icmp = Frame::icmp(ip4(10, 0, 1, 11), snat(svc(NAT4).vip), 3, 1)
        .macs(CLIENT_MAC, lb_side)
        .payload(&[0; 28]);
    check(
        &mut lb,
        Fixture {
            desc: "an ICMP error (handled by the full path) without it",
            input: icmp.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_NO_FULL_PATH, 1)],
        },
    );

    // Filled again: the same packets get the verdicts of the full path.
    lb.fill_full_path();
    check(
        &mut lb,
        Fixture {
            desc: "the new flow through lb_xdp_full",
            input: new.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&new, 1)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
    check(
        &mut lb,
        Fixture {
            desc: "the uncached established packet through lb_xdp_full",
            input: uncached.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&uncached, 1)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
}
