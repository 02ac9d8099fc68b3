//! The flow table's buckets (`LB_FLOWS`, a set-associative array, docs/internals/fast-path.md): a
//! bucket full of active flows gives its longest-idle way to a new flow (counted
//! `FLOW_EVICTED`), an idle flow's way is reused without counting, and two CPUs opening
//! flows into the same buckets at once never put a key in twice.

use super::prelude::*;
use lb_common::{
    maps::FlowValue,
    table::{FLOW_IDLE_NS, TABLE_WAYS, TableLayout},
};
use lb_tests::bpf::clock::monotonic_ns as now_ns;

/// A flow of another client that the test puts in a bucket of its choice (the table
/// never checks that a way's key hashes to its bucket; the program compares keys).
fn stranger(n: u16) -> FlowKey {
    flow_key(
        ip4(10, 77, 0, 1),
        9000 + n,
        ip4(10, 0, 0, 1),
        80,
        IPPROTO_TCP,
    )
}

/// A settled flow on backend 1 last seen `idle_ns` ago.
fn seen_ago(idle_ns: u64) -> FlowValue {
    FlowValue {
        backend_id: 1,
        last_seen_ns: now_ns() - idle_ns,
        ..FlowValue::default()
    }
}

/// Fills every way of `key`'s bucket with flows of other clients, way `w` last seen
/// `idle(w)` ago; returns the bucket's index.
fn fill_bucket(lb: &mut Lb, key: &FlowKey, idle: impl Fn(usize) -> u64) -> u32 {
    let index = lb.layout().flow_bucket(key);
    for way in 0..TABLE_WAYS as usize {
        lb.write_flow_way(index, way, stranger(way as u16), seen_ago(idle(way)));
    }
    index
}

#[test]
fn a_full_flow_bucket_of_talking_flows_pins_no_new_dsr_flow() {
    let mut lb = world(&[DSR4]);
    let key = client_key(DSR4, CPORT);
    // All active (seen within the idle timeout); way 2 longest ago.
    let idle = |w: usize| {
        if w == 2 {
            60_000_000_000
        } else {
            1_000_000_000 * w as u64
        }
    };
    fill_bucket(&mut lb, &key, idle);

    let syn = to_vip(DSR4, CPORT, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "a SYN into a bucket full of established flows: forwarded, not pinned",
            input: syn.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&syn, 1)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1), (FLOW_UNPINNED, 1)],
        },
    );
    let (_, bucket) = lb.flow_bucket_of(&key);
    for w in 0..TABLE_WAYS as u16 {
        let way = &bucket.ways[w as usize];
        assert_eq!((way.key, way.word & 1), (stranger(w), 1), "way {w} kept");
    }

    // Its ACK proves nothing in dsr (a spoofed source sends ACKs as easily): the flow
    // stays unpinned, forwarded by its Maglev choice, while all four flows talk.
    let ack = to_vip(DSR4, CPORT, TCP_ACK);
    check(
        &mut lb,
        Fixture {
            desc: "its ACK: forwarded, not pinned",
            input: ack.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&ack, 1)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1), (FLOW_UNPINNED, 1)],
        },
    );
    let (_, bucket) = lb.flow_bucket_of(&key);
    for w in 0..TABLE_WAYS as u16 {
        let way = &bucket.ways[w as usize];
        assert_eq!((way.key, way.word & 1), (stranger(w), 1), "way {w} kept");
    }
}

#[test]
fn an_idle_flows_way_is_reused_without_an_eviction() {
    let mut lb = world(&[DSR4]);
    let key = client_key(DSR4, CPORT);
    // Way 1 idle past the timeout, the others active.
    let idle = |w: usize| {
        if w == 1 {
            FLOW_IDLE_NS + 5_000_000_000
        } else {
            1_000_000_000
        }
    };
    fill_bucket(&mut lb, &key, idle);

    let syn = to_vip(DSR4, CPORT, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "a SYN into a bucket with an idle flow: its way, no eviction counted",
            input: syn.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&syn, 1)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
    let (_, bucket) = lb.flow_bucket_of(&key);
    assert_eq!(bucket.ways[1].key, key, "the idle way holds the new flow");
    for w in [0u16, 2, 3] {
        assert_eq!(bucket.ways[w as usize].key, stranger(w), "way {w} kept");
    }

    // A free way goes before an idle one: way 0 left free, a second new flow.
    let other = client_key(DSR4, CPORT + 1);
    let index = lb.layout().flow_bucket(&other);
    assert_ne!(
        index,
        lb.layout().flow_bucket(&key),
        "the two flows' buckets differ"
    );
    for way in 1..TABLE_WAYS as usize {
        let idle = if way == 3 {
            FLOW_IDLE_NS + 5_000_000_000
        } else {
            1_000_000_000
        };
        lb.write_flow_way(index, way, stranger(10 + way as u16), seen_ago(idle));
    }
    let syn = to_vip(DSR4, CPORT + 1, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "a free way is taken before an idle flow's",
            input: syn.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&syn, 1)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
    let (_, bucket) = lb.flow_bucket_of(&other);
    assert_eq!(bucket.ways[0].key, other, "the free way holds the flow");
    assert_eq!(bucket.ways[3].key, stranger(13), "the idle flow is kept");
}

