//! The flow and nat tables sized and seeded at load (`agent.max_flows`, the install's
//! secret seeds): the program puts each flow in the bucket the loaded layout names, in
//! maps of the loaded size, the kernel charges what `MapSizes::table_memory` says, and a
//! copy into a table of another size (a restart) keeps what fits.

use lb_agent::dataplane::MapSizes;
use lb_common::{
    map_names,
    table::{PENDING_WAYS_MAX, TableLayout},
};

use super::prelude::*;

/// Tables for 1,024 flows with these seeds, every service configured.
fn small(flow_seed: u32, nat_seed: u32) -> Lb {
    let sizes = MapSizes::default()
        .with_flows(1024)
        .expect("in range")
        .with_seeds(flow_seed, nat_seed);
    world_in(Lb::load_sized(sizes), &[DSR4, NAT4])
}

/// Client `i` of a flood of distinct sources (10.1.x.y, port 1024 + i).
fn client(i: u32) -> (IpAddr, u16) {
    (
        ip4(10, 1, (i / 250) as u8, (i % 250) as u8 + 1),
        1024 + i as u16,
    )
}

/// `n` clients whose SYNs to both services put at most `PENDING_WAYS_MAX` flows in any
/// `LB_FLOWS` bucket under `layout` (more would wait for their handshake in one bucket,
/// and the admission share would refuse them: `flood.rs`).
fn spread_clients(layout: TableLayout, n: usize) -> Vec<(IpAddr, u16)> {
    let (dsr, nat) = (svc(DSR4), svc(NAT4));
    let mut per = std::collections::HashMap::<u32, u32>::new();
    let mut out = Vec::new();
    for i in 0.. {
        let (addr, port) = client(i);
        let buckets = [&dsr, &nat]
            .map(|s| layout.flow_bucket(&flow_key(addr, port, s.vip, s.port, IPPROTO_TCP)));
        let room = |b: u32, extra: u32| per.get(&b).copied().unwrap_or(0) + extra;
        let same = u32::from(buckets[0] == buckets[1]);
        if buckets
            .iter()
            .all(|&b| room(b, 1 + same) <= PENDING_WAYS_MAX)
        {
            for b in buckets {
                *per.entry(b).or_default() += 1;
            }
            out.push((addr, port));
            if out.len() == n {
                break;
            }
        }
    }
    out
}

#[test]
fn flows_land_in_the_buckets_of_the_loaded_size_and_seed() {
    const FLOWS: u32 = 300;
    let seeds = [(0x0123_4567, 0x89ab_cdef), (0x5eed_0001, 0x5eed_0002)];
    let mut layouts = Vec::new();
    for (flow_seed, nat_seed) in seeds {
        let mut lb = small(flow_seed, nat_seed);
        assert_eq!(
            lb.map_footprint(map_names::FLOWS).0,
            1024,
            "LB_FLOWS buckets"
        );
        assert_eq!(lb.map_footprint(map_names::NAT).0, 512, "LB_NAT buckets");
        assert_eq!(
            lb.map_footprint(map_names::SOURCES).0,
            256,
            "LB_SOURCES entries"
        );
        let (dsr, nat) = (svc(DSR4), svc(NAT4));
        let clients = spread_clients(lb.layout(), FLOWS as usize);
        for &(addr, port) in &clients {
            for s in [&dsr, &nat] {
                let f = Frame::tcp(addr, port, s.vip, s.port, TCP_SYN).macs(CLIENT_MAC, LB_MAC);
                let run = lb.run(&f.bytes());
                assert_eq!(run.action, XDP_TX, "flow {addr}:{port} to {}", s.vip);
            }
        }
        assert_eq!(
            lb.counters()[FLOW_EVICTED as usize],
            0,
            "no bucket overflowed"
        );
        assert_eq!(lb.flow_count(), 2 * FLOWS as usize, "every flow pinned");
        assert_eq!(
            lb.nat_count(),
            FLOWS as usize,
            "every nat flow's reverse entry"
        );
        for &(addr, port) in &clients {
            let key = flow_key(addr, port, dsr.vip, dsr.port, IPPROTO_TCP);
            let flow = lb.flow(&key).unwrap_or_else(|| {
                panic!("flow {addr}:{port} is not in the bucket the layout names")
            });
            assert_eq!(flow.backend_id, dsr.backend);
            let nat_key = flow_key(addr, port, nat.vip, nat.port, IPPROTO_TCP);
            let nat_flow = lb.flow(&nat_key).expect("the nat flow");
            let reverse = lb.nat_entry(&reply_key(NAT4, u16::from_be(nat_flow.nat_port)));
            assert!(
                reverse.is_some_and(|r| r.client_port == port.to_be()),
                "nat flow {addr}:{port}'s reverse entry is in the bucket the layout names"
            );
        }
        layouts.push(lb.layout());
    }
    let moved = (0..FLOWS)
        .map(client)
        .filter(|&(addr, port)| {
            let key = flow_key(addr, port, svc(DSR4).vip, 80, IPPROTO_TCP);
            layouts[0].flow_bucket(&key) != layouts[1].flow_bucket(&key)
        })
        .count() as u32;
    // Another seed puts a flow in another of 1,024 buckets but 1 time in 1,024.
    assert!(
        moved > FLOWS * 9 / 10,
        "the seed decides the bucket: {moved} of {FLOWS} flows moved"
    );
}

