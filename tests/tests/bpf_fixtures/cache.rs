//! Each CPU's flow cache in front of `LB_FLOWS`: collisions and evictions, a flow that
//! changes CPU, a table change while a flow sits only in the cache.

use super::prelude::*;
use lb_common::{hash::flow_cache_slot, maps::FlowValue};
use lb_tests::bench::cpu::pin_self;

/// Opens a dsr flow from `sport` on backend 1 and settles it (the ACK clears the
/// handshake wait): this CPU caches it.
fn open_settled(lb: &mut Lb, sport: u16) {
    for (desc, flags, counters) in [
        (
            "SYN opens the flow",
            TCP_SYN,
            &[(TX_DSR, 1), (FLOW_NEW, 1)][..],
        ),
        ("ACK settles it", TCP_ACK, &[(TX_DSR, 1), (FLOW_HIT, 1)][..]),
    ] {
        let frame = to_vip(DSR4, sport, flags);
        check(
            lb,
            Fixture {
                desc,
                input: frame.bytes(),
                action: XDP_TX,
                output: Out::Frame(dsr_expected(&frame, 1)),
                counters,
            },
        );
    }
}

fn ack_to(lb: &mut Lb, desc: &str, sport: u16, backend: u32, counters: &[(u32, u64)]) {
    let ack = to_vip(DSR4, sport, TCP_ACK).payload(b"data");
    check(
        lb,
        Fixture {
            desc,
            input: ack.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&ack, backend)),
            counters,
        },
    );
}

