//! `cargo xtask bench` (saturation): how many packets per second one lb core forwards,
//! next to an nftables DNAT balancer on the same topology (BENCHMARKS.md §6). A UDP
//! flood to the VIP through the lb host into XDP programs that count and drop it — on
//! the backends behind the bridge (setup `e2e`), or on the switch port facing the lb,
//! where the generator sits too (setup `wire`, which can saturate the lb core) —
//! reported as forwarded packets per CPU-second of the lb host's receive side (its
//! threaded NAPI kernel thread, pinned to CPU 0 as in §4) and the ratio to nftables,
//! with which side's CPU ran out; and, in the same rounds, the bed's physical limit, a
//! bare XDP_TX reflector on the lb host (`lb_reflect`, the lab object's), to which each
//! balancer's figure is also a ratio. Results: stdout and `target/bench/flood.md`.
//!
//! Run as root: `cargo run --release -p lb-tests --bin lb-flood-bench -- --out
//! target/bench`. `--trickle N` sends N paced packets per run instead of a flood (the
//! smoke test's mode: the packets should arrive). Machine-readable lines start with
//! `run\t`.

mod balancers;
mod flood;
mod measure;
mod reflector;
mod report;
mod setup;

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, bail};
use balancers::Kind;
use flood::Bounds;
use lb_tests::bench::cpu;
use measure::Measured;
use setup::{Bed, OTHER_CPU, Setup};

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
pub const WARMUP: Duration = Duration::from_millis(500);
const USAGE: &str = "usage: lb-flood-bench [--out DIR] [--seconds S] [--rounds R] \
                     [--max-packets N] [--only reflector,nftables,nat,dsr] [--setup e2e,wire] \
                     [--trickle N]";

pub struct Opts {
    out: PathBuf,
    seconds: f64,
    rounds: usize,
    max_packets: u64,
    kinds: Vec<Kind>,
    setups: Vec<Setup>,
    /// Paced packets per run instead of a flood.
    trickle: Option<u64>,
}

/// One measured flood of one balancer.
pub struct Run {
    pub setup: Setup,
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
    let mut runs = Vec::new();
    for &setup in &opts.setups {
        let bed = Bed::build(setup)?;
        measure_bed(&bed, &opts, &mut runs).with_context(|| setup.describe())?;
    }
    let md = report::table(&runs, &opts);
    println!("\n{md}");
    std::fs::create_dir_all(&opts.out)?;
    let path = opts.out.join("flood.md");
    std::fs::write(&path, &md)?;
    println!("written {}", path.display());
    Ok(())
}

/// Every round: every balancer started in turn, checked, flooded with both flow
/// variants, stopped.
fn measure_bed(bed: &Bed, opts: &Opts, runs: &mut Vec<Run>) -> anyhow::Result<()> {
    let topo = &bed.topo;
    let client = topo.client();
    let vip = balancers::vip(topo);
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
    for round in 1..=opts.rounds {
        for &kind in &opts.kinds {
            let running = balancers::start(kind, topo)?;
            let result = (|| -> anyhow::Result<()> {
                if let Some(pid) = running.pid() {
                    // The agent is not on the data path; keep it off the lb's CPU.
                    cpu::pin(pid, OTHER_CPU)?;
                }
                let probe = bed.probe(kind, running.pid())?;
                let checked = probe.flood(&check, trickle(CHECK_PACKETS))?;
                // A trickle, but CPUs are shared: a starved thread may lose a few.
                if checked.delivered() < CHECK_PACKETS / 2 {
                    bail!(
                        "{} forwards: {} of {CHECK_PACKETS} paced packets reached the sinks \
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
                        setup: bed.setup,
                        kind,
                        flows: *flows,
                        m,
                    };
                    report::print_run(round, &run);
                    runs.push(run);
                }
                Ok(())
            })();
            let stopped = running.stop(topo);
            result.with_context(|| format!("round {round}, {}", kind.name()))?;
            stopped?;
        }
    }
    Ok(())
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
        setups: Setup::ALL.to_vec(),
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
            "--setup" => {
                let list = value()?;
                opts.setups = list
                    .split(',')
                    .map(|k| {
                        Setup::ALL
                            .into_iter()
                            .find(|s| s.key() == k)
                            .with_context(|| format!("unknown setup {k:?}; {USAGE}"))
                    })
                    .collect::<anyhow::Result<_>>()?;
            }
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
