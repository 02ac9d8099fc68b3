//! `cargo xtask bench` (probe scale): the agent's CPU share and memory while it probes
//! thousands of TCP targets at a 1 s interval (issue: 10,000 targets, under half a core
//! and under 200 MB). Results: stdout and `target/bench/probes.md`.
//!
//! Method: each scenario runs in its own process (so peak RSS is its own), which builds
//! the real [`Agent`] over [`BpfDataplane::load`] (real maps, nothing attached) or
//! [`MemoryDataplane`], with [`NetProber`] and [`StaticNeighbours`], and drives it as
//! `lb-agent run` does (one select loop over batches of reports, passive events,
//! deadlines, the stats tick and MAC retries, on a 2-worker runtime), or runs the probe
//! scheduler alone ([`Kind::ProbesOnly`], the floor). The targets are a child process (this binary with `--serve N`) that
//! listens on N ports and accepts and closes every connection, so their CPU is not in
//! the agent's figures. The targets are either on loopback (`--net loopback`: the
//! agent's process is then also billed for the targets' kernel side of every
//! connection) or in a namespace of their own behind a veth pair whose receive side
//! runs in a NAPI thread (`--net veth`, as backends on other hosts; see
//! [`target_net`]); with `veth`, the agent's side and the targets' side are pinned to
//! different CPUs by default ([`Cpus`]). Over a measured window: CPU = `getrusage(RUSAGE_SELF)`
//! user + sys over wall time; peak RSS = `VmHWM` after resetting it through
//! `/proc/self/clear_refs` at the window's start; probes completed = reports received.
//! A second window closes every 10th target (the child drops those listeners) and counts
//! failures, transitions and detection time.
//!
//! Needs root (BPF, file-descriptor limits); run it with
//! `cargo run --release -p lb-tests --bin lb-probe-bench -- --out target/bench`.

mod drive;
mod measure;
mod report;
mod target_net;
mod targets;

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
use drive::*;
use lb_agent::{
    agent::{Agent, Environment, Neighbours, StaticNeighbours},
    config::{ProbeConfig, ProbeKind},
    dataplane::{BpfDataplane, Dataplane, DataplaneLifecycle, EventStream, MapSizes},
    // As `lb-agent run`: MAC retries, the stats tick, reports per loop iteration.
    event_loop::{MAC_RETRY, REPORT_BATCH as BATCH, STATS_EVERY},
    probe::{NetProber, ProbeReport, Prober},
    publish::PublishError,
    testing::MemoryDataplane,
    view::Histogram,
};
use measure::*;
use report::*;
use target_net::{BASE_PORT, End, Net, PORTS_PER_IP, TargetNet, target_addr, target_index};
use targets::*;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt},
    process::{Child, ChildStdin, ChildStdout, Command},
    time::Instant,
};

/// Services the targets are split over (at least; see [`services_for`]).
const SERVICES: usize = 3;
/// Servers per service at most in the split.
const PER_SERVICE: usize = 10_000;

/// Services `targets` targets are split over: [`SERVICES`], or more so that none has
/// more than [`PER_SERVICE`].
fn services_for(targets: usize) -> usize {
    SERVICES.max(targets.div_ceil(PER_SERVICE))
}
/// The scale the report's aims are set at.
const AIM_TARGETS: usize = 10_000;
/// Ten times as many targets (the data plane sized for them,
/// `agent.max_backends`).
const SCALE_TARGETS: usize = 100_000;
/// Every n-th target is closed in the failure window.
const CLOSE_EVERY: usize = 10;
/// File descriptors wanted by both processes (N listeners, or up to N probe sockets).
const NOFILE: u64 = 262_144;
/// Descriptors the prober asks for at most: this machine's hard RLIMIT_NOFILE is 20,000
/// and cannot be raised (no CAP_SYS_RESOURCE in its container).
const PROBE_FDS: usize = 16_384;
/// Descriptors needed beyond one per target.
const FD_SLACK: usize = 1_024;
/// The aims at [`AIM_TARGETS`]: CPU and resident memory at most.
const MAX_CORES: f64 = 0.5;
const MAX_RSS_MB: f64 = 200.0;
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

/// How tcp probes check their port (`tcp_check`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// One SYN, its SYN-ACK (raw socket; `probe::syn`).
    Syn,
    /// A full connect and a reset close (`probe::stream`).
    Connect,
}

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::Syn => "syn",
            Check::Connect => "connect",
        }
    }
}

/// Which CPUs the agent and the targets run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cpus {
    /// The agent's process and its host's NAPI thread on CPU 0; the targets' process and
    /// their NAPI thread on CPU 1 (`--net veth` only): the targets' kernel work cannot
    /// run in the agent's time slices, as with targets on other hosts.
    Split,
    /// The agent's process alone on CPU 0; the targets and both NAPI threads on CPU 1
    /// (`--net veth` only): the agent has a whole core, its host's receive work runs
    /// beside the targets' (on a real host, a NIC queue's softirq on another core).
    AgentAlone,
    /// Wherever the scheduler puts them.
    Shared,
}

