//! `cargo xtask bench` (end to end): the balancer's own CPU per TCP connection through
//! the namespace topology, lb next to an nftables DNAT balancer and HAProxy on the same
//! hosts and the same traffic (DESIGN.md §10.4). Results: stdout and
//! `target/bench/e2e.md`.
//!
//! On 2 vCPUs a load test is bound by the whole machine, so what is compared is the
//! balancer's own CPU, isolated on CPU 0: the lb host's `eth0` receives in a threaded
//! NAPI kernel thread pinned there (where XDP, or netfilter and forwarding, or the
//! kernel half of HAProxy's sockets run), and a balancer process (HAProxy, lb-agent)
//! is pinned there too. Everything else (this process, which is the client, the
//! backends' servers, and the switch-side NAPI thread that takes what the lb host
//! sends) is pinned to CPU 1. Balancer CPU = the NAPI thread's plus the process's
//! on-CPU time (`/proc/…/schedstat`) over the run, per connection.
//!
//! Each connection is a fresh TCP connection from the client to the VIP that reads the
//! backend's greeting line and closes: handshake, one data segment each way, teardown.
//! Run as root: `cargo run --release -p lb-tests --bin lb-e2e-bench -- --out target/bench`.

mod balancers;

use std::{fmt::Write as _, net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context, bail};
use balancers::{Kind, VIP_PORT};
use lb_tests::{
    bench::cpu,
    net::{
        link,
        topology::{Forwarding, HOST_IF, Topology},
    },
    scenario::balance::{self, WEIGHTS},
    traffic::clients,
};

/// CPU of the balancer under test; everything else runs on the other one.
const BALANCER_CPU: usize = 0;
const OTHER_CPU: usize = 1;
/// Connections before each measured run (caches, conntrack, ARP, flow tables warm).
const WARMUP: usize = 200;
/// First client source port of the measured runs; every run uses ports of its own.
const FIRST_PORT: u16 = 10_000;
const RUN_DEADLINE: Duration = Duration::from_secs(120);
const USAGE: &str = "usage: lb-e2e-bench [--out DIR] [--connections N] [--rounds R]";

struct Opts {
    out: PathBuf,
    connections: usize,
    rounds: usize,
}

/// One measured run of one balancer.
struct Run {
    kind: Kind,
    answered: usize,
    failures: Vec<String>,
    wall: Duration,
    napi: Duration,
    process: Duration,
}

fn main() -> anyhow::Result<()> {
    let opts = parse_args()?;
    // First, while this is the only thread: every thread made later inherits it.
    cpu::pin_self(OTHER_CPU)?;
    let runs_needed = opts.rounds * Kind::ALL.len();
    let ports_needed = runs_needed * (opts.connections + WARMUP);
    if usize::from(FIRST_PORT) + ports_needed > usize::from(u16::MAX) {
        bail!(
            "{runs_needed} runs of {} connections need {ports_needed} client ports: fewer, please",
            opts.connections
        );
    }

    let topo = Topology::builder()
        .backends(WEIGHTS.len())
        .forwarding(Forwarding::Nat)
        .build()
        .context("building the topology (as root?)")?;
    let testserver = lb_tests::agent::daemon::locate_binary("lb-testserver")?;
    let servers = balance::start_testservers(&topo, &testserver)?;
    for s in &servers {
        cpu::pin(s.pid(), OTHER_CPU)?;
    }
    lb_tests::bench::nft_balancer::prepare_lb_host(&topo)?;
    // The lb host receives in its own NAPI thread, and what it sends is received by the
    // switch in another. A veth hands TSO senders' packets around NAPI: the switch side
    // gets TSO off; the hosts' eth0 have it off already (the harness turns their TX
    // checksum offload off, which TSO depends on).
    link::set_threaded_napi(&topo.lb().ns, HOST_IF)?;
    link::set_tso(topo.switch(), "p-lb", false)?;
    link::set_threaded_napi(topo.switch(), "p-lb")?;

    let mut runs = Vec::new();
    let mut port = FIRST_PORT;
    for round in 0..opts.rounds {
        for kind in Kind::ALL {
            let run = measure(&topo, kind, port, opts.connections)
                .with_context(|| format!("round {}, {}", round + 1, kind.name()))?;
            port += (opts.connections + WARMUP) as u16;
            println!(
                "round {}: {:<20} {} of {} answered, balancer {:.1} µs/connection (NAPI {:.1} + process {:.1}), {:.0} connections/s",
                round + 1,
                kind.name(),
                run.answered,
                opts.connections,
                per_conn(run.napi + run.process, run.answered),
                per_conn(run.napi, run.answered),
                per_conn(run.process, run.answered),
                run.answered as f64 / run.wall.as_secs_f64(),
            );
            runs.push(run);
        }
    }
    drop(servers);
    drop(topo);

    let md = report(&runs, &opts);
    println!("\n{md}");
    std::fs::create_dir_all(&opts.out)?;
    let path = opts.out.join("e2e.md");
    std::fs::write(&path, &md)?;
    println!("written {}", path.display());
    let failed: usize = runs.iter().map(|r| r.failures.len()).sum();
    if failed > 0 {
        bail!("{failed} connections failed (see the table)");
    }
    Ok(())
}

