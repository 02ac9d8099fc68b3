//! `cargo xtask bench` (saturation): how many packets per second one lb core forwards,
//! next to an nftables DNAT balancer on the same topology (BENCHMARKS.md §6). A UDP
//! flood from the client to the VIP, through the lb host, to backends whose XDP
//! programs count and drop it; reported as forwarded packets per CPU-second of the lb
//! host's receive side (its threaded NAPI kernel thread, pinned to CPU 0 as in §4) and
//! the ratio to nftables. Results: stdout and `target/bench/flood.md`.
//!
//! Run as root: `cargo run --release -p lb-tests --bin lb-flood-bench -- --out
//! target/bench`. `--trickle N` sends N paced packets per run instead of a flood (the
//! smoke test's mode: every packet should arrive). Machine-readable lines start with
//! `run\t`.

mod balancers;
mod flood;
mod measure;
mod report;

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, bail};
use balancers::Kind;
use flood::Bounds;
use lb_tests::{
    cpu, drop_prog, link,
    scenario::WEIGHTS,
    topology::{Forwarding, HOST_IF, Topology},
};
use measure::{Measured, Probe};

/// CPU of the lb host's receive side; everything else runs on the other one.
const LB_CPU: usize = 0;
const OTHER_CPU: usize = 1;
/// Flows of the two variants, and the client ports they start at (distinct, so each
/// variant's flows are its own).
pub const MANY_FLOWS: u16 = 4096;
pub const FEW_FLOWS: u16 = 4;
const MANY_FIRST_PORT: u16 = 10_000;
const FEW_FIRST_PORT: u16 = 30_000;
/// Client ports of the check that a balancer forwards before it is measured.
const CHECK_FIRST_PORT: u16 = 40_000;
const CHECK_PACKETS: u64 = 64;
/// Flood before every measured run (flows, conntrack entries, caches warm).
const WARMUP: Duration = Duration::from_millis(500);
const USAGE: &str = "usage: lb-flood-bench [--out DIR] [--seconds S] [--rounds R] \
                     [--max-packets N] [--only nftables,nat,dsr] [--trickle N]";

pub struct Opts {
    out: PathBuf,
    seconds: f64,
    rounds: usize,
    max_packets: u64,
    kinds: Vec<Kind>,
    /// Paced packets per run instead of a flood.
    trickle: Option<u64>,
}

/// One measured flood of one balancer.
pub struct Run {
    pub kind: Kind,
    pub flows: u16,
    pub m: Measured,
}

fn main() -> anyhow::Result<()> {
    let mut opts = parse_args()?;
    // First, while this is the only thread: every thread made later inherits it.
    cpu::pin_self(OTHER_CPU)?;
    if opts.kinds.contains(&Kind::Nftables) && !balancers::nft_available() {
        println!("nft is not installed: nftables is left out (cargo xtask bench installs it)");
        opts.kinds.retain(|k| *k != Kind::Nftables);
    }

    let topo = Topology::builder()
        .backends(WEIGHTS.len())
        .forwarding(Forwarding::Nat)
        .build()
        .context("building the topology (as root?)")?;
    let sinks = topo
        .backends()
        .iter()
        .map(|b| drop_prog::attach(&b.ns, HOST_IF, balancers::PORT))
        .collect::<Result<Vec<_>, _>>()?;
    balancers::prepare_lb_host(&topo)?;
    // The lb host receives in its own NAPI thread on LB_CPU; what it sends is received
    // by the switch's p-lb in another thread on OTHER_CPU (the sender's veth hands its
    // frames to the switch in the sender's own softirq).
    // A veth hands TSO senders' packets around NAPI: the switch side that sends to the
    // lb host gets TSO off (the hosts' eth0 have it off already).
    link::set_threaded_napi(&topo.lb().ns, HOST_IF)?;
    link::set_tso(topo.switch(), "p-lb", false)?;
    link::set_threaded_napi(topo.switch(), "p-lb")?;

    let client = topo.client();
    let vip = balancers::vip(&topo);
    let frames_for = |first_port: u16, flows: u16| {
        flood::frames(
            client.mac,
            topo.lb().mac,
            client.ipv4.into(),
            first_port,
            flows,
            vip.ip(),
            vip.port(),
        )
    };
    let variants = [
        (MANY_FLOWS, frames_for(MANY_FIRST_PORT, MANY_FLOWS)),
        (FEW_FLOWS, frames_for(FEW_FIRST_PORT, FEW_FLOWS)),
    ];
    let check = frames_for(CHECK_FIRST_PORT, CHECK_PACKETS as u16);

    let mut runs = Vec::new();
    for round in 1..=opts.rounds {
        for &kind in &opts.kinds {
            let running = balancers::start(kind, &topo)?;
            let result = (|| -> anyhow::Result<()> {
                if let Some(pid) = running.pid() {
                    // The agent is not on the data path; keep it off the lb's CPU.
                    cpu::pin(pid, OTHER_CPU)?;
                }
                let probe = probe(&topo, &sinks, running.pid())?;
                let checked = probe.flood(&check, trickle(CHECK_PACKETS))?;
                // A trickle, but CPU 0 is shared: a starved receive thread may lose a few.
                if checked.delivered() < CHECK_PACKETS / 2 {
                    bail!(
                        "{} forwards: {} of {CHECK_PACKETS} paced packets reached the backends \
                         ({:?}; the lb host received {})",
                        kind.name(),
                        checked.delivered(),
                        checked.per_backend,
                        checked.lb_rx,
                    );
                }
                for (flows, frames) in &variants {
                    let bounds = match opts.trickle {
                        Some(n) => trickle(n),
                        None => {
                            probe.flood(frames, flood_bounds(WARMUP.as_secs_f64(), u64::MAX))?;
                            flood_bounds(opts.seconds, opts.max_packets)
                        }
                    };
                    let m = probe.flood(frames, bounds)?;
                    let run = Run {
                        kind,
                        flows: *flows,
                        m,
                    };
                    report::print_run(round, &run);
                    runs.push(run);
                }
                Ok(())
            })();
            let stopped = running.stop(&topo);
            result.with_context(|| format!("round {round}, {}", kind.name()))?;
            stopped?;
        }
    }
    drop(sinks);
    drop(topo);

    let md = report::table(&runs, &opts);
    println!("\n{md}");
    std::fs::create_dir_all(&opts.out)?;
    let path = opts.out.join("flood.md");
    std::fs::write(&path, &md)?;
    println!("written {}", path.display());
    Ok(())
}

