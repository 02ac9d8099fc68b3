//! `lb-fill-bench`: lb's flow table against Katran's at the same fill. One lab object
//! (`lb_tests::bpf::lab`), tables sized for `--table N` flows (default 1,048,576: lb's
//! `LB_FLOWS` as `agent.max_flows` sizes it, Katran's `LRU_HASH` with as many entries),
//! both filled with the same `--flows N` live flows (default 1,000,000); then, per round,
//! four cases, each in blocks of 2,000 `BPF_PROG_TEST_RUN` calls alternating with the
//! reflector floor (`lb_reflect`) on the same packets, pinned to CPU 0:
//!
//! - established flow: lb's lookup (`lbr_flow_lookup`), the LRU's (`lbr_lru_hit`), on
//!   live keys spread over the whole fill (their lines are cold, as a million flows'
//!   are);
//! - new flow: lb's lookup and claim (`lbr_flow_open`), the LRU's lookup and insert
//!   (`lbr_lru_new`), on keys never seen; removed again after the round, so every
//!   round starts at the same fill.
//!
//! The cases' order is reversed every round. Printed: per case, the median over the
//! rounds of ns per call and of the ratio to the floor, with their ranges, and the calls
//! that dropped (an established key no longer there: a new flow's claim into a full
//! bucket of lb's table takes its longest-idle way, the LRU evicts; a new flow's claim
//! that took a live flow's way).
//!
//! Run as root: `cargo run --release -p lb-tests --bin lb-fill-bench -- [--flows N]
//! [--table N] [--rounds R] [--calls N]`.
//!
//! `--memory` instead prints the bytes the kernel charges (`memlock`) per flow the
//! tables are sized for: lb's `LB_FLOWS`, `LB_NAT` and `LB_SOURCES` for `--table N`
//! flows, next to Katran's LRU flow table and Cilium's IPv4 conntrack and SNAT maps of
//! `N` entries each, all created on this kernel.

use std::net::IpAddr;

use anyhow::{Context, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData},
    programs::{TestRun, TestRunOptions},
};
use lb_agent::dataplane::{MapSizes, sizing::random_seeds};
use lb_common::{
    IPPROTO_TCP, map_names,
    maps::{DataplaneConfig, FlowKey},
    table::{FlowBucket, SLOT_LIVE, TableLayout, find_way, free_word},
};
use lb_tests::{
    bpf::{
        lab,
        object::{flow_key, map_footprint},
    },
    traffic::packet::{Frame, TCP_ACK, TCP_SYN},
};

const XDP_DROP: u32 = 1;
const XDP_TX: u32 = 3;
/// Calls per block; blocks alternate program / floor.
const BLOCK: usize = 2_000;
const LRU: &str = "LBR_LRU";
/// Cilium's maps for the memory comparison (`lb-ebpf/src/lab/anchor_maps.rs`).
const CILIUM_CT: &str = "LBR_CILIUM_CT4";
const CILIUM_SNAT: &str = "LBR_CILIUM_SNAT4";
const VIP: [u8; 4] = [10, 0, 0, 100];

struct Opts {
    flows: u32,
    table: u32,
    rounds: usize,
    calls: usize,
    memory: bool,
}

/// One case: its program and its packets. A drop (`XDP_DROP`: the lookup of an
/// established flow missed, a new flow's key was there, lb's claim took a live flow's
/// way in a full bucket) is counted and reported, never hidden.
struct Case {
    name: &'static str,
    program: &'static str,
    packets: Vec<Vec<u8>>,
}

/// Per call of one case in one round: program ns, floor ns, drops.
#[derive(Clone, Copy)]
struct Sample {
    program: f64,
    floor: f64,
    drops: usize,
    calls: usize,
}

