//! `lb-components`: what each cost component of the XDP balancer costs on this kernel,
//! measured with the reduced programs of `lb-ebpf/src/lab/reduced.rs` (the lab object,
//! `lb_tests::bpf::lab`) next to the reflector floor, on the same packets, in the same run
//! (docs/internals/benchmark-log.md §1, "Where the rest goes").
//!
//! Method as `lb-bench`: BPF_PROG_TEST_RUN, `repeat = 1`, blocks of 2,000 calls alternating
//! with `lb_reflect`, pinned to CPU 0; `--rounds N` rounds (default 7), each case's median
//! and range of ns above the floor printed. `--full-table` fills `LB_FLOWS` and `LB_NAT`
//! (262,144 live keys each) first, so misses walk fuller buckets.
//! `--xlated FILE [--program NAME]` instead writes `bpftool prog dump xlated` of the
//! loaded `lb_xdp` (or of the reduced program NAME).
//! `--only P1,P2` measures only the cases whose program name starts with one of them.
//!
//! The VIP-hit rows send an established packet to a dsr service published into
//! `LB_VIP_INDEX` (`publish_hit_service`) whose flow is pinned to backend 1: the
//! established path's parts grown step by step to `lb_xdp` itself on the same packet
//! (docs/internals/benchmark-log.md §1).
//!
//! The cold-line rows (`lbr_line*`) read random cache lines of two `ARRAY`s set to
//! 150 MiB each at load (`map_max_entries`), each case reaching the first N lines of
//! them (`LBR_LINES_N`): the price of a new flow's cold bucket by table size. Before
//! every block of such a case its lines are read once from userspace (through `mmap`;
//! the machine's other processes evict them between blocks), so that the
//! caches hold what a table of that size keeps warm in steady state rather than
//! nothing (a table nobody touched since the kernel zeroed it).

use std::{
    net::IpAddr,
    os::fd::{AsFd, AsRawFd},
};

use anyhow::{Context, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, RingBuf},
    programs::{TestRun, TestRunOptions, Xdp},
};
use lb_common::{
    FLOW_TABLE_SIZE,
    hash::vip_hash,
    map_names,
    maps::{
        BACKEND_F_LIVE, BACKEND_F_SERVING, Backend, DataplaneConfig, FlowKey, ServiceMeta,
        VIP_SLOT_SERVICE, VipKey, VipSlot,
    },
    table::{Bucket, FlowBucket, NatBucket, SLOT_LIVE, TableLayout},
    vip_bucket_index,
};
use lb_tests::{
    bpf::lab,
    traffic::packet::{Frame, TCP_ACK, TCP_SYN},
};

/// Calls per block; blocks alternate program / floor.
const BLOCK: usize = 2_000;
/// Blocks per case, round and side.
const BLOCKS: usize = 10;
/// Distinct keys per round for the miss and insert cases.
const KEYS: usize = BLOCK * BLOCKS;

const XDP_DROP: u32 = 1;
/// Keys put into `LB_NAT` for `--full-table`: the 262,144 entries the LRU map held.
const NAT_FILL: u32 = 262_144;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

/// Bytes of a cold-line array line (`lb_ebpf::reduced::Line`).
const LINE: u32 = 64;
/// Lines of each cold-line array as loaded: 150 MiB.
const LINES_MAX: u32 = 150 * (1 << 20) / LINE;
/// `LB_FLOWS`' bytes (262,144 buckets of 288 bytes: 75.5 MB) in lines.
const FLOWS_LINES: u32 = lb_common::table::FLOW_BUCKETS * 288 / LINE;
/// `LB_NAT`'s bytes (131,072 buckets of 416 bytes: 54.5 MB) in lines.
const NAT_LINES: u32 = lb_common::table::NAT_BUCKETS * 416 / LINE;
const MIB: u32 = (1 << 20) / LINE;

