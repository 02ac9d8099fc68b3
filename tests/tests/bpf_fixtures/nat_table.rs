//! The nat reverse table's buckets (`LB_NAT`, a set-associative array, docs/internals/fast-path.md):
//! a bucket full of live entries is never overwritten (allocation moves on to its next
//! candidate port), an expired entry of another flow gives its way to a new one, and a
//! bucket another writer holds counts as taken.

use super::nat::now_nat_seconds;
use super::nat_ports::{check_syn, custom_service, syn_from};
use super::prelude::*;
use lb_common::{
    maps::{NAT_CLOSED_REUSE, NAT_S_ACKED, NAT_S_ESTABLISHED, NAT_S_FIN_BACKEND, NAT_S_FIN_CLIENT},
    table::TABLE_WAYS,
};

const CPORT: u16 = 41_000;

/// The reply key of a flow translated to backend 10.0.1.20:80 from 10.0.0.2:`port`.
fn key(port: u16) -> FlowKey {
    flow_key(ip4(10, 0, 1, 20), 80, ip4(10, 0, 0, 2), port, IPPROTO_TCP)
}

/// A key of some other backend that the test puts in a bucket of its choice (the table
/// never checks that a way's key hashes to its bucket; the program compares keys).
fn stranger(n: u16) -> FlowKey {
    flow_key(
        ip4(10, 0, 9, 9),
        8000 + n,
        ip4(10, 0, 0, 2),
        50_000 + n,
        IPPROTO_TCP,
    )
}

/// An established entry of another flow, seen now: not reclaimable for 15 minutes.
fn live(client_port: u16) -> NatValue {
    NatValue {
        client_port: client_port.to_be(),
        state: NAT_S_ESTABLISHED | NAT_S_ACKED,
        last_seen: now_nat_seconds(),
        ..NatValue::default()
    }
}

/// A service with ports 30000..=30001 on 10.0.0.2, and the port its client's first
/// candidate is (the other one is the second candidate).
fn two_port_world() -> (Lb, IpAddr, u16, u16) {
    let mut lb = world(&[]);
    let vip = custom_service(&mut lb, &[ip4(10, 0, 0, 2)], (30000, 30001), 0, 1);
    let client = flow_key(client4(), CPORT, vip, 80, IPPROTO_TCP);
    let h = lb_common::hash::flow_hash(&client, lb_common::hash::SEED_NAT_PORT);
    let first = 30000 + (h % 2) as u16;
    (lb, vip, first, 30000 + 30001 - first)
}

/// Fills every way of `port`'s bucket with live entries of other flows.
fn fill_bucket(lb: &mut Lb, port: u16, value: impl Fn(u16) -> NatValue) -> u32 {
    let index = lb.layout().nat_bucket(&key(port));
    for way in 0..TABLE_WAYS as usize {
        lb.write_nat_way(index, way, stranger(way as u16), value(way as u16));
    }
    index
}

#[test]
fn a_bucket_full_of_live_entries_is_never_overwritten() {
    let (mut lb, vip, first, other) = two_port_world();
    let index = fill_bucket(&mut lb, first, live);
    let before = lb.nat_bucket_of(&key(first)).1;

    let run = check_syn(
        &mut lb,
        "first candidate's bucket full of live entries: the second candidate",
        (client4(), CPORT),
        vip,
        XDP_TX,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_RETRIED, 1)],
    );
    assert_eq!(out_sport(&syn_from(client4(), CPORT, vip), &run.out), other);
    assert!(lb.nat_entry(&key(other)).is_some());
    assert!(lb.nat_entry(&key(first)).is_none());

    // A second client: its candidates are the same two ports (a two-port range), one
    // taken by a live flow, the other's bucket full of live ones: nothing to take.
    let second = (0..200)
        .map(|p| CPORT + 1 + p)
        .find(|&p| {
            let k = flow_key(client4(), p, vip, 80, IPPROTO_TCP);
            let h = lb_common::hash::flow_hash(&k, lb_common::hash::SEED_NAT_PORT);
            30000 + (h % 2) as u16 == first
        })
        .expect("a client port whose first candidate is the full bucket's");
    check_syn(
        &mut lb,
        "one port taken, the other's bucket full: dropped",
        (client4(), second),
        vip,
        XDP_DROP,
        &[(DROP_NAT_PORTS, 1)],
    );
    let after = lb.nat_bucket_of(&key(first)).1;
    for way in 0..TABLE_WAYS as usize {
        assert_eq!(
            (after.ways[way].key, after.ways[way].value),
            (before.ways[way].key, before.ways[way].value),
            "way {way} of the full bucket (index {index}) is untouched"
        );
    }
}

