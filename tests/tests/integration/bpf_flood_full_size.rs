//! Floods of every kind at full size (root; BPF_PROG_TEST_RUN, no namespace needed), in
//! dsr and in nat: tables for 1,048,576 flows, 1,000,000 established flows written by
//! the harness, then 2,000,000 SYNs, 2,000,000 ACKs and 2,000,000 UDP datagrams, each
//! flood from its own distinct spoofed sources, run through `lb_xdp` one by one; counts
//! how many established flows kept their backend after each flood and how long it took
//! (half a GiB of maps per mode, the two modes side by side; in the suite):
//! `cargo test -p lb-tests --test integration bpf_flood_full_size:: -- --nocapture`.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr},
    time::Instant,
};

use lb_agent::dataplane::{MapSizes, sizing::random_seeds};
use lb_common::{
    FAMILY_V4, IPPROTO_TCP, IPPROTO_UDP, counters,
    maps::{
        BACKEND_F_LIVE, BACKEND_F_SERVING, Backend, FLOW_F_UNCONFIRMED, FlowKey, FlowValue,
        SERVICE_F_NAT, ServiceMeta,
    },
    table::{FlowBucket, FlowSlot, TABLE_WAYS, live_word},
};
use lb_tests::{
    bpf::{
        clock::monotonic_ns,
        object::{Lb, XDP_DROP, XDP_TX, addr_words, flow_key},
    },
    traffic::{
        frame_stream::{FRAME_LEN, FrameTemplate},
        packet::{TCP_ACK, TCP_SYN},
    },
};

const FLOWS: u32 = 1 << 20;
const ESTABLISHED: usize = 1_000_000;
const FLOOD: u32 = 2_000_000;
const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x1b];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xc1];
/// The TCP service (established flows, SYN and ACK floods) and the UDP one.
const TCP_PORT: u16 = 80;
const UDP_PORT: u16 = 53;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);

fn vip() -> IpAddr {
    IpAddr::V4(VIP)
}

/// Source `n` of network `net` (10.net.x.y and a port).
fn source(net: u8, n: u32) -> (Ipv4Addr, u16) {
    let addr = Ipv4Addr::new(10, net, (n >> 16) as u8, (n >> 8) as u8);
    (addr, 1024 + (n & 0xff) as u16)
}

/// A flood: what each spoofed packet is, and the network its sources come from.
#[derive(Clone, Copy, Debug)]
enum Flood {
    Syn,
    Ack,
    Udp,
}

impl Flood {
    fn net(self) -> u8 {
        match self {
            Flood::Syn => 128,
            Flood::Ack => 129,
            Flood::Udp => 130,
        }
    }

    /// The flood's frame, whose source each packet rewrites.
    fn template(self) -> FrameTemplate {
        match self {
            Flood::Syn => FrameTemplate::tcp(CLIENT_MAC, LB_MAC, VIP, TCP_PORT, TCP_SYN),
            Flood::Ack => FrameTemplate::tcp(CLIENT_MAC, LB_MAC, VIP, TCP_PORT, TCP_ACK),
            Flood::Udp => FrameTemplate::udp(CLIENT_MAC, LB_MAC, VIP, UDP_PORT),
        }
    }
}

/// Tables for [`FLOWS`] flows with fresh seeds, a TCP and a UDP service (`nat`: nat,
/// else dsr) of one backend each.
fn load(nat: bool) -> Lb {
    let (flow_seed, nat_seed) = random_seeds().expect("getrandom");
    let sizes = MapSizes::default()
        .with_flows(FLOWS)
        .expect("in range")
        .with_seeds(flow_seed, nat_seed);
    let mut lb = Lb::load_sized(sizes);
    lb.set_interface_mac(LB_MAC);
    for (id, port, proto) in [(1, TCP_PORT, IPPROTO_TCP), (2, UDP_PORT, IPPROTO_UDP)] {
        let meta = ServiceMeta {
            service_id: id,
            flags: if nat { SERVICE_F_NAT } else { 0 },
            snat_addrs: [
                addr_words(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 200))),
                [0; 4],
                [0; 4],
                [0; 4],
            ],
            snat_count: 1,
            nat_port_min: 1024,
            nat_port_max: 65_535,
            ..ServiceMeta::default()
        };
        lb.add_service(vip(), port, proto, meta);
        let backend = Backend {
            addr: addr_words(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 10 + id as u8))),
            port: port.to_be(),
            mac: [0x02, 0, 0, 0, 1, id as u8],
            flags: BACKEND_F_LIVE | BACKEND_F_SERVING,
            family: FAMILY_V4,
            service_id: id,
            ..Backend::default()
        };
        lb.set_backend(id, backend);
        lb.set_maglev_all(id, id);
    }
    lb
}

/// How far ahead of the clock nat's established flows are stamped: past the end of the
/// floods (a few minutes at most here).
const NAT_TALKING_NS: u64 = 3_600_000_000_000;