/// One measured case: a program, its packets, the action every call must return.
struct Case {
    name: &'static str,
    program: &'static str,
    packets: Vec<Vec<u8>>,
    expect: u32,
    /// Lines of the two cold-line arrays the case reaches, and the log2 of the stride
    /// between `LBR_LINES_A`'s lines (`LBR_LINES_N`).
    lines: [u32; 3],
}

/// Per case, per round: (program ns, floor ns).
type Samples = Vec<Vec<(f64, f64)>>;

fn main() -> anyhow::Result<()> {
    let mut rounds = 7usize;
    let mut full_table = false;
    let mut xlated = None;
    // `--only PREFIX`: only the cases whose program name starts with PREFIX.
    let mut only: Option<String> = None;
    let mut xlated_program = lb_common::PROGRAM_NAME.to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .context("--rounds needs a positive number")?
            }
            "--full-table" => full_table = true,
            "--only" => only = Some(args.next().context("--only needs a program prefix")?),
            "--xlated" => xlated = Some(args.next().context("--xlated needs a file")?),
            "--program" => {
                xlated_program = args.next().context("--program needs a program name")?
            }
            other => {
                bail!(
                    "unknown argument {other}; usage: lb-components [--rounds N] [--full-table] [--only PREFIX] [--xlated FILE [--program NAME]]"
                )
            }
        }
    }
    lb_tests::bench::cpu::pin_self(0).context("pinning to CPU 0")?;

    let mut obj = EbpfLoader::new()
        .map_max_entries("LBR_LINES_A", LINES_MAX)
        .map_max_entries("LBR_LINES_B", LINES_MAX)
        .load(lab::OBJECT)
        .context("loading the object (root?)")?;
    for name in PROGRAMS {
        let p: &mut Xdp = obj
            .program_mut(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()?;
        p.load()
            .with_context(|| format!("verifier rejected {name}"))?;
    }
    // `lb_xdp`'s tail-call target, as the agent loads it.
    lb_agent::dataplane::attach::full_path::load(&mut obj).context("loading lb_xdp_full")?;
    // The reduced tail-call programs' targets.
    for (index, target) in [(0, "lbr_tx"), (1, "lbr_vip")] {
        let fd = lab::xdp(&mut obj, target)?.fd()?.try_clone()?;
        let mut tail =
            aya::maps::ProgramArray::try_from(obj.map_mut("LBR_TAIL").context("no LBR_TAIL")?)?;
        tail.set(index, &fd, 0)?;
    }
    if let Some(path) = xlated {
        // What the verifier made of it: inlined array lookups and helpers have no call.
        let p = lab::xdp(&mut obj, &xlated_program)?;
        let id = p.info()?.id();
        let out = std::process::Command::new("bpftool")
            .args(["prog", "dump", "xlated", "id", &id.to_string()])
            .output()
            .context("running bpftool (apt-get install bpftool)")?;
        if !out.status.success() {
            bail!("bpftool: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::fs::write(&path, &out.stdout)?;
        println!(
            "{xlated_program} as the verifier left it: {path} ({:?} instructions processed)",
            p.info()?.verified_instruction_count()
        );
        return Ok(());
    }
    let mut floor_obj = Ebpf::load(lab::OBJECT)?;
    let floor: &mut Xdp = floor_obj
        .program_mut(lab::REFLECT_PROGRAM)
        .context("no reflector")?
        .try_into()?;
    floor.load()?;

    let frame = |src: IpAddr, sport: u16, flags: u8| {
        Frame::tcp(src, sport, "10.0.0.100".parse().unwrap(), 80, flags)
            .payload(&[0u8; 64])
            .bytes()
    };
    let est = frame("10.9.0.1".parse()?, 40_000, TCP_ACK);
    // The established packet of the VIP-hit rows: to a dsr service configured below.
    let hit = Frame::tcp("10.9.0.1".parse()?, 40_000, HIT_VIP.into(), 80, TCP_ACK)
        .payload(&[0u8; 64])
        .bytes();
    // As when attached: parse compares destination MACs with the interface's.
    let mac = Frame::tcp("10.9.0.1".parse()?, 1, "10.9.0.1".parse()?, 1, 0).dst_mac;
    let mut config: Array<_, DataplaneConfig> =
        Array::try_from(obj.map_mut(map_names::CONFIG).context("no LB_CONFIG")?)?;
    config.set(
        0,
        &DataplaneConfig {
            mac,
            ..DataplaneConfig::default()
        },
        0,
    )?;
    // The backend of `lbr_cache` and `lbr_established`: live and serving, a MAC to
    // rewrite to.
    let mut backends: Array<_, Backend> =
        Array::try_from(obj.map_mut(map_names::BACKENDS).context("no LB_BACKENDS")?)?;
    backends.set(
        1,
        &Backend {
            flags: BACKEND_F_LIVE | BACKEND_F_SERVING,
            mac: [2, 0, 0, 0, 0, 1],
            ..Backend::default()
        },
        0,
    )?;
    publish_hit_service(&mut obj)?;
    let mut flows: Array<MapData, FlowBucket> =
        Array::try_from(obj.take_map(map_names::FLOWS).context("no LB_FLOWS")?)?;
    let mut nat: Array<MapData, NatBucket> =
        Array::try_from(obj.take_map(map_names::NAT).context("no LB_NAT")?)?;
    let mut ring = RingBuf::try_from(obj.take_map(map_names::EVENTS).context("no LB_EVENTS")?)?;
    let lines_a = line_array(&mut obj, "LBR_LINES_A")?;
    let lines_b = line_array(&mut obj, "LBR_LINES_B")?;

    // Distinct SYNs: `set` picks a /16 so the sets never overlap.
    let distinct = |set: u8, n: usize| -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let src = IpAddr::from([10, set, (i >> 14) as u8, (i >> 6) as u8]);
                frame(src, 1024 + (i & 0x3fff) as u16, TCP_SYN)
            })
            .collect()
    };
    let (mut flow_evictions, mut nat_full_buckets) = (0, 0);
    if full_table {
        for (program, size) in [
            ("lbr_flow_insert", FLOW_TABLE_SIZE),
            ("lbr_nat_insert", NAT_FILL),
        ] {
            for i in 0..size as usize {
                let src = IpAddr::from([10, 100 + (i >> 16) as u8, (i >> 8) as u8, i as u8]);
                match run(&mut obj, program, &frame(src, 5000, TCP_SYN))? {
                    XDP_TX => {}
                    // A full LB_NAT bucket: the key did not fit (nat moves on to its
                    // next candidate port).
                    XDP_DROP if program == "lbr_nat_insert" => nat_full_buckets += 1,
                    // A full LB_FLOWS bucket: the claim evicted its longest-idle flow.
                    XDP_DROP => flow_evictions += 1,
                    action => bail!("filling with {program}: action {action}"),
                }
            }
        }
        println!(
            "LB_FLOWS and LB_NAT filled ({FLOW_TABLE_SIZE} / {NAT_FILL} inserts; {flow_evictions} flows evicted, {nat_full_buckets} nat keys found their bucket full)"
        );
    }

    let hit_case = |name, program| Case {
        name,
        program,
        packets: vec![hit.clone()],
        expect: XDP_TX,
        lines: [1, 1, 0],
    };
    let fixed = |name, program, expect| Case {
        name,
        program,
        packets: vec![est.clone()],
        expect,
        lines: [1, 1, 0],
    };
    let mut samples: Samples = Vec::new();
    let mut names = Vec::new();
    for round in 0..rounds {
        // The established packet's key in both tables (re-inserted after each clear).
        for program in ["lbr_flow_insert", "lbr_nat_insert"] {
            run(&mut obj, program, &est)?;
        }
        // The VIP-hit packet's flow, pinned to backend 1 (its cache slot is filled by
        // its first packet of each tick).
        run(&mut obj, "lbr_flow_insert", &hit)?;
        // Fresh keys every round; with a full table they evict, without one the
        // insert cases' keys are removed again after the round.
        let base = 20 + 3 * round as u8;
        // The claim case's keys, then the open case's: keys whose buckets still have a
        // free way once the keys before them are in.
        let claims = with_room(
            &flows,
            |k| TableLayout::BUILT_IN.flow_bucket(k),
            distinct(base, 2 * KEYS),
            KEYS,
        )?;
        let mut opens = claims.clone();
        opens.extend(distinct(base + 2, 2 * KEYS));
        let opens = with_room(
            &flows,
            |k| TableLayout::BUILT_IN.flow_bucket(k),
            opens,
            2 * KEYS,
        )?
        .split_off(KEYS);
        let cases = [
            fixed("XDP_PASS only (lb_pass)", "lb_pass", XDP_PASS),
            fixed("XDP_TX only", "lbr_tx", XDP_TX),
            fixed("parse + MAC swap", "lbr_parse", XDP_TX),
            fixed("+ VIP index miss", "lbr_vip", XDP_TX),
            fixed("a tail call into lbr_tx", "lbr_tail_tx", XDP_TX),
            fixed(
                "parse, VIP miss, tail call into lbr_vip",
                "lbr_tail_vip",
                XDP_TX,
            ),
            fixed("+ one outcome counter", "lbr_counter", XDP_TX),
            fixed("+ bpf_jiffies64", "lbr_jiffies", XDP_TX),
            fixed("+ cache hit, backend, MAC rewrite", "lbr_cache", XDP_TX),
            fixed("+ service and backend stats", "lbr_stats", XDP_TX),
            fixed("established dsr's parts in one", "lbr_established", XDP_TX),
            hit_case("the parts, VIP hit", "lbr_est_hit"),
            hit_case("the parts, VIP hit, to_vip checks", "lbr_est_checked"),
            hit_case("VIP hit, forward::for_service", "lbr_est_service"),
            hit_case("lb_xdp, established dsr", lb_common::PROGRAM_NAME),
            fixed("+ bpf_ktime_get_ns", "lbr_ktime", XDP_TX),
            fixed("+ nat translate (2 csums)", "lbr_translate", XDP_TX),
            fixed("+ ring buffer output", "lbr_ring_output", XDP_TX),
            fixed("+ LB_FLOWS lookup, hit", "lbr_flow_lookup", XDP_TX),
            Case {
                name: "+ LB_FLOWS lookup, miss",
                program: "lbr_flow_lookup",
                packets: distinct(base, KEYS),
                expect: XDP_DROP,
                lines: [1, 1, 0],
            },
            Case {
                name: "+ LB_FLOWS claim (new key)",
                program: "lbr_flow_insert",
                // Only keys whose bucket has a free way (a claim that evicts is
                // reported as a drop; with a full table a few buckets are full).
                packets: claims,
                expect: XDP_TX,
                lines: [1, 1, 0],
            },
            Case {
                name: "+ LB_FLOWS miss, then claim",
                program: "lbr_flow_open",
                packets: opens,
                expect: XDP_TX,
                lines: [1, 1, 0],
            },
            fixed("+ LB_NAT lookup, hit", "lbr_nat_lookup", XDP_TX),
            Case {
                name: "+ LB_NAT claim (new key)",
                program: "lbr_nat_insert",
                // Only keys whose bucket has a free way (with a full table a few
                // buckets are full: that claim fails, and costs less).
                packets: with_room(
                    &nat,
                    |k| TableLayout::BUILT_IN.nat_bucket(k),
                    distinct(base + 1, 2 * KEYS),
                    KEYS,
                )?,
                expect: XDP_TX,
                lines: [1, 1, 0],
            },
        ];
        // The floor's components: a new random line per call (the round's distinct keys).
        let keys = distinct(base + 1, KEYS);
        let line = |name, program, lines| Case {
            name,
            program,
            packets: keys.clone(),
            expect: XDP_TX,
            lines,
        };
        let cases = cases.into_iter().chain([
            fixed("+ bpf_ktime_get_coarse_ns", "lbr_ktime_coarse", XDP_TX),
            fixed("+ bpf_get_smp_processor_id", "lbr_cpu_id", XDP_TX),
            line("+ line read, one hot line", "lbr_line", [1, 1, 0]),
            line(
                "+ random line of 4 KiB (a page)",
                "lbr_line",
                [4096 / LINE, 1, 0],
            ),
            line("+ random line of 64 KiB", "lbr_line", [MIB / 16, 1, 0]),
            line("+ random line of 256 KiB", "lbr_line", [MIB / 4, 1, 0]),
            line("+ random line of 1 MiB", "lbr_line", [MIB, 1, 0]),
            // The same number of lines as 4 KiB and 16 KiB, one per page: pages (the
            // TLB) against bytes (the caches).
            line(
                "+ 64 lines, one per page (64 pages)",
                "lbr_line",
                [64, 1, 6],
            ),
            line("+ 256 lines, one per page (1 MiB)", "lbr_line", [256, 1, 6]),
            line("+ random line of 8 MiB", "lbr_line", [8 * MIB, 1, 0]),
            line("+ random line of 16 MiB", "lbr_line", [16 * MIB, 1, 0]),
            line("+ random line of 32 MiB", "lbr_line", [32 * MIB, 1, 0]),
            line(
                "+ random line of 75.5 MB (LB_FLOWS)",
                "lbr_line",
                [FLOWS_LINES, 1, 0],
            ),
            line("+ random line of 150 MiB", "lbr_line", [LINES_MAX, 1, 0]),
            line(
                "+ prefetch, then read, 75.5 MB",
                "lbr_line_prefetch",
                [FLOWS_LINES, 1, 0],
            ),
            line("+ 4 adjacent lines, hot", "lbr_line4", [4, 1, 0]),
            line(
                "+ 4 adjacent lines of 75.5 MB",
                "lbr_line4",
                [FLOWS_LINES, 1, 0],
            ),
            line("+ 2 reads, hot", "lbr_line2_indep", [1, 1, 0]),
            line(
                "+ 2 independent, 75.5 + 54.5 MB",
                "lbr_line2_indep",
                [FLOWS_LINES, NAT_LINES, 0],
            ),
            line(
                "+ 2 dependent, 75.5 + 54.5 MB",
                "lbr_line2_dep",
                [FLOWS_LINES, NAT_LINES, 0],
            ),
            line(
                "+ line claim (CAS, write), hot",
                "lbr_line_claim",
                [1, 1, 0],
            ),
            line(
                "+ line claim of 75.5 MB",
                "lbr_line_claim",
                [FLOWS_LINES, 1, 0],
            ),
        ]);
        // The nat new flow's two misses: what between two independent cold reads
        // (75.5 + 54.5 MB) serialises them, each hot and cold; then the real lookup
        // and claim in both orders.
        let two = [FLOWS_LINES, NAT_LINES, 0];
        let cases = cases.chain([
            line("+ 2 reads, call between, hot", "lbrn_call", [1, 1, 0]),
            line("+ 2 reads, call between", "lbrn_call", two),
            line("+ read, call that reads, hot", "lbrn_call_read", [1, 1, 0]),
            line("+ read, call that reads", "lbrn_call_read", two),
            line("+ 2 reads, CAS between, hot", "lbrn_cas", [1, 1, 0]),
            line("+ 2 reads, CAS between", "lbrn_cas", two),
            line("+ 2 reads, branch between, hot", "lbrn_branch", [1, 1, 0]),
            line("+ 2 reads, branch between", "lbrn_branch", two),
            line("+ 2 reads, 128 ALU between, hot", "lbrn_alu128", [1, 1, 0]),
            line("+ 2 reads, 128 ALU between", "lbrn_alu128", two),
            line("+ 2 reads, 512 ALU between, hot", "lbrn_alu512", [1, 1, 0]),
            line("+ 2 reads, 512 ALU between", "lbrn_alu512", two),
            line(
                "+ LB_FLOWS miss, LB_NAT claim",
                "lbrn_open_serial",
                [1, 1, 0],
            ),
            line(
                "+ both buckets loaded, miss, claim",
                "lbrn_open_both",
                [1, 1, 0],
            ),
            line("+ 2 reads, 32 ALU between, hot", "lbrn_alu32", [1, 1, 0]),
            line("+ 2 reads, 32 ALU between", "lbrn_alu32", two),
            line("+ 2 reads, 256 ALU between, hot", "lbrn_alu256", [1, 1, 0]),
            line("+ 2 reads, 256 ALU between", "lbrn_alu256", two),
        ]);
        let cases = cases.filter(|c| {
            only.as_ref()
                .is_none_or(|o| o.split(',').any(|o| c.program.starts_with(o)))
        });
        for (i, case) in cases.enumerate() {
            let mut n: Array<_, u32> =
                Array::try_from(obj.map_mut("LBR_LINES_N").context("no LBR_LINES_N")?)?;
            for (i, v) in case.lines.iter().enumerate() {
                n.set(i as u32, v, 0)?;
            }
            // Before every block of a cold-line case, its lines are read once.
            let mut before_block = || -> anyhow::Result<()> {
                if case.lines != [1, 1, 0] {
                    warm(&lines_a, case.lines[0], case.lines[2])?;
                    warm(&lines_b, case.lines[1], 0)?;
                }
                Ok(())
            };
            let m = measure(&case, &mut obj, floor, &mut ring, &mut before_block)?;
            if round == 0 {
                names.push(case.name);
                samples.push(Vec::new());
            }
            samples[i].push(m);
        }
        if !full_table {
            clear_table(&mut flows)?;
            clear_table(&mut nat)?;
        }
    }

    println!(
        "{} rounds{}; ns per call above the reflector floor in the same case (median, range), and the ratio to the floor",
        rounds,
        if full_table { ", full tables" } else { "" }
    );
    for (name, s) in names.iter().zip(&samples) {
        let mut extra: Vec<f64> = s.iter().map(|(p, f)| p - f).collect();
        let mut ratio: Vec<f64> = s.iter().map(|(p, f)| p / f).collect();
        let mut floors: Vec<f64> = s.iter().map(|(_, f)| *f).collect();
        extra.sort_by(f64::total_cmp);
        ratio.sort_by(f64::total_cmp);
        floors.sort_by(f64::total_cmp);
        let mid = extra.len() / 2;
        println!(
            "{name:<36} {:>+7.1} ns ({:+.1}..{:+.1})   {:.2}x   floor {:.1}",
            extra[mid],
            extra[0],
            extra[extra.len() - 1],
            ratio[mid],
            floors[mid],
        );
    }
    Ok(())
}

