//! `lb-soak`: the ordinary-traffic scenario (`netns_traffic_ordinary`) held for minutes:
//! four backends that close first, three loops of new connections at a user's pace, two
//! keep-alive clients, the agent started as operators do with the default passive
//! settings and one http probe. Prints, per forwarding mode, requests, failures,
//! transitions, port pressure (the data plane's counters and the backends'
//! `TcpExtPAWSTimewait`) and the agent's RSS (start, peak, end); writes the same into
//! `OUT/soak.txt`.
//!
//! ```text
//! lb-soak [--duration SECS] [--mode nat|dsr|both] [--out DIR]
//! ```
//! Defaults: 600 s per mode, both modes, `target/bench`. Needs root, and `lb-agent` and
//! `lb-testserver` next to it (a `cargo build --release --workspace --bins`).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use lb_tests::{
    agent::daemon::locate_binary,
    net::topology::Forwarding,
    scenario::realistic::{Bed, Role},
    traffic::ordinary::{Client, Ordinary, OrdinaryConfig, Report},
};

/// How often the agent's RSS is sampled.
const RSS_EVERY: Duration = Duration::from_secs(5);
/// Length of one chunk of client traffic.
const CHUNK: Duration = Duration::from_secs(60);

struct Args {
    duration: Duration,
    modes: Vec<Forwarding>,
    out: PathBuf,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        duration: Duration::from_secs(600),
        modes: vec![Forwarding::Nat, Forwarding::Dsr],
        out: PathBuf::from("target/bench"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--duration" => {
                let secs: u64 = value()?.parse().context("--duration SECS")?;
                if secs == 0 || secs > 24 * 3600 {
                    bail!("--duration must be 1..=86400 seconds");
                }
                a.duration = Duration::from_secs(secs);
            }
            "--mode" => {
                a.modes = match value()?.as_str() {
                    "nat" => vec![Forwarding::Nat],
                    "dsr" => vec![Forwarding::Dsr],
                    "both" => vec![Forwarding::Nat, Forwarding::Dsr],
                    other => bail!("--mode {other:?}: nat, dsr or both"),
                }
            }
            "--out" => a.out = PathBuf::from(value()?),
            other => {
                bail!(
                    "unknown argument {other}; usage: lb-soak [--duration SECS] [--mode nat|dsr|both] [--out DIR]"
                )
            }
        }
    }
    Ok(a)
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    lb_tests::util::interrupt::install().context("installing the Ctrl-C handler")?;
    let testserver = locate_binary("lb-testserver")?;
    let mut text = String::new();
    for (i, mode) in args.modes.iter().enumerate() {
        if lb_tests::util::interrupt::requested() {
            break;
        }
        let result = soak(*mode, 171 + i as u8, args.duration, &testserver);
        println!("{result}");
        text.push_str(&result);
        text.push('\n');
    }
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join("soak.txt");
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!("written to {}", path.display());
    Ok(())
}

fn soak(mode: Forwarding, subnet: u8, duration: Duration, testserver: &std::path::Path) -> String {
    let bed = Bed::start(mode, subnet, &Role::primaries(4), testserver);
    let start = bed.start_readings();
    let rss_start = bed.agent_rss_kib().unwrap_or(0);
    let mut rss_peak = rss_start;
    let mut totals = Totals::default();
    let t0 = Instant::now();
    // The clients run in chunks, so that a long soak keeps one chunk's records in
    // memory, not ten minutes' (millions of requests); between two chunks the
    // keep-alive connections close and reopen.
    while t0.elapsed() < duration && !lb_tests::util::interrupt::requested() {
        let chunk = CHUNK.min(duration - t0.elapsed());
        let traffic = Ordinary::start(&bed.topo.client().ns, &OrdinaryConfig::new(bed.vip, chunk));
        let chunk_start = Instant::now();
        while chunk_start.elapsed() < chunk && !lb_tests::util::interrupt::requested() {
            thread::sleep(RSS_EVERY.min(chunk.saturating_sub(chunk_start.elapsed())));
            rss_peak = rss_peak.max(bed.agent_rss_kib().unwrap_or(0));
        }
        let report = traffic.finish(true);
        totals.add(&report);
        eprintln!(
            "soak {} +{:.0} s: {} requests, {} failed so far",
            mode.as_str(),
            t0.elapsed().as_secs_f64(),
            totals.requests,
            totals.failures.len()
        );
    }
    let events = bed.events_since(bed.baseline).unwrap_or_default();
    let readings = bed.finish_readings(&start, &events);
    let secs = t0.elapsed().as_secs_f64();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "soak {} for {secs:.0} s: {} failed of {} requests ({:.0}/s; {} new connections); \
         {} transitions, {} membership notes; TcpExtPAWSTimewait {}; agent RSS {} KiB at \
         start, {} KiB peak, {} KiB at end",
        mode.as_str(),
        totals.failures.len(),
        totals.requests,
        totals.requests as f64 / secs,
        totals.new_conns,
        readings.transitions,
        readings.notes,
        readings.paws_timewait,
        rss_start,
        rss_peak,
        readings.agent_rss_kib.unwrap_or(0),
    );
    let _ = writeln!(
        out,
        "  latency: worst p50 {:?}, worst p99 {:?} over {} chunks, max {:?}; per backend: {:?}",
        totals.p50, totals.p99, totals.chunks, totals.max, totals.per_backend
    );
    let mut causes: BTreeMap<String, usize> = BTreeMap::new();
    for f in &totals.failures {
        *causes.entry(f.clone()).or_default() += 1;
    }
    if !causes.is_empty() {
        let _ = writeln!(out, "  failures by cause: {causes:?}");
    }
    let _ = writeln!(
        out,
        "  data-plane counters over the run: {:?}",
        readings.counters
    );
    if !events.is_empty() {
        let _ = writeln!(
            out,
            "  first events:\n{}",
            bed.describe_events(&events[..events.len().min(10)], bed.baseline)
        );
    }
    out
}

/// The sums over the chunks of a soak.
#[derive(Default)]
struct Totals {
    chunks: usize,
    requests: usize,
    new_conns: usize,
    /// The cause of every failed request.
    failures: Vec<String>,
    per_backend: BTreeMap<String, usize>,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

impl Totals {
    fn add(&mut self, r: &Report) {
        self.chunks += 1;
        self.requests += r.requests.len();
        self.new_conns += r
            .requests
            .iter()
            .filter(|q| matches!(q.client, Client::NewConn(_)))
            .count();
        self.failures
            .extend(r.failures().map(|(_, f)| f.cause.to_string()));
        for (name, n) in r.per_backend() {
            *self.per_backend.entry(name).or_default() += n;
        }
        self.p50 = self.p50.max(r.latency(0.5));
        self.p99 = self.p99.max(r.latency(0.99));
        self.max = self.max.max(r.latency(1.0));
    }
}
