//! A SYN flood from spoofed sources against a flow table of established flows (tables
//! for 1,024 flows, so that a flood five times the table runs in a second): flows that
//! wait for their handshake take at most `PENDING_WAYS_MAX` ways of a bucket and never
//! an established flow's, so every established flow keeps its backend; a real client's
//! handshake after the flood is still pinned (its ACK takes a waiting flow's way); in
//! nat, a SYN whose bucket is full of established flows is refused, its port released,
//! unless one of them has been silent for `NAT_SYN_EVICTS_IDLE_NS`.

use lb_agent::dataplane::{MapSizes, sizing::random_seeds};
use lb_common::{
    maps::FlowValue,
    table::{PENDING_WAYS_MAX, SLOT_LIVE, TABLE_WAYS},
};
use lb_tests::bpf::clock::monotonic_ns as now_ns;

/// lb-ebpf's `flow::NAT_SYN_EVICTS_IDLE_NS`.
const NAT_SYN_EVICTS_IDLE_NS: u64 = 10_000_000_000;

use super::prelude::*;

const BUCKETS: u32 = 1024;

/// Tables for 1,024 flows with fresh seeds, `tables` services with a Maglev table.
fn small(tables: &[u32]) -> Lb {
    let (flow, nat) = random_seeds().expect("getrandom");
    let sizes = MapSizes::default()
        .with_flows(BUCKETS)
        .expect("in range")
        .with_seeds(flow, nat);
    world_in(Lb::load_sized(sizes), tables)
}

/// A 5-tuple to `id`'s VIP from source number `n` of `net` (10.net.x.y, a port per n).
fn source(id: u32, net: u8, n: u32) -> FlowKey {
    let s = svc(id);
    let addr = ip4(10, net, (n >> 16) as u8, (n >> 8) as u8);
    flow_key(addr, 1024 + (n & 0xff) as u16, s.vip, s.port, IPPROTO_TCP)
}

/// Writes `per_bucket` established flows of `id` (to its backend, seen just now) into
/// every bucket, as the harness's own writes; returns their keys.
fn establish(lb: &mut Lb, id: u32, per_bucket: usize) -> Vec<FlowKey> {
    let layout = lb.layout();
    let mut filled = vec![0usize; BUCKETS as usize];
    let mut keys = Vec::new();
    let value = FlowValue {
        backend_id: svc(id).backend,
        last_seen_ns: now_ns(),
        ..FlowValue::default()
    };
    let mut n = 0;
    while keys.len() < per_bucket * BUCKETS as usize {
        let key = source(id, 2, n);
        n += 1;
        let b = layout.flow_bucket(&key);
        if filled[b as usize] < per_bucket {
            lb.write_flow_way(b, filled[b as usize], key, value);
            filled[b as usize] += 1;
            keys.push(key);
        }
    }
    keys
}

/// A SYN from `key`'s source.
fn syn_of(key: &FlowKey, id: u32) -> Vec<u8> {
    let s = svc(id);
    let addr = std::net::Ipv4Addr::from(key.src[0].to_ne_bytes());
    Frame::tcp(
        IpAddr::V4(addr),
        u16::from_be(key.sport),
        s.vip,
        s.port,
        TCP_SYN,
    )
    .macs(CLIENT_MAC, LB_MAC)
    .bytes()
}

/// Established flows of `keys` still pinned to `backend`.
fn kept(lb: &Lb, keys: &[FlowKey], backend: u32) -> usize {
    keys.iter()
        .filter(|k| lb.flow(k).is_some_and(|f| f.backend_id == backend))
        .count()
}