/// Every reduced program loaded from the object (plus `lb_pass`).
const PROGRAMS: &[&str] = &[
    "lb_pass",
    lb_common::PROGRAM_NAME,
    "lbr_est_hit",
    "lbr_est_checked",
    "lbr_est_service",
    "lbr_cache",
    "lbr_stats",
    "lbr_established",
    "lbr_tx",
    "lbr_parse",
    "lbr_vip",
    "lbr_tail_tx",
    "lbr_tail_vip",
    "lbr_counter",
    "lbr_jiffies",
    "lbr_ktime",
    "lbr_translate",
    "lbr_ring_output",
    "lbr_flow_lookup",
    "lbr_flow_insert",
    "lbr_flow_open",
    "lbr_nat_lookup",
    "lbr_nat_insert",
    "lbr_ktime_coarse",
    "lbr_cpu_id",
    "lbr_line",
    "lbr_line4",
    "lbr_line2_indep",
    "lbr_line2_dep",
    "lbr_line_claim",
    "lbr_line_prefetch",
    // The nat new flow's two misses (`lb-ebpf/src/lab/reduced_nat.rs`).
    "lbrn_call",
    "lbrn_call_read",
    "lbrn_cas",
    "lbrn_branch",
    "lbrn_alu128",
    "lbrn_alu512",
    "lbrn_open_serial",
    "lbrn_open_both",
    "lbrn_alu32",
    "lbrn_alu256",
];