#[test]
fn cache_collisions_evict_and_a_state_changing_packet_drops_the_entry() {
    pin_self(0).expect("pinning to CPU 0");
    let mut lb = world(&[DSR4]);
    let a = CPORT;
    let slot = flow_cache_slot(&client_key(DSR4, a));
    let b = (a + 1..u16::MAX)
        .find(|&p| flow_cache_slot(&client_key(DSR4, p)) == slot)
        .expect("a colliding source port");

    open_settled(&mut lb, a);
    let cached = lb.cached_flow(0, &client_key(DSR4, a)).expect("A cached");
    assert_eq!(cached.backend_id, 1);
    open_settled(&mut lb, b);
    assert!(
        lb.cached_flow(0, &client_key(DSR4, b)).is_some(),
        "B cached"
    );
    assert!(
        lb.cached_flow(0, &client_key(DSR4, a)).is_none(),
        "B took A's slot"
    );
    ack_to(
        &mut lb,
        "evicted A goes through LB_FLOWS",
        a,
        1,
        &[(TX_DSR, 1), (FLOW_HIT, 1)],
    );
    assert!(lb.cached_flow(0, &client_key(DSR4, a)).is_some(), "A back");

    let fin = to_vip(DSR4, a, TCP_FIN | TCP_ACK);
    check(
        &mut lb,
        Fixture {
            desc: "a FIN goes through LB_FLOWS",
            input: fin.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&fin, 1)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
    assert!(
        lb.cached_flow(0, &client_key(DSR4, a)).is_none(),
        "a packet that needs flow state drops the flow from the cache"
    );
    let syn = to_vip(DSR4, a, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "a SYN reusing the 5-tuple waits for its handshake again",
            input: syn.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&syn, 1)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
    assert!(
        lb.cached_flow(0, &client_key(DSR4, a)).is_none(),
        "not settled"
    );
    let flow = lb.flow(&client_key(DSR4, a)).expect("flow entry");
    assert_eq!(flow.flags & FLOW_F_SYN_PENDING, FLOW_F_SYN_PENDING);
    ack_to(
        &mut lb,
        "its ACK settles it again",
        a,
        1,
        &[(TX_DSR, 1), (FLOW_HIT, 1)],
    );
    let flow = lb.flow(&client_key(DSR4, a)).expect("flow entry");
    assert_eq!(
        flow.flags, 0,
        "the ACK went through LB_FLOWS, not the cache"
    );
    assert_eq!(lb.backend_stats(1).conn_ok, 3, "three handshakes completed");
}

#[test]
fn a_flow_that_changes_cpu_keeps_its_backend_through_the_flow_table() {
    if aya::util::online_cpus().map_or(0, |c| c.len()) < 2 {
        panic!("this fixture needs two CPUs");
    }
    pin_self(0).expect("pinning to CPU 0");
    let mut lb = world(&[DSR4]);
    lb.set_backend(9, backend(ip4(10, 0, 1, 19), 80, 9, DSR4));
    open_settled(&mut lb, CPORT);
    let key = client_key(DSR4, CPORT);
    assert!(lb.cached_flow(0, &key).is_some(), "cached on CPU 0");
    lb.set_maglev_all(DSR4, 9);

    pin_self(1).expect("pinning to CPU 1");
    assert!(lb.cached_flow(1, &key).is_none(), "not cached on CPU 1");
    ack_to(
        &mut lb,
        "on CPU 1 the flow finds backend 1 in LB_FLOWS despite the new table",
        CPORT,
        1,
        &[(TX_DSR, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(
        lb.cached_flow(1, &key).expect("cached on CPU 1").backend_id,
        1
    );

    let mut b1 = lb.backend(1);
    b1.flags &= !BACKEND_F_LIVE;
    lb.set_backend(1, b1);
    ack_to(
        &mut lb,
        "backend 1 removed: CPU 1 re-pins the flow to backend 9",
        CPORT,
        9,
        &[(TX_DSR, 1), (FLOW_REHASH, 1)],
    );
    pin_self(0).expect("pinning to CPU 0");
    ack_to(
        &mut lb,
        "CPU 0's cached copy names a removed backend: LB_FLOWS sends it to 9",
        CPORT,
        9,
        &[(TX_DSR, 1), (FLOW_HIT, 1)],
    );
    assert_eq!(lb.cached_flow(0, &key).expect("re-cached").backend_id, 9);
    b1.flags |= BACKEND_F_LIVE;
    lb.set_backend(1, b1);
    ack_to(
        &mut lb,
        "backend 1 back: the flow stays on 9 on CPU 0",
        CPORT,
        9,
        &[(TX_DSR, 1), (FLOW_HIT, 1)],
    );
    pin_self(1).expect("pinning to CPU 1");
    ack_to(
        &mut lb,
        "and on CPU 1",
        CPORT,
        9,
        &[(TX_DSR, 1), (FLOW_HIT, 1)],
    );
}

#[test]
fn a_table_change_while_a_flow_sits_only_in_the_cache() {
    pin_self(0).expect("pinning to CPU 0");
    let mut lb = world(&[DSR4]);
    lb.set_backend(9, backend(ip4(10, 0, 1, 19), 80, 9, DSR4));
    lb.set_maglev_all(DSR4, 9);
    // The cached copy serves only the tick it was made in: retry (with a new flow)
    // until the two packets below run in one tick (a tick is 1-10 ms; they are a
    // syscall apart).
    for attempt in 0..50 {
        let sport = CPORT + attempt;
        let key = client_key(DSR4, sport);
        let pinned = FlowValue {
            backend_id: 1,
            ..FlowValue::default()
        };
        lb.set_flow(&key, pinned);
        ack_to(
            &mut lb,
            "a flow pinned to backend 1 keeps it after the table moved to 9",
            sport,
            1,
            &[(TX_DSR, 1), (FLOW_HIT, 1)],
        );
        let tick = lb.clock_jiffies(0);
        lb.remove_flow(&key);
        let ack = to_vip(DSR4, sport, TCP_ACK).payload(b"data");
        let before = lb.counters();
        let run = lb.run(&ack.bytes());
        let after = lb.counters();
        if lb.clock_jiffies(0) != tick {
            continue;
        }
        assert_eq!(run.action, XDP_TX);
        assert_frames_eq(
            "in the tick it was cached in, the flow keeps backend 1 from the cache",
            &dsr_expected(&ack, 1),
            &run.out,
        );
        assert_eq!(
            named(&counter_deltas(&before, &after)),
            named(&[(RX, 1), (TX_DSR, 1), (FLOW_HIT, 1)])
        );
        assert!(lb.flow(&key).is_none(), "the cache does not write LB_FLOWS");
        // A flow opened again (here by a SYN) while this CPU still holds the old copy:
        // the new entry wins at once.
        let syn = to_vip(DSR4, sport, TCP_SYN);
        let before = lb.counters();
        let run = lb.run(&syn.bytes());
        let after = lb.counters();
        assert_eq!(run.action, XDP_TX);
        assert_frames_eq(
            "the SYN opens the flow on 9",
            &dsr_expected(&syn, 9),
            &run.out,
        );
        assert_eq!(
            named(&counter_deltas(&before, &after)),
            named(&[(RX, 1), (TX_DSR, 1), (FLOW_NEW, 1)])
        );
        assert!(
            lb.cached_flow(0, &key).is_none(),
            "opening the flow dropped the stale cached copy"
        );
        lb.remove_flow(&key);

        // A later tick: the cached copy is stale, LB_FLOWS has no entry (as after an
        // eviction), so the packet opens the flow again by the new table.
        std::thread::sleep(std::time::Duration::from_millis(30));
        ack_to(
            &mut lb,
            "a tick later the flow goes through LB_FLOWS: re-opened on backend 9",
            sport,
            9,
            &[(TX_DSR, 1), (FLOW_NEW, 1)],
        );
        assert_eq!(lb.flow(&key).expect("pinned again").backend_id, 9);
        return;
    }
    panic!("never two packets in one tick in 50 attempts");
}