/// The most ways of one bucket that hold a flow waiting for its handshake.
fn most_pending_ways(lb: &Lb, keys: &[FlowKey]) -> usize {
    keys.iter()
        .map(|k| {
            let (_, bucket) = lb.flow_bucket_of(k);
            bucket
                .ways
                .iter()
                .filter(|w| w.word & SLOT_LIVE != 0 && w.value.flags & FLOW_F_SYN_PENDING != 0)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn a_syn_flood_never_evicts_established_flows_and_real_clients_still_get_in() {
    const FLOOD: u32 = 5 * TABLE_WAYS * BUCKETS;
    let mut lb = small(&[DSR4]);
    let backend = svc(DSR4).backend;
    // Half of every bucket established (2,048 flows).
    let established = establish(&mut lb, DSR4, 2);
    let before = lb.counters();
    for n in 0..FLOOD {
        let run = lb.run(&syn_of(&source(DSR4, 128, n), DSR4));
        assert_eq!(run.action, XDP_TX, "a flood SYN is forwarded (dsr)");
    }
    let after = lb.counters();
    let kept_flows = kept(&lb, &established, backend);
    println!(
        "{FLOOD} spoofed SYNs into {} established flows ({BUCKETS} buckets of {TABLE_WAYS}): \
         {kept_flows} kept their backend; the most waiting flows in a bucket: {}",
        established.len(),
        most_pending_ways(&lb, &established)
    );
    assert_eq!(kept_flows, established.len(), "every established flow kept");
    assert_eq!(after[FLOW_EVICTED as usize], before[FLOW_EVICTED as usize]);
    assert_eq!(
        most_pending_ways(&lb, &established),
        PENDING_WAYS_MAX as usize,
        "the flood fills its share of each bucket and no more"
    );

    // Real clients after the flood: SYN, then the handshake's ACK. At most two to a
    // bucket: the two ways the flood held (a third new flow in a bucket of four
    // established ones would take the way of the one idle longest, as without a flood).
    let layout = lb.layout();
    let mut per = vec![0u32; BUCKETS as usize];
    let clients: Vec<FlowKey> = (0..)
        .map(|n| source(DSR4, 3, n))
        .filter(|k| {
            let b = &mut per[layout.flow_bucket(k) as usize];
            *b += 1;
            *b <= PENDING_WAYS_MAX
        })
        .take(200)
        .collect();
    for key in &clients {
        assert_eq!(lb.run(&syn_of(key, DSR4)).action, XDP_TX);
        let addr = std::net::Ipv4Addr::from(key.src[0].to_ne_bytes());
        let ack = Frame::tcp(
            IpAddr::V4(addr),
            u16::from_be(key.sport),
            svc(DSR4).vip,
            80,
            TCP_ACK,
        )
        .macs(CLIENT_MAC, LB_MAC);
        assert_eq!(lb.run(&ack.bytes()).action, XDP_TX);
    }
    let pinned = clients
        .iter()
        .filter(|k| {
            lb.flow(k)
                .is_some_and(|f| f.backend_id == backend && f.flags & FLOW_F_SYN_PENDING == 0)
        })
        .count();
    assert_eq!(
        pinned,
        clients.len(),
        "every real client's flow is established"
    );
    assert_eq!(kept(&lb, &established, backend), established.len());
    assert_eq!(
        lb.counters()[FLOW_EVICTED as usize],
        before[FLOW_EVICTED as usize],
        "their ACKs took waiting flows' ways, not established ones"
    );
}

#[test]
fn a_full_table_of_established_flows_takes_no_syn_and_nat_refuses_it() {
    let mut lb = small(&[DSR4, NAT4]);
    // Every way of every bucket established: 4,096 flows (of both services).
    let established = establish(&mut lb, DSR4, TABLE_WAYS as usize);
    let flows = lb.flow_count();
    let before = lb.counters();
    for n in 0..2 * BUCKETS {
        let run = lb.run(&syn_of(&source(DSR4, 128, n), DSR4));
        assert_eq!(run.action, XDP_TX, "dsr: forwarded unpinned");
    }
    assert_eq!(lb.flow_count(), flows, "no flood flow pinned");
    assert_eq!(
        kept(&lb, &established, svc(DSR4).backend),
        established.len()
    );

    let nat_before = lb.nat_count();
    for n in 0..64 {
        let run = lb.run(&syn_of(&source(NAT4, 129, n), NAT4));
        assert_eq!(run.action, XDP_DROP, "nat: refused");
    }
    let after = lb.counters();
    assert_eq!(
        after[DROP_FLOWS_FULL as usize] - before[DROP_FLOWS_FULL as usize],
        64
    );
    assert_eq!(after[FLOW_EVICTED as usize], before[FLOW_EVICTED as usize]);
    assert_eq!(
        lb.nat_count(),
        nat_before,
        "the refused SYNs' source ports are released"
    );
    assert_eq!(lb.flow_count(), flows);

    // One flow of a nat SYN's bucket silent for longer than a nat SYN must wait: the
    // SYN takes its way (counted as an eviction) and is forwarded.
    let key = source(NAT4, 130, 0);
    let (index, bucket) = lb.flow_bucket_of(&key);
    let quiet = FlowValue {
        last_seen_ns: now_ns() - NAT_SYN_EVICTS_IDLE_NS - 1_000_000_000,
        ..bucket.ways[3].value
    };
    lb.write_flow_way(index, 3, bucket.ways[3].key, quiet);
    let before = lb.counters();
    assert_eq!(lb.run(&syn_of(&key, NAT4)).action, XDP_TX, "nat: forwarded");
    let after = lb.counters();
    assert_eq!(
        after[FLOW_EVICTED as usize] - before[FLOW_EVICTED as usize],
        1
    );
    let (_, bucket) = lb.flow_bucket_of(&key);
    assert_eq!(
        bucket.ways[3].key, key,
        "the silent flow's way holds the SYN's flow"
    );
}