fn main() -> anyhow::Result<()> {
    let opts = parse_args()?;
    if opts.memory {
        return memory(opts.table);
    }
    lb_tests::bench::cpu::pin_self(0).context("pinning to CPU 0")?;
    let (flow_seed, nat_seed) = random_seeds()?;
    let sizes = MapSizes::default()
        .with_flows(opts.table)
        .context("--table: 1024..=16777216")?
        .with_seeds(flow_seed, nat_seed);
    let layout = sizes.tables();
    let mut loader = EbpfLoader::new();
    sizes.apply(&mut loader);
    loader.map_max_entries(LRU, opts.table);
    let mut obj = loader
        .load(lab::OBJECT)
        .context("loading the lab object (root?)")?;
    for name in [
        lab::REFLECT_PROGRAM,
        "lbr_flow_lookup",
        "lbr_flow_open",
        "lbr_flow_insert",
        "lbr_lru_hit",
        "lbr_lru_new",
    ] {
        lab::xdp(&mut obj, name)?
            .load()
            .with_context(|| format!("verifier rejected {name}"))?;
    }
    // As when attached: parse compares destination MACs with the interface's.
    let mac = frame([10, 9, 0, 1], 1, TCP_ACK)[..6].try_into()?;
    Array::<_, DataplaneConfig>::try_from(obj.map_mut(map_names::CONFIG).context("LB_CONFIG")?)?
        .set(
            0,
            &DataplaneConfig {
                mac,
                ..DataplaneConfig::default()
            },
            0,
        )?;

    let live = |i: u32| [10, 100 + (i >> 16) as u8, (i >> 8) as u8, i as u8];
    let started = std::time::Instant::now();
    let mut evicted = 0;
    for i in 0..opts.flows {
        let syn = frame(live(i), 5000, TCP_SYN);
        match run(&mut obj, "lbr_flow_insert", &syn)? {
            XDP_TX => {}
            // A full bucket: the claim took its longest-idle way.
            XDP_DROP => evicted += 1,
            a => bail!("filling LB_FLOWS: action {a}"),
        }
        if run(&mut obj, "lbr_lru_new", &syn)? != XDP_TX {
            bail!("filling {LRU}: key {i} not inserted");
        }
    }
    println!(
        "filled: {} flows into LB_FLOWS ({} buckets of 4 ways, for {} flows; {evicted} claims \
         evicted) and {LRU} ({} entries) in {:.1} s",
        opts.flows,
        layout.flow_buckets,
        opts.table,
        opts.table,
        started.elapsed().as_secs_f64()
    );

    // Established packets: live keys spread evenly over the fill, those both tables still
    // hold (a claim into a full bucket took another key's way; read from userspace, so
    // no program has touched them since the fill).
    let stride = (opts.flows as usize / opts.calls).max(1);
    let mut established = Vec::with_capacity(opts.calls);
    let mut missing = 0;
    {
        let flows: Array<&MapData, FlowBucket> =
            Array::try_from(obj.map(map_names::FLOWS).context("no LB_FLOWS")?)?;
        let lru: HashMap<&MapData, FlowKey, [u64; 2]> =
            HashMap::try_from(obj.map(LRU).context("no LBR_LRU")?)?;
        for j in 0.. {
            let i = (j * stride) as u32;
            if established.len() == opts.calls || i >= opts.flows {
                break;
            }
            let key = flow_key(
                IpAddr::from(live(i)),
                5000,
                IpAddr::from(VIP),
                80,
                IPPROTO_TCP,
            );
            let bucket = flows.get(&layout.flow_bucket(&key), 0)?;
            if find_way(&bucket, &key).is_none() || lru.get(&key, 0).is_err() {
                missing += 1;
                continue;
            }
            established.push(frame(live(i), 5000, TCP_ACK));
        }
    }
    println!(
        "established: {} live keys ({missing} skipped: evicted from one of the tables)",
        established.len()
    );
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); 4];
    let mut names = [""; 4];
    for round in 0..opts.rounds {
        // New keys: a /16 of their own per round, never live.
        let fresh: Vec<[u8; 4]> = (0..opts.calls)
            .map(|i| [10, 20 + round as u8, (i >> 8) as u8, i as u8])
            .collect();
        let new: Vec<Vec<u8>> = fresh.iter().map(|&s| frame(s, 6000, TCP_SYN)).collect();
        let mut cases = [
            Case {
                name: "established: lb table lookup",
                program: "lbr_flow_lookup",
                packets: established.clone(),
            },
            Case {
                name: "established: LRU_HASH lookup",
                program: "lbr_lru_hit",
                packets: established.clone(),
            },
            Case {
                name: "new flow: lb table lookup + claim",
                program: "lbr_flow_open",
                packets: new.clone(),
            },
            Case {
                name: "new flow: LRU_HASH lookup + insert",
                program: "lbr_lru_new",
                packets: new,
            },
        ]
        .into_iter()
        .enumerate()
        .collect::<Vec<_>>();
        if round % 2 == 1 {
            cases.reverse();
        }
        for (i, case) in &cases {
            names[*i] = case.name;
            samples[*i].push(measure(&mut obj, case)?);
        }
        // Back to the same fill: the new keys out of both tables.
        let keys: Vec<FlowKey> = fresh
            .iter()
            .map(|&s| flow_key(IpAddr::from(s), 6000, IpAddr::from(VIP), 80, IPPROTO_TCP))
            .collect();
        remove_flows(&mut obj, &layout, &keys)?;
        let mut lru: HashMap<&mut MapData, FlowKey, [u64; 2]> =
            HashMap::try_from(obj.map_mut(LRU).context("no LBR_LRU")?)?;
        for k in &keys {
            // A key the LRU already evicted again is fine.
            let _ = lru.remove(k);
        }
    }

    println!(
        "\n{} rounds, {} calls per case and round, {} live flows in tables for {}; \
         ns per call (median, range) and ratio to the reflector floor of the same blocks:\n",
        opts.rounds, opts.calls, opts.flows, opts.table
    );
    println!("| case | ns per call | floor ns | ratio to floor | dropped |");
    println!("|---|---:|---:|---:|---:|");
    for (name, s) in names.iter().zip(&samples) {
        let ns = stats(s.iter().map(|s| s.program));
        let floor = stats(s.iter().map(|s| s.floor));
        let ratio = stats(s.iter().map(|s| s.program / s.floor));
        let drops: usize = s.iter().map(|s| s.drops).sum();
        let calls: usize = s.iter().map(|s| s.calls).sum();
        println!(
            "| {name} | {:.1} ({:.1}–{:.1}) | {:.1} | **{:.2}×** ({:.2}–{:.2}) | {drops} of {calls} |",
            ns.0, ns.1, ns.2, floor.0, ratio.0, ratio.1, ratio.2,
        );
    }
    Ok(())
}