/// The VIP of the VIP-hit rows (a dsr service on port 80/TCP, service id 1).
const HIT_VIP: [u8; 4] = [10, 0, 0, 101];

/// Publishes the VIP-hit rows' service into table 0 of `LB_VIP_INDEX` (seed 0,
/// generation 0, as the agent lays a one-service table out).
fn publish_hit_service(obj: &mut Ebpf) -> anyhow::Result<()> {
    let vip = VipKey {
        addr: [u32::from_ne_bytes(HIT_VIP), 0, 0, 0],
        port: 80u16.to_be(),
        proto: lb_common::IPPROTO_TCP,
        family: lb_common::FAMILY_V4,
    };
    let slot = VipSlot {
        vip,
        kind: VIP_SLOT_SERVICE,
        meta: ServiceMeta {
            service_id: 1,
            ..ServiceMeta::default()
        },
    };
    let mut index: Array<_, VipSlot> = Array::try_from(
        obj.map_mut(map_names::VIP_INDEX)
            .context("no LB_VIP_INDEX")?,
    )?;
    index.set(vip_bucket_index(0, vip_hash(&vip, 0)), &slot, 0)?;
    Ok(())
}

fn run(obj: &mut Ebpf, name: &str, packet: &[u8]) -> anyhow::Result<u32> {
    let res = lab::xdp(obj, name)?.test_run(TestRunOptions {
        data_in: Some(packet),
        ..TestRunOptions::default()
    })?;
    Ok(res.return_value)
}