fn parse_args() -> anyhow::Result<Opts> {
    let mut opts = Opts {
        out: PathBuf::from("target/bench"),
        connections: 3_000,
        rounds: 3,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().context(USAGE);
        match a.as_str() {
            "--out" => opts.out = PathBuf::from(value()?),
            "--connections" => opts.connections = value()?.parse().context(USAGE)?,
            "--rounds" => opts.rounds = value()?.parse().context(USAGE)?,
            other => bail!("unknown argument {other}; {USAGE}"),
        }
    }
    if opts.connections == 0 || opts.rounds == 0 {
        bail!("--connections and --rounds must be at least 1");
    }
    Ok(opts)
}

/// Starts `kind`, warms it up, measures `connections` connections from client ports
/// `first_port + WARMUP..`, stops it.
fn measure(
    topo: &Topology,
    kind: Kind,
    first_port: u16,
    connections: usize,
) -> anyhow::Result<Run> {
    let running = balancers::start(kind, topo)?;
    if let Some(pid) = running.pid() {
        cpu::pin(pid, BALANCER_CPU)?;
    }
    // Attaching XDP re-creates the interface's NAPI instances: find the threads now.
    let lb_napi = cpu::napi_threads(HOST_IF);
    if lb_napi.is_empty() {
        bail!("no NAPI thread for the lb host's {HOST_IF}");
    }
    for &t in &lb_napi {
        cpu::pin(t, BALANCER_CPU)?;
    }
    let switch_napi = cpu::napi_threads("p-lb");
    if switch_napi.is_empty() {
        bail!("no NAPI thread for the switch's p-lb");
    }
    for t in switch_napi {
        cpu::pin(t, OTHER_CPU)?;
    }
    let client = topo.client();
    let vip = SocketAddr::new(topo.vip4().into(), VIP_PORT);
    let warm = clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        first_port,
        vip,
        WARMUP,
        RUN_DEADLINE,
    )?;
    if warm.answered() != WARMUP {
        bail!(
            "warm-up: {} of {WARMUP} answered: {:?}",
            warm.answered(),
            warm.failures
        );
    }

    let napi_before = cpu::on_cpu(&lb_napi);
    let process_before = running.pid().map_or(Duration::ZERO, cpu::process_on_cpu);
    let started = std::time::Instant::now();
    let tally = clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        first_port + WARMUP as u16,
        vip,
        connections,
        RUN_DEADLINE,
    )?;
    let wall = started.elapsed();
    let napi = cpu::on_cpu(&lb_napi).saturating_sub(napi_before);
    let process = running
        .pid()
        .map_or(Duration::ZERO, cpu::process_on_cpu)
        .saturating_sub(process_before);
    running.stop(topo)?;
    Ok(Run {
        kind,
        answered: tally.answered(),
        failures: tally.failures,
        wall,
        napi,
        process,
    })
}

fn per_conn(d: Duration, connections: usize) -> f64 {
    d.as_secs_f64() * 1e6 / connections.max(1) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn report(runs: &[Run], opts: &Opts) -> String {
    let of = |kind: Kind| runs.iter().filter(move |r| r.kind == kind);
    let total = |kind: Kind| {
        median(
            of(kind)
                .map(|r| per_conn(r.napi + r.process, r.answered))
                .collect(),
        )
    };
    let baseline = total(Kind::Nftables);
    let mut md = format!(
        "# End to end: balancer CPU per TCP connection\n\n\
         {} connections per run (after {WARMUP} warm-up), {} rounds, the balancers \
         alternating; medians over the rounds. Each connection: handshake, the backend's \
         greeting line, close. Backends weighted 1:1:2.\n\n\
         | balancer | answered | balancer CPU per connection | of which lb host NAPI (kernel) | \
         of which process | vs nftables | connections/s (client-bound) |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        opts.connections, opts.rounds
    );
    for kind in Kind::ALL {
        let answered: usize = of(kind).map(|r| r.answered).sum();
        let runs_of = of(kind).count();
        let napi = median(of(kind).map(|r| per_conn(r.napi, r.answered)).collect());
        let process = median(of(kind).map(|r| per_conn(r.process, r.answered)).collect());
        let rate = median(
            of(kind)
                .map(|r| r.answered as f64 / r.wall.as_secs_f64())
                .collect(),
        );
        let t = total(kind);
        let _ = writeln!(
            md,
            "| {} | {answered} of {} | {t:.1} µs | {napi:.1} µs | {process:.1} µs | {:.2}× | {rate:.0} |",
            kind.name(),
            runs_of * opts.connections,
            t / baseline,
        );
    }
    for r in runs.iter().filter(|r| !r.failures.is_empty()) {
        let _ = writeln!(
            md,
            "\n{} failures of {}: {:?}",
            r.failures.len(),
            r.kind.name(),
            &r.failures[..r.failures.len().min(5)]
        );
    }
    md.push_str(
        "\nMethod: one topology (client, lb, b1..b3 on a bridge, as the namespace tests), \
         the three balancers set up in turn in the lb host: lb-agent with one nat service \
         (XDP native on the lb's eth0); an nftables table with DNAT (`numgen random` over \
         a 1:1:2 map) and SNAT to the lb's address; HAProxy 1 thread, `mode tcp`, weighted \
         round robin on the VIP bound to the lb's `lo`. The lb host's eth0 gets a threaded \
         NAPI pinned to CPU 0 with the balancer's process; the client (this process), the \
         backends' servers and the switch side's NAPI thread run on CPU 1. Balancer CPU = \
         on-CPU time (`/proc/PID/schedstat`, summed over threads) of the lb host's NAPI \
         thread plus the balancer process over the measured run, divided by the answered \
         connections; lb-agent's process time is its control plane (it runs no probes \
         here). Connections/s is bound by the single client thread, not the balancers.\n",
    );
    md
}
