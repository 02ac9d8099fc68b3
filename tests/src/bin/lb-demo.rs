//! `lb-demo`: the balancer end to end in a few seconds, on namespaces it makes and removes.
//!
//! ```text
//! lb-demo [--agent PATH] [--testserver PATH] [--forwarding nat|dsr]
//!         [--xdp-mode native|generic|auto] [--connections N] [--hold SECS] [--verbose]
//! ```
//!
//! Builds a switch with `client`, `lb` and backends `b1..b3` (weights 1:1:2), starts
//! `lb-testserver` on every backend and `lb-agent` on the lb, opens N TCP connections
//! (600) from the client to the VIP, and prints how they spread over the backends.
//! Everything is removed at the end, also on error or Ctrl-C. Needs root. `lb-agent`
//! and `lb-testserver` are looked for next to this executable unless given. `--hold SECS`
//! keeps everything up for that long once the agent is ready, before the connections, to
//! look around with `ip netns exec`.

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use lb_tests::{
    agent::{self, Agent, AgentConfig, START_TIMEOUT},
    interrupt,
    scenario::{self, BACKEND_TCP_PORT, WEIGHTS},
    topology::{Forwarding, Topology},
    traffic::{self, Tally},
};

/// Upper bound of the connection loop; the demo should take seconds.
const DEADLINE: Duration = Duration::from_secs(30);

struct Args {
    agent: Option<PathBuf>,
    testserver: Option<PathBuf>,
    forwarding: Forwarding,
    xdp_mode: String,
    connections: usize,
    /// Seconds to keep everything up, before the connections, for a look around.
    hold: u64,
}

const USAGE: &str = "usage: lb-demo [--agent PATH] [--testserver PATH] [--forwarding nat|dsr] \
                     [--xdp-mode native|generic|auto] [--connections N] [--hold SECS] [--verbose]";

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        agent: None,
        testserver: None,
        forwarding: Forwarding::Nat,
        xdp_mode: "native".to_owned(),
        connections: 600,
        hold: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--agent" => args.agent = Some(value()?.into()),
            "--testserver" => args.testserver = Some(value()?.into()),
            "--forwarding" => {
                args.forwarding = match value()?.as_str() {
                    "nat" => Forwarding::Nat,
                    "dsr" => Forwarding::Dsr,
                    other => bail!("--forwarding {other:?}: expected nat or dsr"),
                }
            }
            "--xdp-mode" => {
                let mode = value()?;
                if !["native", "generic", "auto"].contains(&mode.as_str()) {
                    bail!("--xdp-mode {mode:?}: expected native, generic or auto");
                }
                args.xdp_mode = mode;
            }
            "--connections" => {
                let n: usize = value()?.parse().context("--connections")?;
                if !(1..=5000).contains(&n) {
                    bail!("--connections {n}: expected 1..=5000");
                }
                args.connections = n;
            }
            "--hold" => {
                let secs: u64 = value()?.parse().context("--hold")?;
                if secs > 3600 {
                    bail!("--hold {secs}: at most 3600 seconds");
                }
                args.hold = secs;
            }
            // Read by the harness's log readers: echo every child's output.
            "-v" | "--verbose" => unsafe_set_verbose(),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    Ok(args)
}

fn unsafe_set_verbose() {
    // SAFETY: called while parsing arguments, before any other thread exists.
    unsafe { std::env::set_var("LB_TEST_VERBOSE", "1") };
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("lb-demo: {err:#}");
            return ExitCode::from(2);
        }
    };
    if let Err(err) = interrupt::install() {
        eprintln!("lb-demo: cannot handle Ctrl-C ({err}); continuing");
    }
    // Every guard lives inside `demo`, so they have all run when it returns.
    let result = demo(&args);
    let interrupted = interrupt::requested();
    match result {
        Ok(true) if !interrupted => {
            println!("lb-demo: done, everything removed");
            ExitCode::SUCCESS
        }
        Ok(_) if !interrupted => {
            println!("lb-demo: some connections failed (see above); everything removed");
            ExitCode::from(1)
        }
        Err(err) if !interrupted => {
            eprintln!("lb-demo: error: {err:#}");
            eprintln!("lb-demo: everything removed");
            ExitCode::from(1)
        }
        _ => {
            eprintln!("lb-demo: interrupted; everything removed");
            ExitCode::from(130)
        }
    }
}

