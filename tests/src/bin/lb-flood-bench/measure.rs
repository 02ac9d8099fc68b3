//! One measured flood through one running balancer: counters of the sinks, the lb
//! host's interface and its NAPI thread read before and after, and what they add up to.

use std::time::{Duration, Instant};

use anyhow::Context;
use lb_tests::{
    bench::cpu,
    bpf::drop_prog::DropCounter,
    net::{netns::NetNs, topology::Topology},
    util::cmd,
};

use crate::flood::{self, Bounds, Sent};

/// Longest wait for packets still in flight after a flood.
const DRAIN_MAX: Duration = Duration::from_secs(3);
/// The sinks' total is taken as final once it stayed the same this long.
const DRAIN_QUIET: Duration = Duration::from_millis(200);

/// Counters at one moment.
#[derive(Clone, Debug)]
struct Snapshot {
    sinks: Vec<u64>,
    napi: Duration,
    switch_napi: Duration,
    process: Duration,
    /// The lb host's `eth0`: frames received.
    lb_rx: u64,
    /// The switch's `p-lb`: frames it could not hand to the lb host (its queue full).
    into_lb_dropped: u64,
}

/// What one flood did, as differences of the counters.
#[derive(Clone, Debug)]
pub struct Measured {
    pub sent: Sent,
    /// Frames each sink counted (and dropped): b1..bN end to end, the `p-lb` sink on the
    /// wire; the client's for the reflector end to end.
    pub per_backend: Vec<u64>,
    /// Frames the lb host's `eth0` received.
    pub lb_rx: u64,
    /// Frames lost on the way into the lb host because its receive queue was full.
    pub into_lb_dropped: u64,
    /// On-CPU time of the lb host's NAPI thread(s) over the flood and the drain.
    pub napi: Duration,
    /// On-CPU time of the switch's NAPI threads (from the sender, from the lb host).
    pub switch_napi: Duration,
    /// On-CPU time of the balancer's process (the agent: control plane), if it has one.
    pub process: Duration,
}

impl Measured {
    pub fn delivered(&self) -> u64 {
        self.per_backend.iter().sum()
    }

    /// Forwarded packets per second of the flood.
    pub fn delivered_per_s(&self) -> f64 {
        self.delivered() as f64 / self.sent.elapsed.as_secs_f64()
    }

    /// Frames offered per second (taken by the kernel or refused at the sender).
    pub fn offered_per_s(&self) -> f64 {
        (self.sent.sent + self.sent.refused) as f64 / self.sent.elapsed.as_secs_f64()
    }

    /// Forwarded packets per CPU-second of the lb host's receive side.
    pub fn per_core_second(&self) -> f64 {
        self.delivered() as f64 / self.napi.as_secs_f64().max(1e-9)
    }

    /// Share of the flood's wall time the sending thread was on a CPU.
    pub fn sender_busy(&self) -> f64 {
        self.sent.cpu.as_secs_f64() / self.sent.elapsed.as_secs_f64()
    }

    /// Share of the flood's wall time the sender's CPU spent on the flood: the sending
    /// thread and the switch's NAPI threads.
    pub fn sender_side_busy(&self) -> f64 {
        (self.sent.cpu + self.switch_napi).as_secs_f64() / self.sent.elapsed.as_secs_f64()
    }

    /// Share of the flood's wall time the lb host's NAPI thread was on a CPU.
    pub fn busy(&self) -> f64 {
        self.napi.as_secs_f64() / self.sent.elapsed.as_secs_f64()
    }
}

/// What the measurement reads: the sinks and the lb host's NAPI threads.
pub struct Probe<'a> {
    pub topo: &'a Topology,
    pub sinks: &'a [DropCounter],
    pub napi_threads: Vec<u32>,
    /// The switch's NAPI threads, on the sender's CPU.
    pub switch_threads: Vec<u32>,
    /// Where the sender puts its frames: a namespace and an interface.
    pub sender: (&'a NetNs, &'static str),
    /// The balancer's process, if it has one.
    pub pid: Option<u32>,
}

impl Probe<'_> {
    /// Sends `frames` within `bounds` and returns the counters' differences once the
    /// sinks' total stopped moving.
    pub fn flood(&self, frames: &[Vec<u8>], bounds: Bounds) -> anyhow::Result<Measured> {
        let before = self.snapshot()?;
        let sent = flood::send(self.sender.0, self.sender.1, frames, bounds)?;
        self.drain(before.sinks.iter().sum::<u64>() + sent.sent)?;
        let after = self.snapshot()?;
        Ok(Measured {
            sent,
            per_backend: after
                .sinks
                .iter()
                .zip(&before.sinks)
                .map(|(a, b)| a - b)
                .collect(),
            lb_rx: after.lb_rx - before.lb_rx,
            into_lb_dropped: after.into_lb_dropped - before.into_lb_dropped,
            napi: after.napi.saturating_sub(before.napi),
            switch_napi: after.switch_napi.saturating_sub(before.switch_napi),
            process: after.process.saturating_sub(before.process),
        })
    }

    /// Sinks' total: every frame sent has arrived (`target`), or nothing moved for
    /// [`DRAIN_QUIET`], or [`DRAIN_MAX`] passed.
    fn drain(&self, target: u64) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut last = self.sinks_total()?;
        let mut since = Instant::now();
        while last < target && started.elapsed() < DRAIN_MAX {
            std::thread::sleep(Duration::from_millis(20));
            let now = self.sinks_total()?;
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= DRAIN_QUIET {
                break;
            }
        }
        Ok(())
    }

    fn sinks_total(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for s in self.sinks {
            total += s.count()?;
        }
        Ok(total)
    }

    fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let mut sinks = Vec::with_capacity(self.sinks.len());
        for s in self.sinks {
            sinks.push(s.count()?);
        }
        Ok(Snapshot {
            sinks,
            napi: cpu::on_cpu(&self.napi_threads),
            switch_napi: cpu::on_cpu(&self.switch_threads),
            process: self.pid.map_or(Duration::ZERO, cpu::process_on_cpu),
            lb_rx: link_stat(&self.topo.lb().ns, "eth0", "rx_packets")?,
            into_lb_dropped: link_stat(self.topo.switch(), "p-lb", "tx_dropped")?,
        })
    }
}

/// `/sys/class/net/IF/statistics/NAME` as the namespace `ns` sees it.
pub fn link_stat(ns: &NetNs, ifname: &str, name: &str) -> anyhow::Result<u64> {
    let path = format!("/sys/class/net/{ifname}/statistics/{name}");
    // sysfs shows the devices of the namespace it was mounted in: `ip netns exec`
    // mounts the namespace's own.
    let out = cmd::run("ip", &["netns", "exec", ns.name(), "cat", &path])?;
    out.trim()
        .parse()
        .with_context(|| format!("{path} in {}: {out:?}", ns.name()))
}