#[test]
fn the_kernel_charges_what_the_sizes_say() {
    for flows in [1024, 1 << 16] {
        let sizes = MapSizes::default()
            .with_flows(flows)
            .expect("in range")
            .with_seeds(7, 11);
        let lb = Lb::load_sized(sizes);
        let want = sizes.table_memory();
        let (_, flows_mem) = lb.map_footprint(map_names::FLOWS);
        let (_, nat_mem) = lb.map_footprint(map_names::NAT);
        let (_, sources_mem) = lb.map_footprint(map_names::SOURCES);
        println!(
            "max_flows {flows}: LB_FLOWS {flows_mem} B (computed {}), LB_NAT {nat_mem} B \
             (computed {}), LB_SOURCES {sources_mem} B (computed {}); {} B per flow",
            want.flows,
            want.nat,
            want.sources,
            (flows_mem + nat_mem + sources_mem) / u64::from(flows)
        );
        // Arrays: the values and one page of header at most.
        for (name, got, computed) in [
            ("LB_FLOWS", flows_mem, want.flows),
            ("LB_NAT", nat_mem, want.nat),
        ] {
            assert!(
                got >= computed && got <= computed + 8192,
                "{name}: the kernel charges {got} B, the sizes say {computed} B"
            );
        }
        // An LRU hash: its elements and a per-CPU list header.
        assert!(
            sources_mem >= want.sources && sources_mem <= want.sources + 16384,
            "LB_SOURCES: the kernel charges {sources_mem} B, the sizes say {} B",
            want.sources
        );
    }
}

/// In cluster mode the peer tables have half as many buckets as `max_flows` (two ways
/// per connection they hold) and the kernel charges them what `MapSizes` says
/// (`peer_connection_bytes` per flow); without it one bucket each.
#[test]
fn the_peer_tables_are_sized_by_max_flows_in_cluster_mode_only() {
    let flows = 1 << 14;
    let sizes = MapSizes::default()
        .with_flows(flows)
        .expect("in range")
        .with_seeds(7, 11);
    let plain = Lb::load_sized(sizes);
    let cluster = Lb::load_sized(sizes.with_cluster());
    for name in [map_names::PEER_FLOWS, map_names::PEER_NAT] {
        assert_eq!(
            plain.map_footprint(name).0,
            1,
            "{name} without cluster mode"
        );
        assert_eq!(
            cluster.map_footprint(name).0,
            flows / 2,
            "{name} in cluster mode"
        );
    }
    assert_eq!(sizes.table_memory().peers, 0);
    let want = sizes.with_cluster().table_memory().peers;
    assert_eq!(
        want,
        u64::from(flows) * MapSizes::peer_connection_bytes(),
        "per connection"
    );
    let got = cluster.map_footprint(map_names::PEER_FLOWS).1
        + cluster.map_footprint(map_names::PEER_NAT).1;
    println!(
        "max_flows {flows}: the peer tables take {got} B (computed {want}), {} B per connection",
        got / u64::from(flows)
    );
    // The kernel adds a page or two of headers (an mmapable array's values start on a page).
    assert!(
        got >= want && got <= want + 64 * 1024,
        "the kernel charges {got} B, the sizes say {want} B"
    );
}