/// Writes [`ESTABLISHED`] established TCP flows (backend 1), each in its own bucket's
/// ways; returns their keys. dsr: seen now. nat: with a source port, and stamped
/// [`NAT_TALKING_NS`] ahead (the program takes a stamp ahead of its clock as just seen),
/// as flows that talk throughout the floods: a nat SYN may take the way of a flow
/// silent for 10 s (`NAT_SYN_EVICTS_IDLE_NS`, tested in `bpf_fixtures/flood.rs`), and
/// the floods run for longer than that here.
fn establish(lb: &mut Lb, nat: bool) -> HashSet<FlowKey> {
    let layout = lb.layout();
    let mut buckets = vec![FlowBucket::default(); FLOWS as usize];
    let mut used = vec![0u8; FLOWS as usize];
    let mut established = HashSet::with_capacity(ESTABLISHED);
    let mut value = FlowValue {
        backend_id: 1,
        last_seen_ns: monotonic_ns() + if nat { NAT_TALKING_NS } else { 0 },
        ..FlowValue::default()
    };
    let mut n = 0;
    while established.len() < ESTABLISHED {
        let (addr, port) = source(1, n);
        n += 1;
        let key = flow_key(IpAddr::V4(addr), port, vip(), TCP_PORT, IPPROTO_TCP);
        let h = layout.flow_hash(&key);
        let b = (h & (FLOWS - 1)) as usize;
        if (used[b] as u32) < TABLE_WAYS {
            if nat {
                value.nat_port = (1024 + (n % 64_000) as u16).to_be();
            }
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
    established
}

/// What the table holds: established flows still on backend 1, unconfirmed flows, others.
fn census(lb: &Lb, established: &HashSet<FlowKey>) -> (usize, usize, usize) {
    let (mut kept, mut unconfirmed, mut others) = (0, 0, 0);
    lb.for_each_flow(|k, v| {
        if established.contains(k) && v.backend_id == 1 {
            kept += 1;
        } else if v.flags & FLOW_F_UNCONFIRMED != 0 {
            unconfirmed += 1;
        } else {
            others += 1;
        }
    });
    (kept, unconfirmed, others)
}

/// The three floods one after the other against a million established flows; after
/// each, every established flow must still be on its backend and none evicted.
fn floods_keep_every_established_flow(nat: bool) {
    let mode = if nat { "nat" } else { "dsr" };
    let mut lb = load(nat);
    let started = Instant::now();
    let established = establish(&mut lb, nat);
    println!(
        "{mode}: {} established flows written in {:.1?} ({FLOWS} buckets of {TABLE_WAYS} ways)",
        established.len(),
        started.elapsed()
    );
    for flood in [Flood::Syn, Flood::Ack, Flood::Udp] {
        let before = lb.counters();
        let started = Instant::now();
        let (mut forwarded, mut dropped) = (0u64, 0u64);
        let template = flood.template();
        let mut frame = [0u8; FRAME_LEN];
        for n in 0..FLOOD {
            let (addr, port) = source(flood.net(), n);
            template.write(addr, port, &mut frame);
            match lb.run(&frame).action {
                XDP_TX => forwarded += 1,
                XDP_DROP => dropped += 1,
                _ => {}
            }
        }
        let took = started.elapsed();
        let after = lb.counters();
        let (kept, unconfirmed, others) = census(&lb, &established);
        let delta = |c: u32| after[c as usize] - before[c as usize];
        println!(
            "{mode}: {FLOOD} spoofed {flood:?}s in {took:.1?} ({:.0} per s), {forwarded} \
             forwarded, {dropped} dropped: {kept} of {} established flows kept their \
             backend; {unconfirmed} unconfirmed flows in the table, {others} others; \
             flow_evicted {}, flow_new {}, flow_unpinned {}, drop_no_flow {}, \
             drop_flows_full {}, drop_nat_ports {}, drop_source_limit {}",
            f64::from(FLOOD) / took.as_secs_f64(),
            established.len(),
            delta(counters::FLOW_EVICTED),
            delta(counters::FLOW_NEW),
            delta(counters::FLOW_UNPINNED),
            delta(counters::DROP_NO_FLOW),
            delta(counters::DROP_FLOWS_FULL),
            delta(counters::DROP_NAT_PORTS),
            delta(counters::DROP_SOURCE_LIMIT),
        );
        assert_eq!(delta(counters::FLOW_EVICTED), 0, "{mode}, {flood:?}");
        assert_eq!(
            kept,
            established.len(),
            "{mode}, {flood:?}: every established flow kept"
        );
        match (nat, flood) {
            // dsr forwards every packet by its Maglev choice, pinned or not.
            (false, _) => assert_eq!(forwarded, u64::from(FLOOD), "{flood:?}"),
            // A nat ACK for no flow can make no connection: dropped, nothing allocated.
            (true, Flood::Ack) => {
                assert_eq!(delta(counters::DROP_NO_FLOW), u64::from(FLOOD));
                assert_eq!(delta(counters::FLOW_NEW), 0);
            }
            (true, _) => {}
        }
    }
}

#[test]
fn dsr_spoofed_syns_acks_and_datagrams_against_a_million_established_flows() {
    floods_keep_every_established_flow(false);
}

#[test]
fn nat_spoofed_syns_acks_and_datagrams_against_a_million_established_flows() {
    floods_keep_every_established_flow(true);
}
