//! `cargo xtask bench` (probe scale): the agent's CPU share and memory while it probes
//! thousands of TCP targets at a 1 s interval (issue: 10,000 targets, under half a core
//! and under 200 MB). Results: stdout and `target/bench/probes.md`.
//!
//! Method: each scenario runs in its own process (so peak RSS is its own), which builds
//! the real [`Agent`] over [`BpfDataplane::load`] (real maps, nothing attached) or
//! [`MemoryDataplane`], with [`NetProber`] and [`StaticNeighbors`], and drives it as
//! `lb-agent run` does (one select loop over reports, passive events, deadlines, the
//! stats tick and MAC retries, on a 2-worker runtime) — or with a batched variant of that
//! loop ([`Loop::Batched`]), or runs the probe scheduler alone ([`Kind::ProbesOnly`],
//! the floor). The targets are a child process (this binary with `--serve N`) that
//! listens on N ports and accepts and closes every connection, so their CPU is not in
//! the agent's figures. The targets are either on loopback (`--net loopback`: the
//! agent's process is then also billed for the targets' kernel side of every
//! connection) or in a namespace of their own behind a veth pair whose receive side
//! runs in a NAPI thread (`--net veth`, as backends on other hosts; see
//! [`target_net`]). Over a measured window: CPU = `getrusage(RUSAGE_SELF)`
//! user + sys over wall time; peak RSS = `VmHWM` after resetting it through
//! `/proc/self/clear_refs` at the window's start; probes completed = reports received.
//! A second window closes every 10th target (the child drops those listeners) and counts
//! failures, transitions and detection time.
//!
//! Needs root (BPF, file-descriptor limits); run it with
//! `cargo run --release -p lb-tests --bin lb-probe-bench -- --out target/bench`.

use std::{
    collections::{BTreeMap, HashSet},
    fmt::Write as _,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, bail};
use lb_agent::{
    agent::{Agent, Environment, Neighbors, StaticNeighbors},
    config::{ProbeConfig, ProbeKind},
    dataplane::{BpfDataplane, Dataplane, EventStream, memory::MemoryDataplane},
    probe::{NetProber, ProbeReport, Prober},
    publish::PublishError,
    status::Histogram,
};
use lb_common::MAX_BACKENDS;
use target_net::{BASE_PORT, End, Net, PORTS_PER_IP, TargetNet, target_addr, target_index};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt},
    process::{Child, ChildStdin, ChildStdout, Command},
    time::Instant,
};

/// Services the targets are split over.
const SERVICES: usize = 3;
/// The issue's scale.
const ISSUE_TARGETS: usize = 10_000;
/// Every n-th target is closed in the failure window.
const CLOSE_EVERY: usize = 10;
/// File descriptors wanted by both processes (N listeners, or up to N probe sockets).
const NOFILE: u64 = 65_536;
/// Descriptors needed beyond one per target.
const FD_SLACK: usize = 1_024;
/// The issue's targets.
const MAX_CORES: f64 = 0.5;
const MAX_RSS_MB: f64 = 200.0;
/// As in `lb-agent run` (`cli/run.rs`).
const MAC_RETRY: Duration = Duration::from_secs(2);
const STATS_EVERY: Duration = Duration::from_millis(500);
/// Backend MAC handed out by the static neighbour table.
const MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];
/// Prefix of the lines a scenario process reports its figures with.
const RESULT: &str = "result\t";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Bpf,
    Memory,
    /// No agent: the probe scheduler and `NetProber` alone, reports only counted (the
    /// floor any agent pays for probing).
    ProbesOnly,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Bpf => "bpf",
            Kind::Memory => "memory",
            Kind::ProbesOnly => "probes-only",
        }
    }
}

/// How the agent is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loop {
    /// The first version of `cli/run.rs`: one report per select iteration,
    /// `has_unknown_macs` as the MAC-retry branch's precondition (every iteration).
    Run,
    /// As `cli/run.rs` is now: up to [`BATCH`] queued reports per iteration (one
    /// publish for all), `has_unknown_macs` checked only when the retry timer fires.
    Batched,
}

impl Loop {
    fn name(self) -> &'static str {
        match self {
            Loop::Run => "run",
            Loop::Batched => "batched",
        }
    }
}

/// Reports handled per iteration by [`Loop::Batched`].
const BATCH: usize = 256;

/// One scenario: data plane, number of targets, driving loop.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    kind: Kind,
    targets: usize,
    driver: Loop,
    net: Net,
}

#[derive(Clone, Debug)]
struct Opts {
    out: PathBuf,
    warmup: Duration,
    window: Duration,
    fail_window: Duration,
    /// Run one scenario in this process instead of the default set.
    single: Option<Scenario>,
    /// Print figures as `result` lines for the parent (`--child`).
    child: bool,
}

mod target_net;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve") {
        let n = args.get(1).context("--serve needs a count")?.parse()?;
        let net = match args.get(2..4) {
            Some([flag, net]) if flag == "--net" => Net::parse(net).context(USAGE)?,
            _ => Net::Loopback,
        };
        target_net::select(net)?;
        return serve(n);
    }
    let opts = parse_args(&args)?;
    match opts.single {
        Some(sc) => {
            let figures = scenario(sc, &opts)?;
            if opts.child {
                for (k, v) in &figures {
                    println!("{RESULT}{k}\t{v}");
                }
            } else {
                println!("\n{}", report(&[figures], &opts));
            }
            Ok(())
        }
        None => orchestrate(&opts),
    }
}

const USAGE: &str = "usage: lb-probe-bench [--out DIR] [--warmup S] [--window S] [--fail-window S] \
                     [--dataplane bpf|memory|probes-only --targets N --loop run|batched --net loopback|veth]";