/// Median, min, max.
fn stats(v: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// A 64-byte-payload TCP frame from `src:sport` to the VIP's port 80.
fn frame(src: [u8; 4], sport: u16, flags: u8) -> Vec<u8> {
    Frame::tcp(IpAddr::from(src), sport, IpAddr::from(VIP), 80, flags)
        .payload(&[0u8; 64])
        .bytes()
}

fn run(obj: &mut Ebpf, name: &str, packet: &[u8]) -> anyhow::Result<u32> {
    let res = lab::xdp(obj, name)?.test_run(TestRunOptions {
        data_in: Some(packet),
        ..TestRunOptions::default()
    })?;
    Ok(res.return_value)
}

/// Alternating blocks of the case's program and the floor over the case's packets.
fn measure(obj: &mut Ebpf, case: &Case) -> anyhow::Result<Sample> {
    let (mut program_ns, mut floor_ns, mut drops) = (0u128, 0u128, 0);
    for block in case.packets.chunks(BLOCK) {
        let prog = lab::xdp(obj, case.program)?;
        for pkt in block {
            let res = prog.test_run(TestRunOptions {
                data_in: Some(pkt),
                ..TestRunOptions::default()
            })?;
            match res.return_value {
                XDP_TX => {}
                XDP_DROP => drops += 1,
                a => bail!("{}: action {a}", case.name),
            }
            program_ns += res.duration.as_nanos();
        }
        let floor = lab::xdp(obj, lab::REFLECT_PROGRAM)?;
        for pkt in block {
            floor_ns += lab::floor_ns(floor, pkt)?;
        }
    }
    let calls = case.packets.len() as f64;
    Ok(Sample {
        program: program_ns as f64 / calls,
        floor: floor_ns as f64 / calls,
        drops,
        calls: case.packets.len(),
    })
}

/// Frees the ways of `LB_FLOWS` holding `keys` (next generation, not live), as the
/// program frees a way.
fn remove_flows(obj: &mut Ebpf, layout: &TableLayout, keys: &[FlowKey]) -> anyhow::Result<()> {
    let mut flows: Array<&mut MapData, FlowBucket> =
        Array::try_from(obj.map_mut(map_names::FLOWS).context("no LB_FLOWS")?)?;
    for key in keys {
        let index = layout.flow_bucket(key);
        let mut bucket = flows.get(&index, 0)?;
        if let Some(way) = find_way(&bucket, key) {
            let slot = &mut bucket.ways[way];
            slot.word = free_word(slot.word) & !SLOT_LIVE;
            flows.set(index, &bucket, 0)?;
        }
    }
    Ok(())
}

/// `--memory`: bytes per flow of lb's tables and of Katran's and Cilium's maps, sized
/// for `table` flows (entries) on this kernel.
fn memory(table: u32) -> anyhow::Result<()> {
    let sizes = MapSizes::default()
        .with_flows(table)
        .context("--table: 1024..=16777216")?;
    let mut loader = EbpfLoader::new();
    sizes.apply(&mut loader);
    for name in [LRU, CILIUM_CT, CILIUM_SNAT] {
        loader.map_max_entries(name, table);
    }
    let obj = loader
        .load(lab::OBJECT)
        .context("loading the lab object (root?)")?;
    let per = |name: &str| {
        let (entries, bytes) = map_footprint(&obj, name);
        (bytes as f64 / f64::from(sizes.max_flows()), entries, bytes)
    };
    println!(
        "bytes the kernel charges per flow, tables for {} flows:",
        sizes.max_flows()
    );
    let mut lb_total = 0.0;
    for name in [map_names::FLOWS, map_names::NAT, map_names::SOURCES] {
        let (b, entries, bytes) = per(name);
        lb_total += b;
        println!("  lb {name:<16} {b:>7.1} B   ({entries} entries, {bytes} B)");
    }
    println!("  lb, every table     {lb_total:>7.1} B");
    let (katran, ..) = per(LRU);
    let (ct, ..) = per(CILIUM_CT);
    let (snat, ..) = per(CILIUM_SNAT);
    println!("  Katran LRU_HASH 40/16 B            {katran:>7.1} B per flow");
    println!("  Cilium conntrack HASH 16/56 B      {ct:>7.1} B per connection");
    println!("  Cilium SNAT HASH 16/40 B           {snat:>7.1} B per entry");
    println!(
        "  Cilium nat connection (CT + 2 SNAT) {:>6.1} B",
        ct + 2.0 * snat
    );
    Ok(())
}

fn parse_args() -> anyhow::Result<Opts> {
    const USAGE: &str = "usage: lb-fill-bench [--flows N] [--table N] [--rounds R] [--calls N] \
                         | [--table N] --memory (as root)";
    let mut opts = Opts {
        flows: 1_000_000,
        table: 1 << 20,
        rounds: 5,
        calls: 20_000,
        memory: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || -> anyhow::Result<u64> {
            args.next()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .context(USAGE)
        };
        match a.as_str() {
            "--flows" => opts.flows = value()?.try_into()?,
            "--table" => opts.table = value()?.try_into()?,
            "--rounds" => opts.rounds = value()?.try_into()?,
            "--calls" => opts.calls = value()?.try_into()?,
            "--memory" => opts.memory = true,
            other => bail!("unknown argument {other}; {USAGE}"),
        }
    }
    if opts.flows > opts.table || opts.calls > 65_536 || opts.rounds > 50 {
        bail!("--flows at most --table, --calls at most 65536, --rounds at most 50; {USAGE}");
    }
    Ok(opts)
}