impl Cpus {
    fn name(self) -> &'static str {
        match self {
            Cpus::Split => "split",
            Cpus::AgentAlone => "agent-alone",
            Cpus::Shared => "shared",
        }
    }
}

/// CPU of the agent's side with `--cpus split`.
const AGENT_CPU: usize = 0;
/// CPU of the targets' side with `--cpus split`.
const TARGET_CPU: usize = 1;

/// A snapshot reader (a metrics scrape) asks this often.
const READ_EVERY: Duration = Duration::from_secs(1);

/// One scenario: data plane, number of targets, where the targets are.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    kind: Kind,
    targets: usize,
    net: Net,
    check: Check,
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
    /// Where the agent and the targets run (`--cpus`; split by default with veth).
    cpus: Cpus,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve") {
        let n = args.get(1).context("--serve needs a count")?.parse()?;
        let net = match args.get(2..4) {
            Some([flag, net]) if flag == "--net" => Net::parse(net).context(USAGE)?,
            _ => Net::Loopback,
        };
        if let Some([flag, cpu]) = args.get(4..6)
            && flag == "--cpu"
        {
            lb_tests::bench::cpu::pin_self(cpu.parse().context("--cpu takes a CPU number")?)?;
        }
        target_net::select(net)?;
        return serve(n, net);
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
                println!("\n{}", report(std::slice::from_ref(&figures), &opts));
                println!("{}", summary_row(&figures));
            }
            Ok(())
        }
        None => orchestrate(&opts),
    }
}

const USAGE: &str = "usage: lb-probe-bench [--out DIR] [--warmup S] [--window S] [--fail-window S] \
                     [--cpus split|agent-alone|shared] \
                     [--dataplane bpf|memory|probes-only --targets N --net loopback|veth|remote --tcp-check syn|connect]";