/// The lb host's NAPI threads, pinned: attaching or detaching XDP re-creates them, so
/// they are looked up after each balancer started.
fn probe<'a>(
    topo: &'a Topology,
    sinks: &'a [drop_prog::DropCounter],
    pid: Option<u32>,
) -> anyhow::Result<Probe<'a>> {
    let napi_threads = cpu::napi_threads(HOST_IF);
    if napi_threads.is_empty() {
        bail!("no NAPI thread for the lb host's {HOST_IF}");
    }
    for &t in &napi_threads {
        cpu::pin(t, LB_CPU)?;
    }
    let switch_napi = cpu::napi_threads("p-lb");
    if switch_napi.is_empty() {
        bail!("no NAPI thread for the switch's p-lb");
    }
    for t in switch_napi {
        cpu::pin(t, OTHER_CPU)?;
    }
    Ok(Probe {
        topo,
        sinks,
        napi_threads,
        pid,
    })
}

fn flood_bounds(seconds: f64, max_packets: u64) -> Bounds {
    Bounds {
        max_packets,
        duration: Duration::from_secs_f64(seconds),
        pause: Duration::ZERO,
        batch: 64,
    }
}

/// `packets` in batches of 8 with 2 ms between them: slow enough that no queue fills.
fn trickle(packets: u64) -> Bounds {
    Bounds {
        max_packets: packets,
        duration: Duration::from_secs(60),
        pause: Duration::from_millis(2),
        batch: 8,
    }
}

fn parse_args() -> anyhow::Result<Opts> {
    let mut opts = Opts {
        out: PathBuf::from("target/bench"),
        seconds: 5.0,
        rounds: 3,
        max_packets: 100_000_000,
        kinds: Kind::ALL.to_vec(),
        trickle: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().context(USAGE);
        match a.as_str() {
            "--out" => opts.out = PathBuf::from(value()?),
            "--seconds" => opts.seconds = value()?.parse().context(USAGE)?,
            "--rounds" => opts.rounds = value()?.parse().context(USAGE)?,
            "--max-packets" => opts.max_packets = value()?.parse().context(USAGE)?,
            "--trickle" => opts.trickle = Some(value()?.parse().context(USAGE)?),
            "--only" => {
                let list = value()?;
                opts.kinds = list
                    .split(',')
                    .map(|k| {
                        Kind::ALL
                            .into_iter()
                            .find(|kind| kind.key() == k)
                            .with_context(|| format!("unknown balancer {k:?}; {USAGE}"))
                    })
                    .collect::<anyhow::Result<_>>()?;
            }
            other => bail!("unknown argument {other}; {USAGE}"),
        }
    }
    if !(opts.seconds > 0.0 && opts.seconds <= 60.0) || opts.rounds == 0 || opts.max_packets == 0 {
        bail!("--seconds must be in (0, 60], --rounds and --max-packets at least 1");
    }
    Ok(opts)
}