/// Alternating blocks of the case's program (each after `before_block`) and the floor;
/// (program ns, floor ns) per call.
/// The ring buffer is drained after every block (no record is ever lost to a full ring).
fn measure(
    case: &Case,
    obj: &mut Ebpf,
    floor: &mut Xdp,
    ring: &mut RingBuf<MapData>,
    before_block: &mut dyn FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64)> {
    let mut program_ns = 0u128;
    let mut floor_ns = 0u128;
    for block in 0..BLOCKS {
        before_block()?;
        let prog = lab::xdp(obj, case.program)?;
        for i in 0..BLOCK {
            let call = block * BLOCK + i;
            let pkt = &case.packets[call % case.packets.len()];
            let res = prog.test_run(TestRunOptions {
                data_in: Some(pkt),
                ..TestRunOptions::default()
            })?;
            if res.return_value != case.expect {
                bail!(
                    "{}: expected action {} got {} at call {call}",
                    case.name,
                    case.expect,
                    res.return_value
                );
            }
            program_ns += res.duration.as_nanos();
        }
        while ring.next().is_some() {}
        for i in 0..BLOCK {
            let pkt = &case.packets[(block * BLOCK + i) % case.packets.len()];
            floor_ns += lab::floor_ns(floor, pkt)?;
        }
    }
    let calls = (BLOCK * BLOCKS) as f64;
    Ok((program_ns as f64 / calls, floor_ns as f64 / calls))
}

