//! `lb-demo`: a tour of the balancer end to end, on namespaces it makes and removes.
//!
//! ```text
//! lb-demo [--agent PATH] [--testserver PATH] [--forwarding nat|dsr]
//!         [--xdp-mode native|generic|auto] [--connections N] [--hold SECS]
//!         [--stay] [--page-port PORT] [--verbose]
//! ```
//!
//! Builds a switch with `client`, `lb` and backends `b1..b5`, starts `lb-testserver` on
//! every backend and `lb-agent` on the lb with one service: primaries b1, b2, b3
//! (weights 1:1:2), spare b4 (weight 2), backup level 1 b5, a `tcp` probe every 300 ms.
//! Then, in short sections with the agent's own view (its REST API):
//!
//! 1. the distribution of N new connections (1000) over the primaries;
//! 2. b3's server stops: how long until the agent took it out of traffic, and what a
//!    client opening a connection every 5 ms saw meanwhile;
//! 3. spare b4 covers b3's missing weight, then retires when b3 is back while a
//!    connection opened on it keeps working;
//! 4. every primary and the spare stop: backup level 1 (b5) takes the traffic, and
//!    gives it back when they return;
//! 5. the agent is stopped and started again under traffic (the XDP program stays
//!    attached and forwarding; the new agent adopts its maps): no connection fails.
//!
//! Everything is removed at the end, also on error or Ctrl-C. Needs root. `lb-agent`
//! and `lb-testserver` are looked for next to this executable unless given. `--hold SECS`
//! keeps everything up for that long once the agent is ready, before the tour, to look
//! around with `ip netns exec`. Takes well under two minutes.
//!
//! The agent's status page (docs/status-page.md) is forwarded to
//! `http://127.0.0.1:9900/` of this host (`--page-port`; another free port if that one is
//! taken) from the moment the agent is ready; `--stay` keeps everything up after the tour
//! until Ctrl-C, so the page can be looked at as long as one likes.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use lb_tests::{
    agent::{
        api::{self, Api, ServiceView},
        bpffs::PrivateBpffs,
        daemon::{self, Agent, AgentConfig, START_TIMEOUT},
    },
    net::{
        forward::Forward,
        topology::{Forwarding, Topology},
    },
    scenario::{
        balance::{BACKEND_TCP_PORT, SHARE_TOLERANCE},
        redundancy::{self, Attempt, Backends, Member, SourcePorts, Stream, TcpProbe},
    },
    traffic::clients::{self, EchoConn, Tally},
    util::interrupt,
};

/// Upper bound of one connection loop, so that the tour stays under two minutes even on
/// a machine busy with other work (it takes seconds otherwise).
const DEADLINE: Duration = Duration::from_secs(20);
/// Longest wait for a state change seen through the API (the probe decides within
/// 1.3 s; the rest is margin for a busy machine).
const VERDICT_WAIT: Duration = Duration::from_secs(15);
/// Pause between two connections of a background stream.
const PACE: Duration = Duration::from_millis(5);
/// A stream's connection fails if not answered within this (before a SYN retransmit).
const STREAM_CONNECT: Duration = Duration::from_millis(900);
/// Upper bound of a background stream.
const STREAM_LIMIT: Duration = Duration::from_secs(40);
/// Source ports reserved for a background stream.
const STREAM_PORTS: usize = 6000;

struct Args {
    agent: Option<PathBuf>,
    testserver: Option<PathBuf>,
    forwarding: Forwarding,
    xdp_mode: String,
    connections: usize,
    /// Seconds to keep everything up, before the tour, for a look around.
    hold: u64,
    /// Keep everything up after the tour until Ctrl-C.
    stay: bool,
    /// Host loopback port the status page is forwarded to (0: any free port).
    page_port: u16,
}

/// Where the status page is forwarded on the host by default.
const PAGE_PORT: u16 = 9900;

