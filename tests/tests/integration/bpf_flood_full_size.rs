//! A SYN flood at full size (root; BPF_PROG_TEST_RUN, no namespace needed): tables for
//! 1,048,576 flows, 1,000,000 established flows written by the harness, then 2,000,000
//! SYNs from distinct spoofed sources run through `lb_xdp` one by one; counts how many
//! established flows kept their backend and how long it took (half a GiB of maps, about
//! 15 s here; in the suite): `cargo test -p lb-tests --test integration bpf_flood_full_size:: --
//! --nocapture`.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr},
    time::Instant,
};

use lb_agent::dataplane::{MapSizes, sizing::random_seeds};
use lb_common::{
    IPPROTO_TCP, counters,
    maps::{FLOW_F_SYN_PENDING, FlowKey, FlowValue, ServiceMeta},
    table::{FlowBucket, FlowSlot, TABLE_WAYS, live_word},
};
use lb_tests::{
    bpf::{
        clock::monotonic_ns,
        object::{Lb, XDP_TX, flow_key},
    },
    traffic::packet::{Frame, TCP_SYN},
};

const FLOWS: u32 = 1 << 20;
const ESTABLISHED: usize = 1_000_000;
const FLOOD: u32 = 2_000_000;
const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x1b];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xc1];

fn vip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 100))
}

/// Source `n` of network `net` (10.net.x.y and a port).
fn source(net: u8, n: u32) -> (IpAddr, u16) {
    let addr = Ipv4Addr::new(10, net, (n >> 16) as u8, (n >> 8) as u8);
    (IpAddr::V4(addr), 1024 + (n & 0xff) as u16)
}

#[test]
fn two_million_spoofed_syns_against_a_million_established_flows() {
    let (flow_seed, nat_seed) = random_seeds().expect("getrandom");
    let sizes = MapSizes::default()
        .with_flows(FLOWS)
        .expect("in range")
        .with_seeds(flow_seed, nat_seed);
    let mut lb = Lb::load_sized(sizes);
    lb.set_interface_mac(LB_MAC);
    let meta = ServiceMeta {
        service_id: 1,
        ..ServiceMeta::default()
    };
    lb.add_service(vip(), 80, IPPROTO_TCP, meta);
    let backend = lb_common::maps::Backend {
        addr: lb_tests::bpf::object::addr_words(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 11))),
        port: 80u16.to_be(),
        mac: [0x02, 0, 0, 0, 1, 1],
        flags: lb_common::maps::BACKEND_F_LIVE | lb_common::maps::BACKEND_F_SERVING,
        family: lb_common::FAMILY_V4,
        service_id: 1,
        ..lb_common::maps::Backend::default()
    };
    lb.set_backend(1, backend);
    lb.set_maglev_all(1, 1);
    let layout = lb.layout();

    // 1,000,000 established flows (backend 1, seen now), each in its own bucket's ways.
    let started = Instant::now();
    let mut buckets = vec![FlowBucket::default(); FLOWS as usize];
    let mut used = vec![0u8; FLOWS as usize];
    let mut established = HashSet::with_capacity(ESTABLISHED);
    let now = monotonic_ns();
    let value = FlowValue {
        backend_id: 1,
        last_seen_ns: now,
        ..FlowValue::default()
    };
    let mut n = 0;
    while established.len() < ESTABLISHED {
        let (addr, port) = source(1, n);
        n += 1;
        let key = flow_key(addr, port, vip(), 80, IPPROTO_TCP);
        let h = layout.flow_hash(&key);
        let b = (h & (FLOWS - 1)) as usize;
        if (used[b] as u32) < TABLE_WAYS {
            buckets[b].ways[used[b] as usize] = FlowSlot {
                word: live_word(0, h),
                key,
                value,
            };
            used[b] += 1;
            established.insert(key);
        }
    }
    for (i, b) in buckets.iter().enumerate() {
        if used[i] > 0 {
            lb.set_flow_bucket(i as u32, b);
        }
    }
    drop(buckets);
    println!(
        "{} established flows written in {:.1?} ({FLOWS} buckets of {TABLE_WAYS} ways)",
        established.len(),
        started.elapsed()
    );

    let before = lb.counters();
    let started = Instant::now();
    let mut forwarded = 0u64;
    for n in 0..FLOOD {
        let (addr, port) = source(128 + (n >> 24) as u8, n & 0xff_ffff);
        let f = Frame::tcp(addr, port, vip(), 80, TCP_SYN).macs(CLIENT_MAC, LB_MAC);
        if lb.run(&f.bytes()).action == XDP_TX {
            forwarded += 1;
        }
    }
    let took = started.elapsed();
    let after = lb.counters();

    let (mut kept, mut pending, mut others) = (0usize, 0usize, 0usize);
    let mut seen = HashSet::<FlowKey>::new();
    lb.for_each_flow(|k, v| {
        if established.contains(k) && v.backend_id == 1 {
            kept += 1;
            seen.insert(*k);
        } else if v.flags & FLOW_F_SYN_PENDING != 0 {
            pending += 1;
        } else {
            others += 1;
        }
    });
    let delta = |c: u32| after[c as usize] - before[c as usize];
    println!(
        "{FLOOD} spoofed SYNs in {took:.1?} ({:.0} per s), {forwarded} forwarded: \
         {kept} of {} established flows kept their backend; {pending} flood flows waiting \
         in the table, {others} others; flow_evicted {}, flow_new {}",
        f64::from(FLOOD) / took.as_secs_f64(),
        established.len(),
        delta(counters::FLOW_EVICTED),
        delta(counters::FLOW_NEW),
    );
    assert_eq!(forwarded, u64::from(FLOOD));
    assert_eq!(kept, established.len(), "every established flow kept");
    assert_eq!(delta(counters::FLOW_EVICTED), 0);
}