/// A cold-line array, taken out of the object (its programs keep it).
fn line_array(obj: &mut Ebpf, name: &str) -> anyhow::Result<MapData> {
    match obj.take_map(name) {
        Some(aya::maps::Map::Array(data)) => Ok(data),
        _ => bail!("no array {name} in the object"),
    }
}

/// Reads the `lines` lines a case reaches (line `i << shift` for `i < lines`) of a
/// cold-line array once, in order, through a read-only `mmap` (the pages are the ones
/// the programs read; the caches are physically tagged).
fn warm(map: &MapData, lines: u32, shift: u32) -> anyhow::Result<()> {
    let len = ((lines as usize) << shift) * LINE as usize;
    // SAFETY: a read-only shared mapping of an mmapable array of at least `len` bytes
    // (`LINES_MAX` lines), unmapped below; the fd is valid during the call.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len.next_multiple_of(4096),
            libc::PROT_READ,
            libc::MAP_SHARED,
            map.fd().as_fd().as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        bail!(
            "mmap of a cold-line array: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut sum = 0u64;
    for i in 0..lines as usize {
        // SAFETY: within the mapping; 8-byte aligned.
        sum = sum.wrapping_add(unsafe {
            std::ptr::read_volatile(
                addr.cast::<u8>()
                    .add((i << shift) * LINE as usize)
                    .cast::<u64>(),
            )
        });
    }
    std::hint::black_box(sum);
    // SAFETY: unmapping exactly what was mapped above.
    unsafe { libc::munmap(addr, len.next_multiple_of(4096)) };
    Ok(())
}

/// Empties every bucket of an array table (`LB_FLOWS`, `LB_NAT`) that holds a key.
fn clear_table<V: Default>(map: &mut Array<MapData, Bucket<V>>) -> anyhow::Result<()>
where
    Bucket<V>: aya::Pod,
{
    for i in 0..map.len() {
        if map.get(&i, 0)?.ways.iter().any(|s| s.word & SLOT_LIVE != 0) {
            map.set(i, &Bucket::<V>::default(), 0)?;
        }
    }
    Ok(())
}

/// The first `n` frames whose key's bucket (`bucket_of`) in an array table has a free
/// way left when the frames before them are in (the frames are
/// TCP to the VIP: the reduced program claims the packet's own 5-tuple).
fn with_room<V>(
    map: &Array<MapData, Bucket<V>>,
    bucket_of: fn(&FlowKey) -> u32,
    frames: Vec<Vec<u8>>,
    n: usize,
) -> anyhow::Result<Vec<Vec<u8>>>
where
    Bucket<V>: aya::Pod,
{
    let mut out = Vec::with_capacity(n);
    // Free ways left per bucket, counting the frames already taken.
    let mut free = std::collections::HashMap::new();
    for f in frames {
        let index = bucket_of(&frame_key(&f));
        let left = match free.entry(index) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let bucket = map.get(&index, 0)?;
                e.insert(
                    bucket
                        .ways
                        .iter()
                        .filter(|s| s.word & SLOT_LIVE == 0)
                        .count(),
                )
            }
        };
        if *left > 0 {
            *left -= 1;
            out.push(f);
            if out.len() == n {
                return Ok(out);
            }
        }
    }
    bail!("fewer than {n} keys with room in LB_NAT")
}

/// The 5-tuple of an untagged IPv4 TCP/UDP frame, as the program keys it.
fn frame_key(f: &[u8]) -> FlowKey {
    let ip = &f[14..];
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let word = |o: usize| u32::from_ne_bytes([ip[o], ip[o + 1], ip[o + 2], ip[o + 3]]);
    let port = |o: usize| u16::from_ne_bytes([ip[ihl + o], ip[ihl + o + 1]]);
    FlowKey {
        src: [word(12), 0, 0, 0],
        dst: [word(16), 0, 0, 0],
        sport: port(0),
        dport: port(2),
        proto: ip[9],
        family: lb_common::FAMILY_V4,
        _pad: [0; 2],
    }
}