fn parse_args(args: &[String]) -> anyhow::Result<Opts> {
    let mut opts = Opts {
        out: PathBuf::from("target/bench"),
        warmup: Duration::from_secs(5),
        window: Duration::from_secs(20),
        fail_window: Duration::from_secs(10),
        single: None,
        child: false,
    };
    let mut kind = None;
    let mut targets = None;
    let mut driver = None;
    let mut net = None;
    let mut it = args.iter();
    let secs = |v: Option<&String>, what: &str| -> anyhow::Result<Duration> {
        let v = v.with_context(|| format!("{what} needs seconds; {USAGE}"))?;
        Ok(Duration::from_secs_f64(v.parse().with_context(|| {
            format!("{what} {v}: not a number of seconds")
        })?))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => opts.out = PathBuf::from(it.next().context(USAGE)?),
            "--warmup" => opts.warmup = secs(it.next(), a)?,
            "--window" => opts.window = secs(it.next(), a)?,
            "--fail-window" => opts.fail_window = secs(it.next(), a)?,
            "--dataplane" => {
                kind = Some(match it.next().map(String::as_str) {
                    Some("bpf") => Kind::Bpf,
                    Some("memory") => Kind::Memory,
                    Some("probes-only") => Kind::ProbesOnly,
                    _ => bail!("--dataplane takes bpf, memory or probes-only; {USAGE}"),
                })
            }
            "--targets" => targets = Some(it.next().context(USAGE)?.parse::<usize>()?),
            "--loop" => {
                driver = Some(match it.next().map(String::as_str) {
                    Some("run") => Loop::Run,
                    Some("batched") => Loop::Batched,
                    _ => bail!("--loop takes run or batched; {USAGE}"),
                })
            }
            "--net" => {
                let v = it.next().context(USAGE)?;
                net = Some(Net::parse(v).context("--net takes loopback or veth")?);
            }
            "--child" => opts.child = true,
            other => bail!("unknown argument {other}; {USAGE}"),
        }
    }
    opts.single = match (kind, targets, driver, net) {
        (None, None, None, None) => None,
        (k, t, d, n) => Some(Scenario {
            kind: k.unwrap_or(Kind::Bpf),
            targets: t.unwrap_or(ISSUE_TARGETS),
            driver: d.unwrap_or(Loop::Run),
            net: n.unwrap_or(Net::Veth),
        }),
    };
    Ok(opts)
}

fn closed(i: usize) -> bool {
    i.is_multiple_of(CLOSE_EVERY)
}

/// Raises the soft RLIMIT_NOFILE as far as [`NOFILE`] (the hard limit too, when allowed:
/// CAP_SYS_RESOURCE); fails if fewer than `need` descriptors are available.
fn raise_nofile(need: usize) -> anyhow::Result<()> {
    // SAFETY: getrlimit/setrlimit read or fill the struct we pass.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let want = libc::rlimit {
        rlim_cur: NOFILE,
        rlim_max: NOFILE.max(lim.rlim_max),
    };
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
        lim.rlim_cur = NOFILE.min(lim.rlim_max);
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    if (lim.rlim_cur as usize) < need {
        bail!(
            "RLIMIT_NOFILE is {} (hard {}), {need} needed: raise the hard limit (ulimit -Hn)",
            lim.rlim_cur,
            lim.rlim_max
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The targets (child process)

/// `--serve N`: listen on N targets, accept and close every connection; on stdin,
/// `close K` drops the listeners of every K-th target and answers `closed <count>`.
/// Exits when stdin closes.
fn serve(n: usize) -> anyhow::Result<()> {
    raise_nofile(n + FD_SLACK)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let addr = target_addr(i);
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("target {i}: binding {addr}"))?;
            tasks.push(Some(tokio::spawn(accept_loop(listener))));
        }
        println!("ready {n}");
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Some(line) = lines.next_line().await? {
            let words: Vec<&str> = line.split_whitespace().collect();
            let ["close", every] = words.as_slice() else {
                bail!("unknown command {line:?}");
            };
            let every: usize = every.parse()?;
            let mut count = 0;
            for (i, task) in tasks.iter_mut().enumerate() {
                if i.is_multiple_of(every)
                    && let Some(t) = task.take()
                {
                    t.abort();
                    // Dropped (listener closed) once the cancelled task is joined.
                    let _ = t.await;
                    count += 1;
                }
            }
            println!("closed {count}");
        }
        Ok(())
    })
}

