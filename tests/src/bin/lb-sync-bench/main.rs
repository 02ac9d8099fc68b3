//! `lb-sync-bench [--only live,resync,replicas,lag,memory] [--records N] [--bulk N]
//! [--rates R,R] [--seconds S] [--memory N]`: the cluster component over QUIC on
//! loopback, two nodes in one process, each on its own thread with a single-threaded
//! runtime (one core each at most); node B installs what it applies into the kernel's
//! peer tables (an XDP object loaded in cluster mode) as the agent does:
//!
//! - **live records per second one core receives and applies**: node A publishes N
//!   records in batches of 1,000; node B's thread time (its runtime: QUIC, decoding,
//!   the replica table, the changes handed out; with the map writes and without) per
//!   record gives records per CPU-second, and the wall time from the first publish to
//!   B's last apply;
//! - **bulk resync**: A holds N connections; B starts empty and the time until its
//!   resync completes (every record applied; installed into the peer tables) is
//!   measured;
//! - **replicas**: the process's resident memory growth during a bulk resync without
//!   the map writes (B's replicas: A holds its records before B starts);
//! - **sync lag** ([`lag`]): at each rate, publish to B's map write, p50/p99/max;
//! - **memory** ([`kernel::memory`]): kernel bytes per replicated connection.

mod kernel;
mod lag;
mod node;

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lb_agent::cluster::{Cluster, Record};

use node::Plan;

/// Records A publishes at a time before a bulk resync.
const RESYNC_CHUNK: usize = 10_000;
/// How long A waits after publishing before B starts (see [`resync`]).
const SETTLE: Duration = Duration::from_secs(2);

const USAGE: &str = "usage: lb-sync-bench [--only live,live-alone,live-maps,writes,resync,replicas,lag,memory] [--records N] \
                     [--bulk N] [--rates R,R] [--seconds S] [--memory N]";

fn main() -> anyhow::Result<()> {
    // As the agent runs.
    lb_agent::alloc::no_transparent_huge_pages()?;
    let mut only = "live,writes,resync,replicas,lag,memory".to_owned();
    let mut records = 1_000_000usize;
    let mut bulk = 1_000_000usize;
    let mut rates = vec![10_000usize, 100_000];
    let mut seconds = 3.0f64;
    let mut memory = 1_000_000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{a}: a value; {USAGE}"))
        };
        match a.as_str() {
            "--only" => only = value()?,
            "--records" => records = value()?.parse()?,
            "--bulk" => bulk = value()?.parse()?,
            "--rates" => {
                rates = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--seconds" => seconds = value()?.parse()?,
            "--memory" => memory = value()?.parse()?,
            other => bail!("unknown argument {other}; {USAGE}"),
        }
    }
    for kind in only.split(',') {
        match kind {
            "live" => {
                // The process's first run takes its memory from the kernel (page faults,
                // zeroed huge pages) where later ones reuse what the allocator kept: one
                // untimed run first, so that neither mode pays it.
                warm_up(records)?;
                live(records, false)?;
                live(records, true)?;
            }
            "live-alone" => live(records, false)?,
            "live-maps" => live(records, true)?,
            "resync" => {
                resync(bulk, false)?;
                resync(bulk, true)?;
            }
            "replicas" => replicas(bulk)?,
            "lag" => {
                for &rate in &rates {
                    lag::lag(rate, seconds)?;
                }
            }
            "memory" => kernel::memory(memory)?,
            "writes" => kernel::writes(records)?,
            other => bail!("--only: unknown {other}; {USAGE}"),
        }
    }
    Ok(())
}

/// A run of [`live`] whose figures are not kept (see its caller).
fn warm_up(records: usize) -> anyhow::Result<()> {
    println!("warm-up (not a figure):");
    live(records, false)
}