fn parse_args(args: &[String]) -> anyhow::Result<Opts> {
    let mut opts = Opts {
        out: PathBuf::from("target/bench"),
        warmup: Duration::from_secs(5),
        window: Duration::from_secs(20),
        fail_window: Duration::from_secs(10),
        single: None,
        child: false,
        cpus: Cpus::Split,
    };
    let mut kind = None;
    let mut targets = None;
    let mut net = None;
    let mut check = None;
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
            "--net" => {
                let v = it.next().context(USAGE)?;
                net = Some(Net::parse(v).context("--net takes loopback, veth or remote")?);
            }
            "--tcp-check" => {
                check = Some(match it.next().map(String::as_str) {
                    Some("syn") => Check::Syn,
                    Some("connect") => Check::Connect,
                    _ => bail!("--tcp-check takes syn or connect; {USAGE}"),
                })
            }
            "--child" => opts.child = true,
            "--cpus" => {
                opts.cpus = match it.next().map(String::as_str) {
                    Some("split") => Cpus::Split,
                    Some("agent-alone") => Cpus::AgentAlone,
                    Some("shared") => Cpus::Shared,
                    _ => bail!("--cpus takes split, agent-alone or shared; {USAGE}"),
                }
            }
            other => bail!("unknown argument {other}; {USAGE}"),
        }
    }
    opts.single = match (kind, targets, net, check) {
        (None, None, None, None) => None,
        (k, t, n, c) => Some(Scenario {
            kind: k.unwrap_or(Kind::Bpf),
            targets: t.unwrap_or(AIM_TARGETS),
            net: n.unwrap_or(Net::Veth),
            check: c.unwrap_or(Check::Syn),
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
    // SAFETY: rlimit is two integers, for which all-zero bytes are valid.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes into `lim`, a live and writable rlimit.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let want = libc::rlimit {
        rlim_cur: NOFILE,
        rlim_max: NOFILE.max(lim.rlim_max),
    };
    // SAFETY: setrlimit only reads `want`, a live rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
        lim.rlim_cur = NOFILE.min(lim.rlim_max);
        // SAFETY: setrlimit only reads `lim`, a live rlimit.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
    // SAFETY: getrlimit writes into `lim`, a live and writable rlimit.
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
// One scenario (in its own process)

fn scenario(sc: Scenario, opts: &Opts) -> anyhow::Result<Figures> {
    let Scenario {
        kind,
        targets,
        net,
        check,
    } = sc;
    // One descriptor per probe in flight: at most one per target, and far fewer in
    // practice (a 1 s interval, connects done in milliseconds). Beyond PROBE_FDS probes in
    // flight, a probe fails locally (EMFILE: counted, never held against the target).
    raise_nofile(targets.min(PROBE_FDS) + FD_SLACK)?;
    target_net::select(net)?;
    // Split only where there is a veth pair to split across and two CPUs to split.
    let cpus = if net.has_veth() && machine_cores() >= 2.0 {
        opts.cpus
    } else {
        Cpus::Shared
    };
    let split = cpus != Cpus::Shared;
    if split {
        // Before any other thread starts: the runtime's and the SYN check's inherit it.
        lb_tests::bench::cpu::pin_self(AGENT_CPU).context("pinning the agent")?;
    }
    // Namespaces first, while this is the only thread: the runtime's threads inherit.
    if net == Net::Remote && check != Check::Syn {
        bail!("--net remote answers SYN checks only (--tcp-check syn)");
    }
    let target_net = if net.has_veth() {
        let t = TargetNet::create(targets, net).context("making the target namespaces")?;
        t.enter_agent()?;
        Some(t)
    } else {
        None
    };
    // As `lb-agent run` builds it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        println!(
            "== {} data plane, {targets} tcp targets ({}) over {} services, tcp check {}",
            kind.name(),
            net.name(),
            services_for(targets),
            check.name()
        );
        if check == Check::Syn
            && let Err(why) = lb_agent::probe::syn::availability()
        {
            bail!("SYN checks unavailable: {why}");
        }
        let started = Instant::now();
        let target_cpu = split.then_some(TARGET_CPU);
        let mut children = Targets::start(targets, net, target_net.as_ref(), target_cpu).await?;
        if split {
            let agent_napi = if cpus == Cpus::Split {
                AGENT_CPU
            } else {
                TARGET_CPU
            };
            target_net::pin_napi(End::Agent, agent_napi)?;
            target_net::pin_napi(End::Targets, TARGET_CPU)?;
        }
        println!(
            "targets listening ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        let text = config_text(targets, check);
        let cfg = lb_agent::config::parse(&text, Path::new("probe-bench.toml"))?;
        let neighbours = Arc::new(StaticNeighbours {
            default: Some(MAC),
            ..StaticNeighbours::default()
        });
        let run = Run {
            cfg: &cfg,
            targets: &mut children,
            opts,
        };
        let mut f = match kind {
            Kind::Bpf => {
                let sizes = MapSizes::for_backends(cfg.agent.max_backends)
                    .context("agent.max_backends out of range")?;
                let mut dp = BpfDataplane::load_sized(None, None, sizes)
                    .context("loading the balancer (are you root?)")?;
                let events = dp.take_events().transpose()?;
                let (agent, handles) =
                    Agent::new(dp, Arc::new(NetProber), neighbours, Environment::default());
                drive(agent, handles, events, run, |dp: &BpfDataplane| {
                    dp.published_state().map_or(0, |s| s.backends.len())
                })
                .await?
            }
            Kind::Memory => {
                let (agent, handles) = Agent::new(
                    MemoryDataplane::with_max_backends(cfg.agent.max_backends),
                    Arc::new(NetProber),
                    neighbours,
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
        f.insert("targets".into(), targets.to_string());
        f.insert("net".into(), net.name().into());
        f.insert("services".into(), services_for(targets).to_string());
        f.insert("tcp_check".into(), check.name().into());
        f.insert("cpus".into(), cpus.name().into());
        f.insert("syn_packets".into(), syn_packets());
        let probe = ProbeConfig::new("p", ProbeKind::Tcp);
        let fut = lb_agent::probe::execute(&probe, target_addr(0));
        f.insert(
            "probe_future_bytes".into(),
            std::mem::size_of_val(&fut).to_string(),
        );
        Ok(f)
    })
}

/// The SYN check's packet counters of this process, for the report.
fn syn_packets() -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let s = lb_agent::probe::syn::stats();
    format!(
        "sent {}, SYN-ACKs {}, RSTs {}, rejected {}, unmatched {}, malformed {}; \
         queued to sent: mean {:.0} µs, max {:.1} ms, {} sent after their probe's timeout",
        s.sent.load(Relaxed),
        s.accepted.load(Relaxed),
        s.refused.load(Relaxed),
        s.rejected.load(Relaxed),
        s.unmatched.load(Relaxed),
        s.malformed.load(Relaxed),
        s.queue_us_sum.load(Relaxed) as f64 / s.sent.load(Relaxed).max(1) as f64,
        s.queue_us_max.load(Relaxed) as f64 / 1000.0,
        s.sent_late.load(Relaxed)
    )
}

/// `targets` servers split over [`services_for`] nat services, one tcp probe each,
/// checking with `check`; the data plane sized for them (`agent.max_backends`, never
/// below its default).
fn config_text(targets: usize, check: Check) -> String {
    let services = services_for(targets);
    let per = targets.div_ceil(services);
    let max_backends = targets.max(lb_agent::config::DEFAULT_MAX_BACKENDS as usize);
    let mut text = format!("[agent]\nmax_backends = {max_backends}\n");
    for s in 0..services {
        let range = s * per..((s + 1) * per).min(targets);
        if range.is_empty() {
            continue;
        }
        let _ = write!(
            text,
            "[[service]]\nname = \"svc{s}\"\nvip = \"10.9.9.{}:80\"\nforwarding = \"nat\"\n\
             snat_ip = \"10.9.9.2\"\n\
             [[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\ntimeout = \"500ms\"\n\
             tcp_check = \"{}\"\n",
            100 + s,
            check.name()
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
