//! Measurement helpers: CPU and memory from `/proc` and `getrusage`, the marks a
//! window is measured between, and the figures a window yields.

use super::*;

/// This process's user and sys CPU time.
pub(super) fn rusage() -> (Duration, Duration) {
    // SAFETY: rusage is integers and timevals only, for which all-zero bytes are valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into `ru`, a live and writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// A field of `/proc/self/status` in MB (`VmHWM`, `VmRSS`).
pub(super) fn status_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Resets `VmHWM` to the current RSS (Linux ≥ 4.0).
pub(super) fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

pub(super) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Busy and total jiffies of the whole machine (`/proc/stat`).
pub(super) fn machine_jiffies() -> (u64, u64) {
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

/// CPUs of the machine (`cpuN` lines of `/proc/stat`; not this process's affinity,
/// which `--cpus split` narrows to one).
pub(super) fn machine_cores() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let n = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    n.max(1) as f64
}

/// Everything counted at one instant; windows are differences of two.
#[derive(Clone, Copy)]
pub(super) struct Mark {
    pub(super) wall: std::time::Instant,
    pub(super) user: Duration,
    pub(super) sys: Duration,
    pub(super) target_cpu: Duration,
    /// The agent host's receive work (`veth` only: its NAPI thread).
    pub(super) agent_napi_cpu: Duration,
    pub(super) machine: (u64, u64),
    pub(super) tally: Tally,
}

impl Mark {
    pub(super) fn now(targets: &Targets, tally: Tally) -> Self {
        let (user, sys) = rusage();
        Self {
            wall: std::time::Instant::now(),
            user,
            sys,
            target_cpu: targets.cpu(),
            agent_napi_cpu: target_net::napi_cpu(End::Agent),
            machine: machine_jiffies(),
            tally,
        }
    }
}

/// Report counters.
#[derive(Clone, Copy, Default)]
pub(super) struct Tally {
    pub(super) ok: u64,
    pub(super) failed: u64,
    /// Failures of targets that were listening.
    pub(super) open_failed: u64,
    /// Reports without a verdict (local faults, counted in `failed` too): the agent's
    /// own trouble, not held against the target.
    pub(super) local: u64,
    pub(super) publish_errors: u64,
    /// Iterations of the select loop.
    pub(super) iterations: u64,
}

/// Durations of one kind of call.
#[derive(Clone, Copy, Default)]
pub(super) struct Stat {
    pub(super) n: u64,
    pub(super) sum: Duration,
    pub(super) max: Duration,
}

impl Stat {
    pub(super) fn add(&mut self, d: Duration) {
        self.n += 1;
        self.sum += d;
        self.max = self.max.max(d);
    }

    pub(super) fn show(&self) -> String {
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
pub(super) struct Costs {
    pub(super) poll_stats: Stat,
    /// `answer_readers` turns that built a snapshot for the reader asking once a second
    /// (as `lb-agent run` builds it: on demand, at most once per `snapshot_interval`).
    pub(super) snapshot_build: Stat,
    /// `on_probe_report` calls that recomputed membership (published, or failed to).
    pub(super) recompute: Stat,
}

impl Costs {
    pub(super) fn figures(&self, f: &mut Figures, prefix: &str) {
        for (k, s) in [
            ("poll_stats", self.poll_stats),
            ("snapshot_build", self.snapshot_build),
            ("recompute", self.recompute),
        ] {
            f.insert(format!("{prefix}cost_{k}"), s.show());
        }
    }
}

pub(super) type Figures = BTreeMap<String, String>;

/// Figures of the window between `a` and `b` under `prefix`.
pub(super) fn window_figures(f: &mut Figures, prefix: &str, a: &Mark, b: &Mark) {
    // Saturating: the CPU of kernel threads found anew at each mark (NAPI, the targets'
    // children) may read lower at the end than at the start.
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
        format!(
            "{:.3}",
            b.target_cpu.saturating_sub(a.target_cpu).as_secs_f64() / wall
        ),
    );
    put(
        "agent_napi_cores",
        format!(
            "{:.3}",
            b.agent_napi_cpu
                .saturating_sub(a.agent_napi_cpu)
                .as_secs_f64()
                / wall
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
    put("local", (b.tally.local - a.tally.local).to_string());
    // Failures that were verdicts (not local faults): what the health state machine
    // counts against a server.
    put(
        "verdicts_failed",
        ((b.tally.failed - b.tally.local) - (a.tally.failed - a.tally.local)).to_string(),
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
