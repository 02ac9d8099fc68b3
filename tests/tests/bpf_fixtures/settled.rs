//! The settled-flow path (`lb-ebpf/src/settled.rs`): a flow that sits only in this
//! CPU's cache still has its packets checked as the full path checks them, and a VIP
//! removed while a flow sits in the cache takes the flow's packets with it.
//!
//! Each case puts a dsr flow in the cache and takes it out of `LB_FLOWS` (an eviction)
//! while the Maglev table points elsewhere: only the cache could send a packet of the
//! flow to backend 1. A final ACK served from the cache (or, around a VIP removal, a
//! read of the flow clock) proves the copy was live through the case (a cached copy
//! serves only the tick it was made in; a case that straddled two ticks is retried with
//! a new flow).

use super::prelude::*;
use lb_common::maps::FlowValue;
use lb_tests::bench::cpu::pin_self;

/// Backend the Maglev table points at while the flow sits in the cache on backend 1.
const OTHER: u32 = 9;

/// A world where `sport`'s flow sits only in CPU 0's cache, pinned to backend 1.
fn cached_only(lb: &mut Lb, sport: u16) {
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
            desc: "a pinned flow's ACK through LB_FLOWS caches it",
            input: ack.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&ack, 1)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
    assert!(lb.cached_flow(0, &key).is_some(), "cached on CPU 0");
    lb.remove_flow(&key);
}

/// Whether a good ACK of `sport`'s flow was still served from the cache (backend 1,
/// `LB_FLOWS` untouched); `false` when the tick moved on (the ACK then opened the flow
/// on [`OTHER`]: the case is to be retried).
fn still_cached(lb: &mut Lb, sport: u16) -> bool {
    let ack = to_vip(DSR4, sport, TCP_ACK).payload(b"more");
    let before = lb.counters();
    let run = lb.run(&ack.bytes());
    let after = lb.counters();
    assert_eq!(run.action, XDP_TX);
    if lb.flow(&client_key(DSR4, sport)).is_some() {
        assert_frames_eq(
            "re-opened by the table",
            &dsr_expected(&ack, OTHER),
            &run.out,
        );
        return false;
    }
    assert_frames_eq("served from the cache", &dsr_expected(&ack, 1), &run.out);
    assert_eq!(
        named(&counter_deltas(&before, &after)),
        named(&[(RX, 1), (TX_DSR, 1), (FLOW_HIT, 1)])
    );
    true
}

fn world_elsewhere() -> Lb {
    world_elsewhere_with(&[DSR4])
}

fn world_elsewhere_with(services: &[u32]) -> Lb {
    let mut lb = world(services);
    lb.set_backend(OTHER, backend(ip4(10, 0, 1, 19), 80, OTHER, DSR4));
    lb.set_maglev_all(DSR4, OTHER);
    lb
}

#[test]
fn a_cached_flows_packet_that_validation_refuses_is_still_refused() {
    pin_self(0).expect("pinning to CPU 0");
    let mut lb = world_elsewhere();
    let doff4 = |sport: u16| {
        let mut b = to_vip(DSR4, sport, TCP_ACK).bytes();
        b[14 + 20 + 12] = 4 << 4;
        b
    };
    for attempt in 0..50 {
        let sport = CPORT + attempt;
        cached_only(&mut lb, sport);
        let packets = lb.service_stats(DSR4).packets;
        let cases: [(&str, Vec<u8>, u32, u32); 6] = [
            (
                "TTL 1",
                {
                    let mut f = to_vip(DSR4, sport, TCP_ACK);
                    f.ttl = 1;
                    f.bytes()
                },
                XDP_PASS,
                PASS_TTL_EXPIRED,
            ),
            (
                "TTL 0",
                {
                    let mut f = to_vip(DSR4, sport, TCP_ACK);
                    f.ttl = 0;
                    f.bytes()
                },
                XDP_PASS,
                PASS_TTL_EXPIRED,
            ),
            (
                "PSH without ACK",
                to_vip(DSR4, sport, 0x08).bytes(),
                XDP_DROP,
                DROP_BAD_FLAGS,
            ),
            (
                "no flags (null scan)",
                to_vip(DSR4, sport, 0).bytes(),
                XDP_DROP,
                DROP_BAD_FLAGS,
            ),
            (
                "URG and PSH without ACK",
                to_vip(DSR4, sport, 0x28).bytes(),
                XDP_DROP,
                DROP_BAD_FLAGS,
            ),
            ("TCP data offset 4", doff4(sport), XDP_DROP, DROP_MALFORMED),
        ];
        for (desc, input, action, counter) in cases {
            check(
                &mut lb,
                Fixture {
                    desc,
                    input,
                    action,
                    output: if action == XDP_PASS {
                        Out::Unchanged
                    } else {
                        Out::Any
                    },
                    counters: &[(counter, 1)],
                },
            );
        }
        assert_eq!(
            lb.service_stats(DSR4).packets,
            packets,
            "no refused packet is counted as the service's"
        );
        if still_cached(&mut lb, sport) {
            return;
        }
        lb.remove_flow(&client_key(DSR4, sport));
    }
    panic!("the cached copy never lived through a case in 50 attempts");
}

/// Whether CPU 0 is still in the tick its cached copy of `sport`'s flow was made in:
/// a packet of another service (a new dsr UDP flow) reads the flow clock, which the
/// cache path does not.
fn same_tick(lb: &mut Lb, sport: u16) -> bool {
    let tick = lb
        .cached_flow(0, &client_key(DSR4, sport))
        .expect("the copy is still in the cache")
        .tick;
    let probe = to_vip(DSR4_UDP, sport, 0);
    assert_eq!(lb.run(&probe.bytes()).action, XDP_TX, "the clock probe");
    lb.clock_jiffies(0) as u32 == tick
}

#[test]
fn a_vip_removed_while_a_flow_sits_in_the_cache_takes_its_packets_with_it() {
    pin_self(0).expect("pinning to CPU 0");
    let mut lb = world_elsewhere_with(&[DSR4, DSR4_UDP]);
    let s = svc(DSR4);
    // Rewriting the VIP index takes a while (the agent's layout is rebuilt): the
    // removal and the packet after it fit in one tick often, not always.
    for attempt in 0..200 {
        let sport = CPORT + attempt;
        cached_only(&mut lb, sport);
        let meta = lb
            .remove_service(s.vip, s.port, s.proto)
            .expect("the service was configured");
        let ack = to_vip(DSR4, sport, TCP_ACK).payload(b"data");
        check(
            &mut lb,
            Fixture {
                desc: "no VIP: the cached flow's ACK is passed to the kernel",
                input: ack.bytes(),
                action: XDP_PASS,
                output: Out::Unchanged,
                counters: &[(PASS_NOT_VIP, 1)],
            },
        );
        let live = same_tick(&mut lb, sport);
        lb.add_service(s.vip, s.port, s.proto, meta);
        if live {
            return;
        }
    }
    panic!("the VIP never went in the tick of a cached copy in 200 attempts");
}