/// A publishes `records` live; B applies them (and installs them, with `maps`).
fn live(records: usize, maps: bool) -> anyhow::Result<()> {
    let (sa, sb, [ca, cb]) = node::sockets()?;
    node::single_thread()?.block_on(async move {
        let plan = Plan {
            expect: records,
            tables: maps.then(|| kernel::sizes(records, true)).transpose()?,
            track: false,
        };
        let mut b = node::receiver(cb, sb, plan);
        b.wait_started()?;
        let a = Cluster::start_on(&ca, &node::KEY, sa)?;
        node::wait_up(&a).await?;
        let all: Vec<Record> = (0..records as u32).map(node::record).collect();
        let cpu0 = node::thread_ns(b.tid)?;
        let start = Instant::now();
        // Paced to stay within the resend window: the live path, not a bulk.
        for chunk in all.chunks(1000) {
            a.publish(chunk);
            tokio::task::yield_now().await;
            while a.status().peers[0].lag_records > 100_000 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        node::wait_done(&mut b, Duration::from_secs(300), "apply of every record").await?;
        let wall = start.elapsed();
        let cpu = Duration::from_nanos(node::thread_ns(b.tid)? - cpu0);
        println!(
            "live ({}): {records} records applied by B in {wall:.2?} wall ({:.0} records/s); \
             B's thread ran {cpu:.2?}: {:.0} records per CPU-second",
            if maps {
                "with the map writes"
            } else {
                "the cluster component alone"
            },
            records as f64 / wall.as_secs_f64(),
            records as f64 / cpu.as_secs_f64()
        );
        Ok(())
    })
}

/// A holds `n` connections; B starts empty and resyncs them (into its peer tables, with
/// `maps`).
fn resync(n: usize, maps: bool) -> anyhow::Result<node::Applied> {
    let (sa, sb, [ca, cb]) = node::sockets()?;
    node::single_thread()?.block_on(async move {
        let a = Cluster::start_on(&ca, &node::KEY, sa)?;
        // In chunks: no large buffer freed while B's memory is measured.
        let mut chunk = Vec::with_capacity(RESYNC_CHUNK);
        for first in (0..n).step_by(RESYNC_CHUNK) {
            chunk.clear();
            chunk.extend((first..n.min(first + RESYNC_CHUNK)).map(|i| node::record(i as u32)));
            a.publish(&chunk);
        }
        // The allocator gives freed memory back to the kernel after a delay.
        tokio::time::sleep(SETTLE).await;
        let plan = Plan {
            expect: n,
            tables: maps.then(|| kernel::sizes(n, true)).transpose()?,
            track: false,
        };
        let mut b = node::receiver(cb, sb, plan);
        let applied = node::wait_done(&mut b, Duration::from_secs(600), "resync").await?;
        println!(
            "bulk resync ({}): {n} connections in {:.2?} (B's start to its last {})",
            if maps {
                "with the map writes"
            } else {
                "the cluster component alone"
            },
            applied.took,
            if maps { "map write" } else { "apply" },
        );
        Ok(applied)
    })
}

/// The allocator's (mimalloc's, lb-agent's) option that gives freed memory back to the
/// kernel at once rather than after a delay: set, resident memory counts what is held.
const PURGE_AT_ONCE: (&str, &str) = ("MIMALLOC_PURGE_DELAY", "0");

/// B's replicas of `n` connections: the resident memory growth of a bulk resync, in a
/// process of this binary whose allocator gives freed memory back at once (this one when
/// it does; the option only applies at a process's start).
fn replicas(n: usize) -> anyhow::Result<()> {
    let (option, at_once) = PURGE_AT_ONCE;
    if std::env::var(option).is_ok_and(|v| v == at_once) {
        let applied = resync(n, false)?;
        println!(
            "replicas: resident memory +{} B during the resync of {n} ({:.0} B per connection)",
            applied.resident_growth,
            applied.resident_growth as f64 / n as f64
        );
        return Ok(());
    }
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["--only", "replicas", "--bulk", &n.to_string()])
        .env(option, at_once)
        .status()?;
    anyhow::ensure!(status.success(), "lb-sync-bench --only replicas: {status}");
    Ok(())
}