/// A restart to a smaller `max_flows` copies the live flows into the new table: each
/// into its bucket of the new size under the same seed, the most recently seen four
/// where more land in one bucket, and the program finds every copied flow.
#[test]
fn a_copy_into_a_smaller_table_keeps_the_most_recent_flows_of_each_bucket() {
    const FLOWS: u32 = 6000;
    let (flow_seed, nat_seed) = (0x0bad_5eed, 0x0dd_5eed);
    let sized = |flows| {
        MapSizes::default()
            .with_flows(flows)
            .expect("in range")
            .with_seeds(flow_seed, nat_seed)
    };
    let mut old = world_in(Lb::load_sized(sized(8192)), &[DSR4]);
    let now = lb_tests::bpf::clock::monotonic_ns();
    let dsr = svc(DSR4);
    let key = |i: u32| {
        let (addr, port) = client(i);
        flow_key(addr, port, dsr.vip, dsr.port, IPPROTO_TCP)
    };
    // Flows that fit the old table's buckets; flow i last seen i ms ago: the lower i,
    // the more recent.
    let mut old_per = std::collections::HashMap::<u32, u32>::new();
    let chosen: Vec<u32> = (0..)
        .filter(|&i| {
            let n = old_per
                .entry(old.layout().flow_bucket(&key(i)))
                .or_default();
            *n += 1;
            *n <= 4
        })
        .take(FLOWS as usize)
        .collect();
    for &i in &chosen {
        let value = lb_common::maps::FlowValue {
            backend_id: dsr.backend,
            last_seen_ns: now - u64::from(i) * 1_000_000,
            ..Default::default()
        };
        old.set_flow(&key(i), value);
    }
    assert_eq!(old.flow_count(), FLOWS as usize);

    let mut new = world_in(Lb::load_sized(sized(1024)), &[DSR4]);
    let copied = new.copy_flows_from(&old);
    let layout = new.layout();
    let mut per = std::collections::HashMap::<u32, Vec<u32>>::new();
    for &i in &chosen {
        per.entry(layout.flow_bucket(&key(i))).or_default().push(i);
    }
    let want_kept: usize = per.values().map(|v| v.len().min(4)).sum();
    println!(
        "{FLOWS} flows from 8,192 buckets into 1,024: {} kept, {} dropped",
        copied.kept, copied.dropped
    );
    assert_eq!(copied.kept as usize, want_kept);
    assert_eq!(copied.dropped as usize, FLOWS as usize - want_kept);
    assert!(!copied.incompatible);
    assert_eq!(new.flow_count(), want_kept);
    for flows in per.values() {
        // `flows` is in order of i: the first four are the most recent.
        for (rank, &i) in flows.iter().enumerate() {
            assert_eq!(
                new.flow(&key(i)).is_some(),
                rank < 4,
                "flow {i}, the {rank}th most recent of its new bucket"
            );
        }
    }
    // The program finds a copied flow (its packet is a hit, not a new flow).
    let (addr, port) = client(per.values().next().expect("a bucket")[0]);
    let before = new.counters();
    let ack = Frame::tcp(addr, port, dsr.vip, dsr.port, TCP_ACK).macs(CLIENT_MAC, LB_MAC);
    assert_eq!(new.run(&ack.bytes()).action, XDP_TX);
    let after = new.counters();
    assert_eq!(after[FLOW_HIT as usize] - before[FLOW_HIT as usize], 1);
    assert_eq!(after[FLOW_NEW as usize], before[FLOW_NEW as usize]);
}