const USAGE: &str = "usage: lb-demo [--agent PATH] [--testserver PATH] [--forwarding nat|dsr] \
                     [--xdp-mode native|generic|auto] [--connections N] [--hold SECS] \
                     [--stay] [--page-port PORT] [--verbose]";

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        agent: None,
        testserver: None,
        forwarding: Forwarding::Nat,
        xdp_mode: "native".to_owned(),
        connections: 1000,
        hold: 0,
        stay: false,
        page_port: PAGE_PORT,
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
            "--stay" => args.stay = true,
            "--page-port" => args.page_port = value()?.parse().context("--page-port")?,
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
    let started = Instant::now();
    // Every guard lives inside `demo`, so they have all run when it returns.
    let result = demo(&args);
    let took = started.elapsed();
    // With --stay, Ctrl-C after the tour is how the demo is meant to end.
    let interrupted = interrupt::requested() && !(args.stay && result.is_ok());
    match result {
        Ok(problems) if !interrupted && problems.is_empty() => {
            println!("lb-demo: done in {took:.1?}, everything removed");
            ExitCode::SUCCESS
        }
        Ok(problems) if !interrupted => {
            println!(
                "lb-demo: done in {took:.1?}, everything removed; {} unexpected result(s):",
                problems.len()
            );
            for p in &problems {
                println!("  - {p}");
            }
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

/// Runs the tour; returns what did not behave as expected (empty when all did).
fn demo(args: &Args) -> anyhow::Result<Vec<String>> {
    let agent_bin = match &args.agent {
        Some(p) => p.clone(),
        None => daemon::locate_binary("lb-agent")?,
    };
    let server_bin = match &args.testserver {
        Some(p) => p.clone(),
        None => daemon::locate_binary("lb-testserver")?,
    };
    for bin in [&agent_bin, &server_bin] {
        if !bin.is_file() {
            bail!("{} does not exist", bin.display());
        }
    }
    let hitless = supports_hitless_restart(&agent_bin);

    // Declared first, dropped last: the namespaces go before the bpffs is unmounted.
    let pins = if hitless {
        Some(PrivateBpffs::mount("demo").context("mounting a bpffs for the pinned maps")?)
    } else {
        None
    };
    let topo = Topology::builder()
        .backends(5)
        .forwarding(args.forwarding)
        .build()
        .context("building the namespaces")?;
    let h = topo.backends();
    let members = [
        Member::primary("b1", &h[0], 1),
        Member::primary("b2", &h[1], 1),
        Member::primary("b3", &h[2], 2),
        Member::spare("b4", &h[3], 2),
        Member::backup("b5", &h[4], 1),
    ];
    let k = topo.subnet();
    println!(
        "lb-demo: namespaces {}-{{sw,client,lb,b1..b5}}: client, lb and 5 backends on a bridge, 10.77.{k}.0/24",
        topo.switch().name().trim_end_matches("-sw")
    );
    check_interrupt()?;

    let backends =
        Backends::start(&server_bin, &members, false).context("starting lb-testserver")?;
    check_interrupt()?;

    let probe = TcpProbe::fast();
    let service = redundancy::service(&topo, "web", &members, &probe, &[]);
    let vip = service.vip;
    let mut config = AgentConfig::new(vec![service]);
    if let Some(p) = &pins {
        config.pin_path = p.pins().display().to_string();
    }
    let agent = Agent::start(
        &topo,
        &agent_bin,
        &config,
        Some(&args.xdp_mode),
        START_TIMEOUT,
    )
    .context("starting lb-agent")?;
    println!(
        "lb-demo: lb-agent ready: service web, VIP {vip} ({}, XDP {} on lb's eth0)\n\
         \x20 primaries b1 (weight 1), b2 (1), b3 (2); spare b4 (weight 2); backup level 1: b5\n\
         \x20 tcp probe on :{BACKEND_TCP_PORT} every {:?}, timeout {:?}, fails {}, passes {}",
        args.forwarding.as_str(),
        args.xdp_mode,
        probe.interval,
        probe.timeout,
        probe.fails,
        probe.passes
    );
    check_interrupt()?;
    let _page = forward_page(&topo, args.page_port);

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

    let mut tour = Tour {
        api: Api::new(&topo.lb().ns),
        topo: &topo,
        members,
        backends,
        agent: Some(agent),
        agent_bin,
        config,
        xdp_mode: args.xdp_mode.clone(),
        vip,
        probe,
        ports: SourcePorts::new(),
        connections: args.connections,
        problems: Vec::new(),
    };
    tour.distribution()?;
    tour.failure()?;
    tour.spare()?;
    tour.backup_level()?;
    if hitless {
        tour.restart()?;
    } else {
        println!(
            "\n== 5. Agent restart under traffic ==\n  skipped: this lb-agent has no \
             `run --reset` (no hitless restart)"
        );
    }
    if args.stay {
        println!(
            "\nlb-demo: the tour is over; everything stays up (the status page too) until Ctrl-C"
        );
        while !interrupt::requested() {
            std::thread::sleep(Duration::from_millis(100));
        }
        println!("lb-demo: Ctrl-C: cleaning up");
    }
    tour.finish()
}

/// Forwards the agent's API (status page at `/`) from the lb namespace to the host's
/// loopback, on `port` or, if that is taken, any free port; `None` (with a note) if
/// neither works: the tour goes on without it.
fn forward_page(topo: &Topology, port: u16) -> Option<Forward> {
    let target: SocketAddr = daemon::API_LISTEN.parse().expect("a socket address");
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let fwd = Forward::start(at(port), &topo.lb().ns, target)
        .or_else(|_| Forward::start(at(0), &topo.lb().ns, target));
    match fwd {
        Ok(f) => {
            println!(
                "lb-demo: status page: http://{}/ (the agent's API in the lb namespace; \
                 read-only; `--stay` keeps it up after the tour)",
                f.addr()
            );
            Some(f)
        }
        Err(err) => {
            println!("lb-demo: could not forward the status page to the host ({err})");
            None
        }
    }
}

/// Whether `lb-agent run` knows `--reset`, i.e. pins its maps and survives a restart.
fn supports_hitless_restart(agent_bin: &Path) -> bool {
    Command::new(agent_bin)
        .args(["run", "--help"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).contains("--reset"))
        .unwrap_or(false)
}

fn check_interrupt() -> anyhow::Result<()> {
    if interrupt::requested() {
        bail!("interrupted");
    }
    Ok(())
}

/// Everything the sections share.
struct Tour<'t> {
    topo: &'t Topology,
    members: [Member<'t>; 5],
    backends: Backends,
    /// `None` only while section 5 restarts it.
    agent: Option<Agent>,
    agent_bin: PathBuf,
    config: AgentConfig,
    xdp_mode: String,
    api: Api,
    vip: SocketAddr,
    probe: TcpProbe,
    ports: SourcePorts,
    connections: usize,
    problems: Vec<String>,
}

impl Tour<'_> {
    fn member(&self, name: &str) -> Member<'_> {
        *self
            .members
            .iter()
            .find(|m| m.name == name)
            .expect("a member of the demo")
    }

    fn agent(&self) -> &Agent {
        self.agent.as_ref().expect("the agent runs")
    }

    fn describe(&self, view: &ServiceView) -> String {
        view.describe(|a| redundancy::name_of(&self.members, a))
    }

    /// Notes an unexpected result; the tour goes on.
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let what = what();
            println!("  !! unexpected: {what}");
            self.problems.push(what);
        }
    }

    fn wait(
        &self,
        what: &str,
        cond: impl Fn(&ServiceView) -> bool,
    ) -> anyhow::Result<(ServiceView, Duration)> {
        Ok(self.api.wait_service("web", what, VERDICT_WAIT, cond)?)
    }

    /// `count` new connections; prints their spread and checks it against `expected`
    /// (member names, shares by weight).
    fn traffic(&mut self, count: usize, expected: &[&str]) -> anyhow::Result<Tally> {
        let client = self.topo.client();
        let tally = clients::tcp_names(
            &client.ns,
            client.ipv4.into(),
            self.ports.take(count),
            self.vip,
            count,
            DEADLINE,
        )?;
        check_interrupt()?;
        let want: Vec<(&str, u32)> = self
            .members
            .iter()
            .filter(|m| expected.contains(&m.name))
            .map(|m| (m.name, m.weight))
            .collect();
        println!("{}", tally.table(&want));
        if let Err(problems) = tally.check_shares(&want, SHARE_TOLERANCE) {
            // The table was printed just above; keep the verdicts only.
            let verdicts: Vec<&str> = problems
                .lines()
                .take_while(|l| !l.trim_start().starts_with("backend"))
                .collect();
            self.check(false, || {
                format!(
                    "connections should go to {expected:?} by weight (±{:.0} %): {}",
                    100.0 * SHARE_TOLERANCE,
                    verdicts.join("; ")
                )
            });
        }
        Ok(tally)
    }

    fn stream(&mut self) -> Stream {
        let client = self.topo.client();
        Stream::start(
            &client.ns,
            client.ipv4.into(),
            self.ports.take(STREAM_PORTS),
            STREAM_PORTS,
            self.vip,
            PACE,
            STREAM_CONNECT,
            STREAM_LIMIT,
        )
    }

    fn pause(&self, d: Duration) -> anyhow::Result<()> {
        let until = Instant::now() + d;
        while Instant::now() < until {
            check_interrupt()?;
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn distribution(&mut self) -> anyhow::Result<()> {
        println!("\n== 1. Distribution over the primaries (weights 1:1:2) ==");
        let (view, _) = self.wait("every server up", |v| {
            v.servers.iter().all(|s| s.state == "up")
        })?;
        print!("{}", self.describe(&view));
        println!(
            "  {} new TCP connections from the client ({}) to {}:",
            self.connections,
            self.topo.client().ipv4,
            self.vip
        );
        self.traffic(self.connections, &["b1", "b2", "b3"])?;
        Ok(())
    }

    fn failure(&mut self) -> anyhow::Result<()> {
        println!("\n== 2. A backend fails ==");
        let b3 = self.member("b3").addr();
        let log_from = self.agent().process().cursor();
        let stream = self.stream();
        self.pause(Duration::from_millis(300))?;
        self.backends.kill("b3")?;
        let stopped = Instant::now();
        let waited = self.wait("b3 out of the table", |v| {
            v.server(b3).is_some_and(|s| !s.active)
        });
        self.pause(Duration::from_millis(300))?;
        let attempts = stream.finish()?;
        let (_, out_after) = waited?;
        println!(
            "  b3's server stopped; the agent took b3 out of traffic {out_after:.0?} later \
             (bound for a server that stops answering: fails × (interval + timeout) = {:?}; \
             a refused port fails at the next probe)",
            self.probe.detection_bound()
        );
        if let Ok(line) = self.agent().process().wait_for_line(
            log_from,
            &format!("server=\"{b3}\""),
            Duration::ZERO,
        ) {
            let from = line.find("transition").unwrap_or(0);
            println!("  agent log: {}", &line[from..]);
        }
        let during: Vec<&Attempt> = attempts.iter().filter(|a| a.at >= stopped).collect();
        let failed: Vec<&Attempt> = during
            .iter()
            .copied()
            .filter(|a| a.result.is_err())
            .collect();
        let refused = failed
            .iter()
            .filter(|a| a.result.as_ref().is_err_and(|e| e.contains("refused")))
            .count();
        let other = failed.len() - refused;
        let last_failed = failed.last().map(|a| a.at - stopped);
        println!(
            "  a client opening a connection every {PACE:?}: {} connections from the stop on, \
             {refused} refused by b3's host before the agent acted{}{}",
            during.len(),
            if other > 0 {
                format!(", {other} failed otherwise")
            } else {
                String::new()
            },
            last_failed
                .map(|d| format!(" (the last {d:.0?} after the stop)"))
                .unwrap_or_default()
        );
        for a in failed
            .iter()
            .filter(|a| a.result.as_ref().is_err_and(|e| !e.contains("refused")))
        {
            println!("    {}", a.result.as_ref().unwrap_err());
        }
        let out_at = stopped + out_after;
        let late = failed.iter().filter(|a| a.at > out_at).count();
        self.check(late == 0, || {
            format!("{late} connections failed after the agent had taken b3 out")
        });
        Ok(())
    }

    fn spare(&mut self) -> anyhow::Result<()> {
        println!("\n== 3. A spare takes over ==");
        let (b3, b4) = (self.member("b3").addr(), self.member("b4").addr());
        let (view, _) = self.wait("spare b4 running", |v| {
            v.server(b4)
                .is_some_and(|s| s.spare.as_deref() == Some("running") && s.active)
        })?;
        print!("{}", self.describe(&view));
        println!(
            "  active_weight {} < main_weight {}: the fewest spares covering the missing \
             weight {} run, largest first: b4 (weight 2)",
            view.active_weight,
            view.main_weight,
            view.main_weight - view.active_weight
        );
        self.traffic(self.connections, &["b1", "b2", "b4"])?;
        let client = self.topo.client();
        let mut pinned = redundancy::echo_on(&client.ns, client.ipv4.into(), self.vip, "b4", 40)
            .map_err(anyhow::Error::msg)?;
        let from = pinned
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        println!("  a long-lived connection from {from} lands on b4 while it runs");

        self.backends.restart("b3")?;
        let (view, took) = self.wait("b3 back and b4 idle", |v| {
            v.spare_num == 0 && v.server(b3).is_some_and(|s| s.active)
        })?;
        println!(
            "  b3's server is back: b3 in traffic and b4 idle again {took:.0?} later \
             (recovery bound passes × interval = {:?})",
            self.probe.recovery_bound()
        );
        print!("{}", self.describe(&view));
        self.traffic(self.connections, &["b1", "b2", "b3"])?;
        let echo = pinned.echo("still there?");
        println!(
            "  the connection pinned to retired b4: {}",
            match &echo {
                Ok(line) => format!("echoes {line:?}"),
                Err(e) => format!("FAILED: {e}"),
            }
        );
        self.check(echo.is_ok(), || {
            "a flow pinned to a retired spare should keep working".into()
        });
        Ok(())
    }

    fn backup_level(&mut self) -> anyhow::Result<()> {
        println!("\n== 4. A backup level takes over ==");
        for n in ["b1", "b2", "b3", "b4"] {
            self.backends.kill(n)?;
        }
        let (view, took) = self.wait("backup level 1 active", |v| v.active_backup_level == 1)?;
        println!(
            "  the servers of b1, b2, b3 and spare b4 stopped: the primary group has no usable \
             server; backup level 1 active {took:.0?} later"
        );
        print!("{}", self.describe(&view));
        self.traffic(self.connections / 3, &["b5"])?;

        for n in ["b1", "b2", "b3", "b4"] {
            self.backends.restart(n)?;
        }
        let (view, took) = self.wait("the primary group active again", |v| {
            v.active_backup_level == 0
                && v.servers
                    .iter()
                    .filter(|s| s.backup == 0 && s.spare.is_none())
                    .all(|s| s.active)
        })?;
        println!(
            "  servers back: the primaries take the traffic again {took:.0?} later \
             (default backup_switch: every new flow tries the primary group first)"
        );
        print!("{}", self.describe(&view));
        self.traffic(self.connections, &["b1", "b2", "b3"])?;
        Ok(())
    }

    fn restart(&mut self) -> anyhow::Result<()> {
        println!("\n== 5. Agent restart under traffic ==");
        let client = self.topo.client();
        let mut pinned = EchoConn::connect(&client.ns, client.ipv4.into(), self.vip)?
            .context("a long-lived connection before the restart")?;
        let kept = pinned.backend().to_owned();
        let stream = self.stream();
        self.pause(Duration::from_millis(300))?;

        let old = self.agent.take().expect("the agent runs until the end");
        let status = old.stop(Duration::from_secs(10))?;
        let down = Instant::now();
        println!(
            "  SIGTERM: lb-agent exited ({status}); the XDP program stays attached with its \
             maps and keeps forwarding"
        );
        self.pause(Duration::from_millis(300))?;
        let echo_down = pinned.echo("while no agent runs");
        let agent = Agent::start(
            self.topo,
            &self.agent_bin,
            &self.config,
            Some(&self.xdp_mode),
            START_TIMEOUT,
        )
        .context("starting lb-agent again")?;
        let up = Instant::now();
        let adopted = agent
            .process()
            .lines()
            .into_iter()
            .find(|l| l.contains("adopted the previous state"));
        self.agent = Some(agent);
        self.pause(Duration::from_millis(300))?;
        let attempts = stream.finish()?;
        let echo_up = pinned.echo("after the restart");

        println!(
            "  {:.1?} without an agent, then `lb-agent run` again{}",
            up - down,
            adopted
                .map(|l| format!(": {}", &l[l.find("adopted").unwrap_or(0)..]))
                .unwrap_or_default()
        );
        let failed: Vec<&Attempt> = attempts.iter().filter(|a| a.result.is_err()).collect();
        let while_down = attempts
            .iter()
            .filter(|a| a.at >= down && a.at < up)
            .count();
        println!(
            "  a client opening a connection every {PACE:?}: {} connections across the \
             restart ({while_down} while no agent ran), {} failed",
            attempts.len(),
            failed.len()
        );
        for a in failed.iter().take(3) {
            println!("    {}", a.result.as_ref().unwrap_err());
        }
        println!(
            "  the long-lived connection to {kept}: {}",
            match (&echo_down, &echo_up) {
                (Ok(_), Ok(line)) => format!("echoed while no agent ran and after: {line:?}"),
                (Err(e), _) | (_, Err(e)) => format!("FAILED: {e}"),
            }
        );
        let n = failed.len();
        self.check(n == 0, || {
            format!("{n} new connections failed across the agent restart")
        });
        self.check(echo_down.is_ok() && echo_up.is_ok(), || {
            "the long-lived connection should survive the agent restart".into()
        });
        self.check(while_down > 0, || {
            "the stream should have run while no agent did".into()
        });
        Ok(())
    }

    /// Stops the agent, detaches its program and removes its pins (`lb-agent detach`),
    /// and reports.
    fn finish(mut self) -> anyhow::Result<Vec<String>> {
        if let Ok(text) = self.api.metrics() {
            // `lb_packets_{forwarded,passed,dropped}_total{reason="…"} N`, the non-zero ones.
            let counters: Vec<String> = text
                .lines()
                .filter_map(|l| l.strip_prefix("lb_packets_"))
                .filter_map(|l| l.split_once("_total{reason=\""))
                .filter_map(|(outcome, rest)| {
                    let (reason, value) = rest.split_once("\"} ")?;
                    (value != "0").then(|| format!("{outcome} {reason} {value}"))
                })
                .collect();
            println!("\nlb-demo: packets by outcome: {}", counters.join(", "));
        }
        if let Some(agent) = self.agent.take() {
            let status = agent.stop(Duration::from_secs(10))?;
            if !status.success() {
                println!("lb-demo: lb-agent exited with {status}");
            }
        }
        let config = self.topo.dir().join("lb.toml");
        let config = config.display().to_string();
        match api::cli(
            &self.topo.lb().ns,
            &self.agent_bin,
            &["detach", "--config", &config],
            Duration::from_secs(20),
        ) {
            Ok(_) => {
                println!("\nlb-demo: `lb-agent detach`: XDP program detached, pins removed")
            }
            Err(err) => println!(
                "\nlb-demo: lb-agent detach failed ({err}); removing the namespaces anyway"
            ),
        }
        Ok(self.problems)
    }
}