#[test]
fn an_expired_entry_of_another_flow_gives_its_way_to_a_new_one() {
    let (mut lb, vip, first, _) = two_port_world();
    // Way 2 holds a connection closed long enough ago; the others are live.
    let closed = |n: u16| {
        if n == 2 {
            NatValue {
                client_port: 2u16.to_be(),
                state: NAT_S_ESTABLISHED | NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND,
                last_seen: now_nat_seconds().wrapping_sub(NAT_CLOSED_REUSE + 1),
                ..NatValue::default()
            }
        } else {
            live(n)
        }
    };
    fill_bucket(&mut lb, first, closed);

    let run = check_syn(
        &mut lb,
        "first candidate: its bucket's expired way is reused",
        (client4(), CPORT),
        vip,
        XDP_TX,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    assert_eq!(out_sport(&syn_from(client4(), CPORT, vip), &run.out), first);
    let bucket = lb.nat_bucket_of(&key(first)).1;
    assert_eq!(
        bucket.ways[2].key,
        key(first),
        "the expired way holds the new flow"
    );
    assert_eq!(bucket.ways[2].value.client_port, CPORT.to_be());
    for n in [0u16, 1, 3] {
        let way = &bucket.ways[n as usize];
        assert_eq!(
            (way.key, way.value.client_port, way.word & 1),
            (stranger(n), n.to_be(), 1),
            "live way {n} kept"
        );
    }
}

#[test]
fn a_bucket_another_writer_holds_counts_as_taken() {
    let (mut lb, vip, first, other) = two_port_world();
    let index = lb.layout().nat_bucket(&key(first));
    lb.set_nat_lock(index, true);
    let run = check_syn(
        &mut lb,
        "first candidate's bucket busy: the second candidate",
        (client4(), CPORT),
        vip,
        XDP_TX,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_RETRIED, 1)],
    );
    assert_eq!(out_sport(&syn_from(client4(), CPORT, vip), &run.out), other);
    assert!(
        lb.nat_bucket_of(&key(first))
            .1
            .ways
            .iter()
            .all(|s| s.word & 1 == 0),
        "nothing written into the busy bucket"
    );

    // Released: a reply to the new flow's port is translated, and a SYN of another
    // client whose first candidate is the freed bucket gets it.
    lb.set_nat_lock(index, false);
    let reply = Frame::tcp(
        ip4(10, 0, 1, 20),
        80,
        ip4(10, 0, 0, 2),
        other,
        TCP_SYN | TCP_ACK,
    )
    .macs(CLIENT_MAC, LB_MAC);
    let out = lb.run(&reply.bytes());
    assert_eq!(action_name(out.action), "XDP_TX", "reply translated");
}

/// Two CPUs open flows at once into a port range too small for all of them: claims
/// race for the same candidate keys and buckets. Whatever the interleaving, every
/// forwarded SYN holds exactly one entry of its own, no port is given to two flows,
/// and no key is in the table twice.
#[test]
fn two_cpus_claiming_at_once_never_share_a_port() {
    if aya::util::online_cpus().map_or(0, |c| c.len()) < 2 {
        panic!("this fixture needs two CPUs");
    }
    let mut lb = world(&[]);
    let vip = custom_service(&mut lb, &[ip4(10, 0, 0, 2)], (30000, 30095), 0, 1);
    let lb = &lb;
    const PER_CPU: u16 = 150;
    let forwarded: Vec<(u16, u16, u16)> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..2u8)
            .map(|cpu| {
                scope.spawn(move || {
                    lb_tests::bench::cpu::pin_self(cpu as usize).expect("pinning");
                    let mut out = Vec::new();
                    for i in 0..PER_CPU {
                        let client = ip4(10, 50 + cpu, (i >> 8) as u8, i as u8);
                        let f = syn_from(client, CPORT, vip);
                        let run = lb.run_shared(lb_common::PROGRAM_NAME, &f.bytes());
                        if run.action == XDP_TX {
                            out.push((cpu as u16, i, out_sport(&f, &run.out)));
                        }
                    }
                    out
                })
            })
            .collect();
        runs.into_iter()
            .flat_map(|r| r.join().expect("a CPU's run"))
            .collect()
    });

    let mut ports: Vec<u16> = forwarded.iter().map(|f| f.2).collect();
    ports.sort_unstable();
    let n = ports.len();
    ports.dedup();
    assert_eq!(ports.len(), n, "a port given to two flows: {forwarded:?}");
    assert!(n > 0 && n <= 96, "{n} flows forwarded from 96 ports");
    for &port in &ports {
        let v = lb
            .nat_entry(&key(port))
            .expect("each forwarded flow's entry");
        assert_eq!(v.client_port, CPORT.to_be());
    }
    assert_eq!(lb.nat_count(), n, "one entry per forwarded flow, no other");
}