async fn accept_loop(listener: tokio::net::TcpListener) {
    loop {
        match listener.accept().await {
            // Closed at once with a FIN (a reset could reach the prober before its
            // connect is seen complete, and fail it).
            Ok((s, _)) => drop(s),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

struct Targets {
    child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<tokio::io::BufReader<ChildStdout>>,
}

impl Targets {
    /// Starts the target process for `n` targets: in `net`'s namespace when there is one.
    async fn start(n: usize, net: Option<&TargetNet>) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut cmd = match net {
            Some(net) => {
                let mut cmd = Command::new("ip");
                cmd.args(net.exec_prefix()).arg(exe);
                cmd
            }
            None => Command::new(exe),
        };
        let net = if net.is_some() {
            Net::Veth
        } else {
            Net::Loopback
        };
        let mut child = cmd
            .args(["--serve", &n.to_string(), "--net", net.name()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the target process")?;
        let stdin = child.stdin.take().context("target stdin")?;
        let mut stdout =
            tokio::io::BufReader::new(child.stdout.take().context("target stdout")?).lines();
        let ready = tokio::time::timeout(Duration::from_secs(120), stdout.next_line())
            .await
            .context("the target process did not get ready within 120 s")??;
        if ready.as_deref() != Some(&format!("ready {n}")) {
            bail!("the target process failed to start (said {ready:?})");
        }
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// Closes every `every`-th target; returns how many were closed.
    async fn close(&mut self, every: usize) -> anyhow::Result<usize> {
        self.stdin
            .write_all(format!("close {every}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        let line = self.stdout.next_line().await?.unwrap_or_default();
        line.strip_prefix("closed ")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("the target process answered {line:?}"))
    }

    /// Ends the target process (it exits when its stdin closes) and waits for it, so the
    /// next scenario can bind the same ports.
    async fn stop(mut self) {
        drop(self.stdin);
        let waited = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        if waited.is_err() {
            let _ = self.child.kill().await;
        }
    }

    /// CPU time the targets have used so far: their process, and with `veth` their
    /// NAPI thread (their kernel's receive work).
    fn cpu(&self) -> Duration {
        self.child.id().map_or(Duration::ZERO, proc_cpu)
            + target_net::napi_cpu(End::Targets, proc_cpu)
    }
}

// ---------------------------------------------------------------------------------------
// Measurement helpers

/// user + sys of `pid` from `/proc/PID/stat`.
fn proc_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64(f.iter().sum::<u64>() as f64 / hz)
}

/// This process's user and sys CPU time.
fn rusage() -> (Duration, Duration) {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// A field of `/proc/self/status` in MB (`VmHWM`, `VmRSS`).
fn status_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Resets `VmHWM` to the current RSS (Linux ≥ 4.0).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Busy and total jiffies of the whole machine (`/proc/stat`).
fn machine_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn machine_cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// Everything counted at one instant; windows are differences of two.
#[derive(Clone, Copy)]
struct Mark {
    wall: std::time::Instant,
    user: Duration,
    sys: Duration,
    target_cpu: Duration,
    /// The agent host's receive work (`veth` only: its NAPI thread).
    agent_napi_cpu: Duration,
    machine: (u64, u64),
    tally: Tally,
}

impl Mark {
    fn now(targets: &Targets, tally: Tally) -> Self {
        let (user, sys) = rusage();
        Self {
            wall: std::time::Instant::now(),
            user,
            sys,
            target_cpu: targets.cpu(),
            agent_napi_cpu: target_net::napi_cpu(End::Agent, proc_cpu),
            machine: machine_jiffies(),
            tally,
        }
    }
}

/// Report counters.
#[derive(Clone, Copy, Default)]
struct Tally {
    ok: u64,
    failed: u64,
    /// Failures of targets that were listening.
    open_failed: u64,
    publish_errors: u64,
    /// Iterations of the select loop.
    iterations: u64,
}

/// Durations of one kind of call.
#[derive(Clone, Copy, Default)]
struct Stat {
    n: u64,
    sum: Duration,
    max: Duration,
}

impl Stat {
    fn add(&mut self, d: Duration) {
        self.n += 1;
        self.sum += d;
        self.max = self.max.max(d);
    }

    fn show(&self) -> String {
        if self.n == 0 {
            return "-".into();
        }
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        format!(
            "{:.0} µs (max {:.0} µs, ×{})",
            us(self.sum) / self.n as f64,
            us(self.max),
            self.n
        )
    }
}

/// Where the agent loop's time goes, per call, over one window.
#[derive(Clone, Copy, Default)]
struct Costs {
    /// `next_deadline` and `has_unknown_macs`: `run` calls both on every iteration;
    /// timed once per stats tick.
    next_deadline: Stat,
    has_unknown_macs: Stat,
    poll_stats: Stat,
    /// The full snapshot rebuild of the stats tick.
    publish_snapshot: Stat,
    /// `flush_snapshot` calls that rebuilt the snapshot (after a verdict changed state).
    flush_rebuild: Stat,
    /// `on_probe_report` calls that recomputed membership (published, or failed to).
    recompute: Stat,
}

impl Costs {
    fn figures(&self, f: &mut Figures, prefix: &str) {
        for (k, s) in [
            ("next_deadline", self.next_deadline),
            ("has_unknown_macs", self.has_unknown_macs),
            ("poll_stats", self.poll_stats),
            ("publish_snapshot", self.publish_snapshot),
            ("flush_rebuild", self.flush_rebuild),
            ("recompute", self.recompute),
        ] {
            f.insert(format!("{prefix}cost_{k}"), s.show());
        }
    }
}

type Figures = BTreeMap<String, String>;

/// Figures of the window between `a` and `b` under `prefix`.
fn window_figures(f: &mut Figures, prefix: &str, a: &Mark, b: &Mark) {
    let wall = (b.wall - a.wall).as_secs_f64();
    let user = (b.user - a.user).as_secs_f64();
    let sys = (b.sys - a.sys).as_secs_f64();
    let (busy, total) = (b.machine.0 - a.machine.0, b.machine.1 - a.machine.1);
    let mut put = |k: &str, v: String| {
        f.insert(format!("{prefix}{k}"), v);
    };
    put("wall_s", format!("{wall:.1}"));
    put("cores", format!("{:.3}", (user + sys) / wall));
    put("user_cores", format!("{:.3}", user / wall));
    put("sys_cores", format!("{:.3}", sys / wall));
    put(
        "target_cores",
        format!("{:.3}", (b.target_cpu - a.target_cpu).as_secs_f64() / wall),
    );
    put(
        "agent_napi_cores",
        format!(
            "{:.3}",
            (b.agent_napi_cpu - a.agent_napi_cpu).as_secs_f64() / wall
        ),
    );
    put(
        "machine_busy",
        format!("{:.2}", busy as f64 / total.max(1) as f64 * machine_cores()),
    );
    let probes = (b.tally.ok + b.tally.failed) - (a.tally.ok + a.tally.failed);
    put(
        "iterations_per_s",
        format!(
            "{:.0}",
            (b.tally.iterations - a.tally.iterations) as f64 / wall
        ),
    );
    put("probes_per_s", format!("{:.0}", probes as f64 / wall));
    put("failed", (b.tally.failed - a.tally.failed).to_string());
    put(
        "failed_per_s",
        format!("{:.0}", (b.tally.failed - a.tally.failed) as f64 / wall),
    );
    put(
        "open_failed",
        (b.tally.open_failed - a.tally.open_failed).to_string(),
    );
    put(
        "publish_errors",
        (b.tally.publish_errors - a.tally.publish_errors).to_string(),
    );
    put("peak_rss_mb", format!("{:.1}", status_mb("VmHWM")));
    put("end_rss_mb", format!("{:.1}", status_mb("VmRSS")));
    put(
        "rss_split",
        format!(
            "anon {:.1} MB, file {:.1} MB, shmem {:.1} MB",
            status_mb("RssAnon"),
            status_mb("RssFile"),
            status_mb("RssShmem")
        ),
    );
    put("load", loadavg());
}

// ---------------------------------------------------------------------------------------
// One scenario (in its own process)

fn scenario(sc: Scenario, opts: &Opts) -> anyhow::Result<Figures> {
    let Scenario {
        kind,
        targets,
        driver,
        net,
    } = sc;
    raise_nofile(targets + FD_SLACK)?;
    target_net::select(net)?;
    // Namespaces first, while this is the only thread: the runtime's threads inherit.
    let target_net = match net {
        Net::Veth => {
            let t = TargetNet::create(targets).context("making the target namespaces")?;
            t.enter_agent()?;
            Some(t)
        }
        Net::Loopback => None,
    };
    // As `lb-agent run` builds it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        println!(
            "== {} data plane, {targets} tcp targets over {SERVICES} services, {} loop",
            kind.name(),
            driver.name()
        );
        let started = Instant::now();
        let mut children = Targets::start(targets, target_net.as_ref()).await?;
        println!(
            "targets listening ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        let text = config_text(targets);
        let cfg = lb_agent::config::parse(&text, Path::new("probe-bench.toml"))?;
        let neighbors = Arc::new(StaticNeighbors {
            default: Some(MAC),
            ..StaticNeighbors::default()
        });
        let run = Run {
            cfg: &cfg,
            targets: &mut children,
            opts,
            driver,
        };
        let mut f = match kind {
            Kind::Bpf => {
                let mut dp =
                    BpfDataplane::load().context("loading the balancer (are you root?)")?;
                let events = dp.take_events().transpose()?;
                let (agent, handles) =
                    Agent::new(dp, Arc::new(NetProber), neighbors, Environment::default());
                drive(agent, handles, events, run, |dp: &BpfDataplane| {
                    dp.published_state().map_or(0, |s| s.backends.len())
                })
                .await?
            }
            Kind::Memory => {
                let (agent, handles) = Agent::new(
                    MemoryDataplane::default(),
                    Arc::new(NetProber),
                    neighbors,
                    Environment::default(),
                );
                drive(agent, handles, None, run, |dp: &MemoryDataplane| {
                    dp.backends.len()
                })
                .await?
            }
            Kind::ProbesOnly => probes_only(run).await?,
        };
        children.stop().await;
        f.insert("dataplane".into(), kind.name().into());
        let driver = if kind == Kind::ProbesOnly {
            "-"
        } else {
            driver.name()
        };
        f.insert("loop".into(), driver.into());
        f.insert("targets".into(), targets.to_string());
        f.insert("net".into(), net.name().into());
        f.insert("services".into(), SERVICES.to_string());
        let probe = ProbeConfig::new("p", ProbeKind::Tcp);
        let fut = lb_agent::probe::execute(&probe, target_addr(0));
        f.insert(
            "probe_future_bytes".into(),
            std::mem::size_of_val(&fut).to_string(),
        );
        Ok(f)
    })
}

/// `targets` servers split over [`SERVICES`] nat services, one tcp probe each.
fn config_text(targets: usize) -> String {
    let per = targets.div_ceil(SERVICES);
    let mut text = String::new();
    for s in 0..SERVICES {
        let range = s * per..((s + 1) * per).min(targets);
        if range.is_empty() {
            continue;
        }
        let _ = write!(
            text,
            "[[service]]\nname = \"svc{s}\"\nvip = \"10.9.9.{}:80\"\nforwarding = \"nat\"\n\
             snat_ip = \"10.9.9.2\"\n\
             [[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\ntimeout = \"500ms\"\n",
            100 + s
        );
        for i in range {
            let _ = write!(
                text,
                "[[service.server]]\naddress = \"{}\"\n",
                target_addr(i)
            );
        }
    }
    text
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Warmup,
    Window,
    Failing,
}

/// What [`drive`] runs against.
struct Run<'a> {
    cfg: &'a lb_agent::config::Config,
    targets: &'a mut Targets,
    opts: &'a Opts,
    driver: Loop,
}

/// Applies the config and runs the loop of `lb-agent run` through the phases.
async fn drive<D, P, N>(
    mut agent: Agent<D, P, N>,
    mut handles: lb_agent::agent::Handles,
    mut events: Option<EventStream>,
    run: Run<'_>,
    published: impl Fn(&D) -> usize,
) -> anyhow::Result<Figures>
where
    D: Dataplane,
    P: Prober,
    N: Neighbors,
{
    let Run {
        cfg,
        targets,
        opts,
        driver,
    } = run;
    let batched = driver == Loop::Batched;
    let mut f = Figures::new();
    f.insert(
        "rss_before_apply_mb".into(),
        format!("{:.1}", status_mb("VmRSS")),
    );
    let t = std::time::Instant::now();
    let applied = agent.apply_config(cfg).await;
    f.insert(
        "rss_after_apply_mb".into(),
        format!("{:.1}", status_mb("VmRSS")),
    );
    f.insert(
        "setup_s".into(),
        format!("{:.2}", t.elapsed().as_secs_f64()),
    );
    match &applied {
        Ok(()) => f.insert("setup_error".into(), "-".into()),
        // The benchmark goes on: probes and health run for every server either way.
        Err(e @ PublishError::TooManyBackends) => f.insert("setup_error".into(), e.to_string()),
        Err(e) => bail!("publishing the configured services: {e}"),
    };
    agent.flush_snapshot();
    let published = published(agent.dataplane());
    f.insert("published".into(), published.to_string());
    println!(
        "agent configured in {:.2} s: {published} backends published{}",
        t.elapsed().as_secs_f64(),
        match &applied {
            Ok(()) => String::new(),
            Err(e) => format!(" (apply_config: {e})"),
        }
    );

    let mut tally = Tally::default();
    let mut details: BTreeMap<String, u64> = BTreeMap::new();
    let mut phase = Phase::Warmup;
    let mut marks: Vec<Mark> = Vec::new();
    let mut closed_count = 0usize;
    let mut failing_since = Instant::now();
    let mut seen_failing: HashSet<SocketAddr> = HashSet::new();
    let mut detected: Option<Duration> = None;
    let mut transitions_before = 0;
    let mut propagation_before = Histogram::default();
    let phase_timer = tokio::time::sleep(opts.warmup);
    tokio::pin!(phase_timer);

    let mut mac_retry = tokio::time::interval(MAC_RETRY);
    let mut stats = tokio::time::interval(STATS_EVERY);
    let mut batch = Vec::with_capacity(BATCH);
    let mut costs = Costs::default();
    loop {
        let deadline = agent.next_deadline();
        let result = tokio::select! {
            n = next_reports(&mut handles.reports, &mut batch, batched) => {
                if n == 0 {
                    bail!("the probe report channel closed");
                }
                for report in &batch {
                    tally.note(report, phase, &mut details, |r| {
                        if phase == Phase::Failing && closed(target_index(r.server.addr)) {
                            seen_failing.insert(r.server.addr);
                            if seen_failing.len() == closed_count && detected.is_none() {
                                detected = Some(failing_since.elapsed());
                            }
                        }
                    });
                }
                // As `lb-agent run` does: a batch of reports, one recompute and publish.
                let published = agent.propagation().count;
                let t = std::time::Instant::now();
                let result = if batched {
                    agent.on_probe_reports(batch.drain(..))
                } else {
                    let mut last = Ok(());
                    for report in batch.drain(..) {
                        last = last.and(agent.on_probe_report(report));
                    }
                    last
                };
                let spent = t.elapsed();
                if result.is_err() || agent.propagation().count != published {
                    costs.recompute.add(spent);
                }
                if let Err(err) = result {
                    tally.count_error(&err, &mut details);
                }
                Ok(())
            }
            batch = next_events(&mut events) => match batch {
                Ok(batch) => agent.on_passive_events(&batch),
                Err(err) => {
                    println!("event ring buffer failed: {err}");
                    events = None;
                    Ok(())
                }
            },
            _ = sleep_until(deadline) => agent.on_tick(Instant::now()),
            _ = stats.tick() => {
                let t = std::time::Instant::now();
                agent.poll_stats();
                costs.poll_stats.add(t.elapsed());
                let t = std::time::Instant::now();
                agent.publish_snapshot();
                costs.publish_snapshot.add(t.elapsed());
                handles.snapshot.borrow_and_update();
                let t = std::time::Instant::now();
                std::hint::black_box(agent.next_deadline());
                costs.next_deadline.add(t.elapsed());
                let t = std::time::Instant::now();
                std::hint::black_box(agent.has_unknown_macs());
                costs.has_unknown_macs.add(t.elapsed());
                Ok(())
            }
            // `run`: as cli/run.rs, the precondition is evaluated on every iteration.
            _ = mac_retry.tick(), if batched || agent.has_unknown_macs() => {
                if !batched || agent.has_unknown_macs() {
                    agent.retry_macs().await
                } else {
                    Ok(())
                }
            }
            _ = &mut phase_timer => {
                match phase {
                    Phase::Warmup => {
                        f.insert("setup_peak_rss_mb".into(), format!("{:.1}", status_mb("VmHWM")));
                        reset_peak_rss();
                        costs = Costs::default();
                        marks.push(Mark::now(targets, tally));
                        phase = Phase::Window;
                        phase_timer.as_mut().reset(Instant::now() + opts.window);
                        println!("warm-up done; measuring {:?}", opts.window);
                    }
                    Phase::Window => {
                        marks.push(Mark::now(targets, tally));
                        window_figures(&mut f, "", &marks[0], &marks[1]);
                        costs.figures(&mut f, "");
                        costs = Costs::default();
                        closed_count = targets.close(CLOSE_EVERY).await?;
                        agent.publish_snapshot();
                        transitions_before = handles.snapshot.borrow().transitions;
                        propagation_before = agent.propagation().clone();
                        failing_since = Instant::now();
                        reset_peak_rss();
                        marks.push(Mark::now(targets, tally));
                        phase = Phase::Failing;
                        phase_timer.as_mut().reset(Instant::now() + opts.fail_window);
                        println!("closed {closed_count} targets; measuring {:?}", opts.fail_window);
                    }
                    Phase::Failing => {
                        marks.push(Mark::now(targets, tally));
                        window_figures(&mut f, "fail_", &marks[2], &marks[3]);
                        costs.figures(&mut f, "fail_");
                        break;
                    }
                }
                Ok(())
            }
        };
        if let Err(err) = result {
            tally.count_error(&err, &mut details);
        }
        let t = std::time::Instant::now();
        agent.flush_snapshot();
        if handles.snapshot.has_changed().unwrap_or(false) {
            costs.flush_rebuild.add(t.elapsed());
            handles.snapshot.borrow_and_update();
        }
        tally.iterations += 1;
    }

    agent.publish_snapshot();
    let snap = handles.snapshot.borrow().clone();
    let states: BTreeMap<String, usize> =
        snap.services
            .iter()
            .flat_map(|s| &s.servers)
            .fold(BTreeMap::new(), |mut m, s| {
                *m.entry(s.state.clone()).or_default() += 1;
                m
            });
    let unhealthy_closed = snap
        .services
        .iter()
        .flat_map(|s| &s.servers)
        .filter(|s| {
            s.state == "unhealthy"
                && s.address
                    .parse()
                    .is_ok_and(|a: SocketAddr| closed(target_index(a)))
        })
        .count();
    f.insert("fail_closed".into(), closed_count.to_string());
    f.insert(
        "fail_detect".into(),
        detected.map_or("not within the window".into(), |d| {
            format!("{:.2} s", d.as_secs_f64())
        }),
    );
    f.insert("fail_unhealthy_closed".into(), unhealthy_closed.to_string());
    f.insert(
        "fail_states".into(),
        states
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    f.insert(
        "fail_transitions".into(),
        (snap.transitions - transitions_before).to_string(),
    );
    let prop = histogram_delta(agent.propagation(), &propagation_before);
    f.insert("fail_publishes".into(), prop.count.to_string());
    f.insert(
        "fail_propagation".into(),
        match (prop.quantile_bound(0.5), prop.quantile_bound(0.99)) {
            (Some(p50), Some(p99)) => format!(
                "mean {:.0} µs, p50 ≤ {:.0} µs, p99 ≤ {:.0} µs",
                prop.sum / prop.count as f64 * 1e6,
                p50 * 1e6,
                p99 * 1e6
            ),
            _ => "-".into(),
        },
    );
    f.insert("failure_details".into(), show_details(&details));
    Ok(f)
}

/// Probes every server of `run.cfg` with the agent's scheduler and prober, and only counts
/// the reports: the same phases and figures as [`drive`], without an agent.
async fn probes_only(run: Run<'_>) -> anyhow::Result<Figures> {
    let Run {
        cfg, targets, opts, ..
    } = run;
    let mut f = Figures::new();
    f.insert(
        "rss_before_apply_mb".into(),
        format!("{:.1}", status_mb("VmRSS")),
    );
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let mut tasks = Vec::new();
    for (i, svc) in cfg.services.iter().enumerate() {
        let probe = Arc::new(svc.probes[0].clone());
        for server in &svc.servers {
            let lb_agent::config::ServerAddress::Socket(addr) = server.address else {
                bail!("bench servers are addresses");
            };
            let key = lb_agent::probe::ServerKey { service: i, addr };
            let signals = Arc::new(lb_agent::probe::SharedSignals::new(true));
            tasks.push(lb_agent::probe::spawn(
                key,
                0,
                probe.clone(),
                signals,
                tx.clone(),
            ));
        }
    }
    f.insert(
        "rss_after_apply_mb".into(),
        format!("{:.1}", status_mb("VmRSS")),
    );
    f.insert("published".into(), "-".into());
    f.insert("setup_s".into(), "-".into());
    f.insert("setup_error".into(), "-".into());
    let mut tally = Tally::default();
    let mut details = BTreeMap::new();
    let mut seen_failing: HashSet<SocketAddr> = HashSet::new();
    let mut detected = None;
    let mut closed_count = 0;
    let mut failing_since = Instant::now();
    let mut marks = Vec::new();
    let mut phase = Phase::Warmup;
    let phase_timer = tokio::time::sleep(opts.warmup);
    tokio::pin!(phase_timer);
    loop {
        tokio::select! {
            Some(report) = rx.recv() => {
                tally.iterations += 1;
                tally.note(&report, phase, &mut details, |r| {
                    if phase == Phase::Failing && closed(target_index(r.server.addr)) {
                        seen_failing.insert(r.server.addr);
                        if seen_failing.len() == closed_count && detected.is_none() {
                            detected = Some(failing_since.elapsed());
                        }
                    }
                });
            }
            _ = &mut phase_timer => match phase {
                Phase::Warmup => {
                    f.insert("setup_peak_rss_mb".into(), format!("{:.1}", status_mb("VmHWM")));
                    reset_peak_rss();
                    marks.push(Mark::now(targets, tally));
                    phase = Phase::Window;
                    phase_timer.as_mut().reset(Instant::now() + opts.window);
                    println!("warm-up done; measuring {:?}", opts.window);
                }
                Phase::Window => {
                    marks.push(Mark::now(targets, tally));
                    window_figures(&mut f, "", &marks[0], &marks[1]);
                    closed_count = targets.close(CLOSE_EVERY).await?;
                    failing_since = Instant::now();
                    reset_peak_rss();
                    marks.push(Mark::now(targets, tally));
                    phase = Phase::Failing;
                    phase_timer.as_mut().reset(Instant::now() + opts.fail_window);
                    println!("closed {closed_count} targets; measuring {:?}", opts.fail_window);
                }
                Phase::Failing => {
                    marks.push(Mark::now(targets, tally));
                    window_figures(&mut f, "fail_", &marks[2], &marks[3]);
                    break;
                }
            },
        }
    }
    drop(tasks);
    f.insert("fail_closed".into(), closed_count.to_string());
    f.insert(
        "fail_detect".into(),
        detected.map_or("not within the window".into(), |d| {
            format!("{:.2} s", d.as_secs_f64())
        }),
    );
    for k in [
        "fail_unhealthy_closed",
        "fail_transitions",
        "fail_publishes",
        "fail_states",
    ] {
        f.insert(k.into(), "-".into());
    }
    f.insert("fail_propagation".into(), "no agent".into());
    f.insert("failure_details".into(), show_details(&details));
    Ok(f)
}

fn show_details(details: &BTreeMap<String, u64>) -> String {
    if details.is_empty() {
        return "-".into();
    }
    details
        .iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The next report (`run`), or every queued report up to [`BATCH`] (`batched`), into
/// `buf`; 0 when the channel is closed.
async fn next_reports(
    rx: &mut tokio::sync::mpsc::Receiver<ProbeReport>,
    buf: &mut Vec<ProbeReport>,
    batched: bool,
) -> usize {
    if batched {
        rx.recv_many(buf, BATCH).await
    } else {
        match rx.recv().await {
            Some(r) => {
                buf.push(r);
                1
            }
            None => 0,
        }
    }
}

impl Tally {
    fn count_error(&mut self, err: &PublishError, details: &mut BTreeMap<String, u64>) {
        self.publish_errors += 1;
        *details.entry(format!("publish error: {err}")).or_default() += 1;
    }

    fn note(
        &mut self,
        r: &ProbeReport,
        phase: Phase,
        details: &mut BTreeMap<String, u64>,
        on_fail: impl FnOnce(&ProbeReport),
    ) {
        if r.outcome.ok {
            self.ok += 1;
            return;
        }
        self.failed += 1;
        let was_closed = phase == Phase::Failing && closed(target_index(r.server.addr));
        if !was_closed {
            self.open_failed += 1;
            *details
                .entry(format!("open target: {}", r.outcome.detail))
                .or_default() += 1;
        }
        on_fail(r);
    }
}

fn histogram_delta(now: &Histogram, before: &Histogram) -> Histogram {
    let mut h = now.clone();
    for (c, b) in h.counts.iter_mut().zip(&before.counts) {
        *c -= b;
    }
    h.sum -= before.sum;
    h.count -= before.count;
    h
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn next_events(
    events: &mut Option<EventStream>,
) -> Result<Vec<lb_common::events::PassiveEvent>, lb_agent::dataplane::DataplaneError> {
    match events {
        Some(stream) => stream.next_batch().await,
        None => std::future::pending().await,
    }
}

// ---------------------------------------------------------------------------------------
// The default set and the report

fn orchestrate(opts: &Opts) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.out)?;
    let largest = ISSUE_TARGETS.min(MAX_BACKENDS as usize - 1);
    let sc = |kind, targets, driver, net| Scenario {
        kind,
        targets,
        driver,
        net,
    };
    // Targets behind veth (as remote backends) first; then on loopback, where the
    // agent also pays for the targets' kernel side, for comparison.
    let runs = [
        sc(Kind::ProbesOnly, ISSUE_TARGETS, Loop::Run, Net::Veth),
        sc(Kind::Bpf, largest, Loop::Batched, Net::Veth),
        sc(Kind::Memory, ISSUE_TARGETS, Loop::Batched, Net::Veth),
        sc(Kind::Bpf, largest, Loop::Run, Net::Veth),
        sc(Kind::ProbesOnly, ISSUE_TARGETS, Loop::Run, Net::Loopback),
        sc(Kind::Bpf, largest, Loop::Batched, Net::Loopback),
    ];
    let mut results = Vec::new();
    for Scenario {
        kind,
        targets,
        driver,
        net,
    } in runs
    {
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(["--child", "--dataplane", kind.name()])
            .args(["--targets", &targets.to_string(), "--loop", driver.name()])
            .args(["--net", net.name()])
            .args(["--warmup", &opts.warmup.as_secs_f64().to_string()])
            .args(["--window", &opts.window.as_secs_f64().to_string()])
            .args(["--fail-window", &opts.fail_window.as_secs_f64().to_string()])
            .stdout(Stdio::piped());
        let mut child = cmd.spawn()?;
        let mut figures = Figures::new();
        let stdout = child.stdout.take().context("scenario stdout")?;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            match line.strip_prefix(RESULT).and_then(|l| l.split_once('\t')) {
                Some((k, v)) => {
                    figures.insert(k.to_string(), v.to_string());
                }
                None => println!("{line}"),
            }
        }
        let status = child.wait()?;
        if !status.success() {
            bail!(
                "scenario {} with {targets} targets failed ({status})",
                kind.name()
            );
        }
        results.push(figures);
    }
    let md = report(&results, opts);
    println!("\n{md}");
    let path = opts.out.join("probes.md");
    std::fs::write(&path, &md)?;
    println!("written {}", path.display());
    Ok(())
}

fn report(results: &[Figures], opts: &Opts) -> String {
    let get = |f: &Figures, k: &str| f.get(k).cloned().unwrap_or_else(|| "?".into());
    let num = |f: &Figures, k: &str| get(f, k).parse::<f64>().unwrap_or(f64::NAN);
    let row = |f: &Figures| {
        format!(
            "{} | {} | {} | {}",
            get(f, "net"),
            get(f, "dataplane"),
            get(f, "loop"),
            get(f, "targets")
        )
    };
    let mut md = format!(
        "# Probe scale: tcp targets (behind veth, or on loopback), interval 1s, timeout 500ms\n\n\
         Target: {ISSUE_TARGETS} targets with under {MAX_CORES} core and under {MAX_RSS_MB} MB. \
         Warm-up {:?}, window {:?}; then a failure window of {:?} with every {CLOSE_EVERY}th \
         target closed.\n\n\
         | targets on | data plane | loop | targets | published | agent cores (user + sys) | agent host's NAPI cores | peak RSS | \
         RSS at end | probes/s | failed | targets' cores | machine busy / load avg | verdict |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n",
        opts.warmup, opts.window, opts.fail_window
    );
    for f in results {
        let ok = num(f, "cores") < MAX_CORES && num(f, "peak_rss_mb") < MAX_RSS_MB;
        let _ = writeln!(
            md,
            "| {} | {} | {} ({} + {}) | {} | {} MB | {} MB | {} | {} | {} | {} of {} / {} | {} |",
            row(f),
            get(f, "published"),
            get(f, "cores"),
            get(f, "user_cores"),
            get(f, "sys_cores"),
            get(f, "agent_napi_cores"),
            get(f, "peak_rss_mb"),
            get(f, "end_rss_mb"),
            get(f, "probes_per_s"),
            get(f, "failed"),
            get(f, "target_cores"),
            get(f, "machine_busy"),
            machine_cores(),
            get(f, "load"),
            if ok { "meets" } else { "**misses**" },
        );
    }
    md.push_str(
        "\nEvery 10th target closed:\n\n\
         | targets on | data plane | loop | targets | closed | all seen failing after | unhealthy (of closed) | \
         transitions | publishes: verdict → maps written | agent cores | peak RSS | probes/s | \
         failed/s | open targets failed | publish errors | machine busy / load avg |\n\
         |---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for f in results {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {}: {} | {} | {} MB | {} | {} | {} | {} | {} / {} |",
            row(f),
            get(f, "fail_closed"),
            get(f, "fail_detect"),
            get(f, "fail_unhealthy_closed"),
            get(f, "fail_transitions"),
            get(f, "fail_publishes"),
            get(f, "fail_propagation"),
            get(f, "fail_cores"),
            get(f, "fail_peak_rss_mb"),
            get(f, "fail_probes_per_s"),
            get(f, "fail_failed_per_s"),
            get(f, "fail_open_failed"),
            get(f, "fail_publish_errors"),
            get(f, "fail_machine_busy"),
            get(f, "fail_load"),
        );
    }
    md.push_str(
        "\nWhere the agent loop's time goes (wall time per call, mean; `next_deadline` and \
         `has_unknown_macs` are called on every `run` iteration and timed here once per stats \
         tick, right after a snapshot rebuild, so cold caches and a busy machine make them \
         upper bounds):\n\n\
         | targets on | data plane | loop | targets | loop iterations/s | `next_deadline` | \
         `has_unknown_macs` | `poll_stats` | `publish_snapshot` | failure window: \
         `on_probe_report` with a recompute | failure window: `flush_snapshot` rebuilds |\n\
         |---|---|---|---:|---:|---|---|---|---|---|---|\n",
    );
    for f in results.iter().filter(|f| f.contains_key("cost_poll_stats")) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row(f),
            get(f, "iterations_per_s"),
            get(f, "cost_next_deadline"),
            get(f, "cost_has_unknown_macs"),
            get(f, "cost_poll_stats"),
            get(f, "cost_publish_snapshot"),
            get(f, "fail_cost_recompute"),
            get(f, "fail_cost_flush_rebuild"),
        );
    }
    md.push_str("\nPer run:\n\n");
    for f in results {
        if get(f, "loop") == "-" {
            let _ = writeln!(
                md,
                "- {} × {}: RSS {} MB before the probe tasks were spawned, {} MB after; at \
                 the window's end {}; failures: {}.",
                get(f, "dataplane"),
                get(f, "targets"),
                get(f, "rss_before_apply_mb"),
                get(f, "rss_after_apply_mb"),
                get(f, "rss_split"),
                get(f, "failure_details"),
            );
            continue;
        }
        let _ = writeln!(
            md,
            "- {} loop, {} × {}: apply_config {} s ({}); RSS {} MB before it (data plane \
             loaded, targets' config parsed), {} MB after it (servers, probe tasks, tables), \
             peak {} MB before the window, at the window's end {}; states at the end: {}; \
             failures: {}.",
            get(f, "loop"),
            get(f, "dataplane"),
            get(f, "targets"),
            get(f, "setup_s"),
            match get(f, "setup_error").as_str() {
                "-" => "all published".to_string(),
                e => format!("publishing refused: {e}"),
            },
            get(f, "rss_before_apply_mb"),
            get(f, "rss_after_apply_mb"),
            get(f, "setup_peak_rss_mb"),
            get(f, "rss_split"),
            get(f, "fail_states"),
            get(f, "failure_details"),
        );
    }
    let future = results
        .first()
        .map_or("?".into(), |f| get(f, "probe_future_bytes"));
    let _ = write!(
        md,
        "\n## Method\n\n\
         - Each row is its own process (`lb-probe-bench --dataplane KIND --targets N --loop L`): \
         the real `Agent` over `BpfDataplane::load()` (the XDP object and its maps loaded, \
         nothing attached, no traffic) or `MemoryDataplane`, with `NetProber` (real tcp \
         connects), `StaticNeighbors` (one MAC for all), on a 2-worker tokio runtime. The \
         targets are split over {SERVICES} nat services with one `tcp` probe \
         (`interval = \"1s\"`, `timeout = \"500ms\"`). One probe task's future (`probe::execute`) \
         is {future} bytes.\n\
         - Loop `run` is the first version of `lb-agent run`'s loop (`cli/run.rs`): select over \
         probe reports (one per iteration), \
         passive events, health deadlines (`next_deadline` every iteration), the \
         {STATS_EVERY:?} stats tick (`poll_stats` + `publish_snapshot`) and MAC retries (the \
         precondition `has_unknown_macs()` evaluated every iteration), then `flush_snapshot`. \
         Loop `batched` is how `lb-agent run` drives it now: up to {BATCH} queued reports per \
         iteration, one publish for all, and `has_unknown_macs()` checked only when the retry \
         timer fires.\n\
         - The targets are a child process (`--serve N`: N listeners on ports {BASE_PORT}.. of \
         one address per {PORTS_PER_IP}; it accepts and closes each connection), so its CPU \
         is not in the agent's figures; its share is shown separately. Targets on `veth`: \
         the child runs in a namespace of its own behind a veth pair whose receiving end \
         has a threaded NAPI (GRO on, `threaded` = 1), so the targets' kernel work runs in \
         `napi/pbt-…`, counted in the targets' share, as on backends that are other hosts; \
         the agent's end has one too (`napi/pba-…`), so the agent host's receive work for \
         the replies is shown apart, in \"agent host's NAPI cores\", as a NIC's softirq \
         would be on a real host. \
         Targets on `loopback` (127.0.x.1): the kernel's work for both ends of a handshake \
         runs inside the agent's `connect` and `close` (softirq in the sender's context), so \
         the agent's sys share also carries the targets' half.\n\
         - Agent cores = `getrusage(RUSAGE_SELF)` user + sys (all threads) over the wall time \
         of the window. Peak RSS = `VmHWM` of the window (reset through \
         `/proc/self/clear_refs` when it starts); RSS at end = `VmRSS`. Probes/s = reports \
         received / wall time (the schedule asks for one per target per second). Machine \
         busy = non-idle jiffies of `/proc/stat` over the window, in cores: other work on the \
         machine competes for the same {} cores, and an agent that cannot keep up shows it as \
         probes/s below the target count.\n\
         - Failure window: the child closes every {CLOSE_EVERY}th listener (connections are \
         refused); \"all seen failing\" is the time until every closed target has produced a \
         failed report; states and transitions are from the agent's snapshot; verdict → maps \
         written is the agent's propagation histogram (from the probe's verdict, including \
         its wait in the report channel) over the window.\n\
         - The data plane takes at most `lb_common::MAX_BACKENDS - 1` = {} backends in all \
         services together (backend ids are global), so the bpf rows run the largest set it \
         takes; the {ISSUE_TARGETS}-target rows run over `MemoryDataplane`, whose publishing \
         goes through the same `Publisher` and stops at the same limit (`apply_config` \
         returns the error; the benchmark carries on): probes and health run for every \
         server, only the servers past the limit are not published.\n",
        machine_cores(),
        MAX_BACKENDS - 1,
    );
    md
}