/// Client ports of DSR4's flows whose `LB_FLOWS` buckets are `BUCKETS` buckets,
/// `TABLE_WAYS` keys each: every way of those buckets is wanted by exactly one flow.
fn colliding_ports(layout: TableLayout) -> Vec<u16> {
    const BUCKETS: usize = 8;
    let mut per: std::collections::BTreeMap<u32, Vec<u16>> = Default::default();
    let mut chosen = Vec::new();
    for port in 1024..u16::MAX {
        let b = layout.flow_bucket(&client_key(DSR4, port));
        let ports = per.entry(b).or_default();
        ports.push(port);
        if ports.len() == TABLE_WAYS as usize {
            chosen.extend(ports.iter().copied());
            if chosen.len() == BUCKETS * TABLE_WAYS as usize {
                return chosen;
            }
        }
    }
    panic!("not enough colliding client ports");
}

/// Two CPUs open flows whose keys fill the same buckets exactly, interleaved: claims
/// race for the same free ways. Whatever the interleaving, no way is claimed twice (a
/// flow that lost a race would push another out: `FLOW_EVICTED` stays 0), no key is
/// in the table twice, and every way holds one of the flows, pinned to its backend; a
/// flow whose claim met the other CPU's writer is pinned by its next packet.
#[test]
fn two_cpus_opening_flows_at_once_never_share_a_way() {
    if aya::util::online_cpus().map_or(0, |c| c.len()) < 2 {
        panic!("this fixture needs two CPUs");
    }
    let lb = world(&[DSR4]);
    let ports = colliding_ports(lb.layout());
    let before = lb.counters();
    const ROUNDS: usize = 20;
    for round in 0..ROUNDS {
        let lb = &lb;
        let ports = &ports;
        std::thread::scope(|scope| {
            for cpu in 0..2usize {
                scope.spawn(move || {
                    lb_tests::bench::cpu::pin_self(cpu).expect("pinning");
                    // CPU 0 takes the even flows, CPU 1 the odd ones: each bucket gets
                    // two flows from each CPU.
                    for &port in ports.iter().skip(cpu).step_by(2) {
                        let run = lb.run_shared(
                            lb_common::PROGRAM_NAME,
                            &to_vip(DSR4, port, TCP_SYN).bytes(),
                        );
                        assert_eq!(run.action, XDP_TX, "round {round}: SYN from {port}");
                    }
                });
            }
        });
    }
    let after = lb.counters();
    assert_eq!(
        counter_deltas(&before, &after)
            .iter()
            .find(|(c, _)| *c == FLOW_EVICTED),
        None,
        "no flow pushed out of a bucket its own flows fill exactly"
    );
    let mut lb = lb;
    // Every flow is pinned now, each bucket taking at most two unconfirmed ones at a time:
    // a SYN's is confirmed by its ACK, an ACK's by a packet more than a second later.
    for _ in 0..4 {
        let (pinned, unpinned): (Vec<u16>, Vec<u16>) = ports
            .iter()
            .partition(|&&p| lb.flow(&client_key(DSR4, p)).is_some());
        if unpinned.is_empty() {
            break;
        }
        for port in pinned.into_iter().chain(unpinned) {
            lb.run(&to_vip(DSR4, port, TCP_ACK).bytes());
        }
        std::thread::sleep(std::time::Duration::from_millis(1_100));
    }
    let mut seen = std::collections::BTreeSet::new();
    for &port in &ports {
        let key = client_key(DSR4, port);
        let (_, bucket) = lb.flow_bucket_of(&key);
        let copies = bucket
            .ways
            .iter()
            .filter(|s| s.word & 1 != 0 && s.key == key)
            .count();
        assert_eq!(copies, 1, "flow from {port} is in its bucket exactly once");
        for s in &bucket.ways {
            assert!(s.word & 1 != 0, "every way of a colliding bucket is live");
            assert!(
                ports.iter().any(|&p| client_key(DSR4, p) == s.key),
                "way holds one of the flows"
            );
            assert_eq!(s.value.backend_id, 1, "pinned to the Maglev choice");
        }
        seen.insert(port);
    }
    assert_eq!(seen.len(), ports.len());
}