/// Runs the demo; `Ok(true)` when every connection was answered.
fn demo(args: &Args) -> anyhow::Result<bool> {
    let agent_bin = match &args.agent {
        Some(p) => p.clone(),
        None => agent::locate_binary("lb-agent")?,
    };
    let server_bin = match &args.testserver {
        Some(p) => p.clone(),
        None => agent::locate_binary("lb-testserver")?,
    };
    for bin in [&agent_bin, &server_bin] {
        if !bin.is_file() {
            bail!("{} does not exist", bin.display());
        }
    }
    let started = Instant::now();

    let topo = Topology::builder()
        .backends(WEIGHTS.len())
        .forwarding(args.forwarding)
        .build()
        .context("building the namespaces")?;
    let k = topo.subnet();
    println!(
        "lb-demo: namespaces {}-{{sw,client,lb,b1,b2,b3}}: client, lb and 3 backends on a bridge, 10.77.{k}.0/24",
        topo.switch().name().trim_end_matches("-sw")
    );
    check_interrupt()?;

    let _servers =
        scenario::start_testservers(&topo, &server_bin).context("starting lb-testserver")?;
    println!("lb-demo: lb-testserver answering on b1, b2, b3 (tcp {BACKEND_TCP_PORT})");
    check_interrupt()?;

    let backends = scenario::weighted(&topo, &WEIGHTS);
    let service = scenario::tcp_service(&topo, &backends);
    let vip = service.vip;
    let agent = Agent::start(
        &topo,
        &agent_bin,
        &AgentConfig::new(vec![service]),
        Some(&args.xdp_mode),
        START_TIMEOUT,
    )
    .context("starting lb-agent")?;
    println!(
        "lb-demo: lb-agent ready ({}, XDP {} on lb's eth0, VIP {vip})",
        args.forwarding.as_str(),
        args.xdp_mode
    );
    check_interrupt()?;

    if args.hold > 0 {
        println!(
            "lb-demo: holding for {}s (Ctrl-C stops the demo); the client is `ip netns exec {} ...`",
            args.hold,
            topo.client().ns.name(),
        );
        let until = Instant::now() + Duration::from_secs(args.hold);
        while Instant::now() < until && !interrupt::requested() {
            std::thread::sleep(Duration::from_millis(100));
        }
        check_interrupt()?;
    }

    let client = topo.client();
    println!(
        "lb-demo: {} TCP connections from the client ({}) to {vip}...",
        args.connections, client.ipv4
    );
    let tally = traffic::tcp_names(
        &client.ns,
        client.ipv4.into(),
        10_000,
        vip,
        args.connections,
        DEADLINE,
    )
    .context("entering the client namespace")?;
    check_interrupt()?;
    print_table(&tally, &backends);

    let status = agent.stop(Duration::from_secs(3))?;
    if !status.success() {
        println!("lb-demo: lb-agent exited with {status}");
    }
    drop(topo);
    println!("lb-demo: took {:.1?}", started.elapsed());
    Ok(tally.failures.is_empty())
}

fn check_interrupt() -> anyhow::Result<()> {
    if interrupt::requested() {
        bail!("interrupted");
    }
    Ok(())
}

fn print_table(tally: &Tally, backends: &[(&lb_tests::topology::Host, u32)]) {
    let total_weight: u32 = backends.iter().map(|(_, w)| w).sum();
    println!();
    println!(
        "  {:<8} {:<18} {:>6} {:>9} {:>12} {:>9}",
        "backend", "address", "weight", "expected", "connections", "measured"
    );
    for (host, weight) in backends {
        let addr = format!("{}:{BACKEND_TCP_PORT}", host.ipv4);
        println!(
            "  {:<8} {:<18} {:>6} {:>8.1}% {:>12} {:>8.1}%",
            host.role,
            addr,
            weight,
            100.0 * f64::from(*weight) / f64::from(total_weight),
            tally.counts.get(&host.role).unwrap_or(&0),
            100.0 * tally.share(&host.role)
        );
    }
    println!(
        "\n  {} of {} connections answered in {:.2?}",
        tally.answered(),
        tally.attempted,
        tally.elapsed
    );
    for failure in tally.failures.iter().take(5) {
        println!("  failed: {failure}");
    }
    println!();
}
