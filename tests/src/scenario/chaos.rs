//! A seeded chaos run on the realistic bed: ordinary clients (new connections back to back
//! from OS-chosen ports, keep-alive clients) run throughout while faults come one at a
//! time, in an order drawn from a seed: a server SIGKILLed and started again, a backend's
//! link down for 3 s, a server whose health check answers 500 for a while, a backend's
//! address moving to another MAC (announced by the kernel's gratuitous ARP, as after a
//! NIC swap or a VRRP failover), a reload, an agent restart by SIGTERM and one by SIGKILL. After each fault the run waits until every
//! server is up again, then lets traffic run quietly before the next.
//!
//! The verdict ([`Run::violations`]): no server changes state outside its own fault's
//! window (from the fault until every server is up again), nothing fails open, and no
//! request fails outside the window of a fault that takes a server's traffic away (a
//! kill or a link down); a keep-alive request on another server never fails.

use std::{fmt::Write as _, net::SocketAddr, thread, time::Duration};

use crate::{
    agent::{api::EventView, daemon::START_TIMEOUT},
    net::link::{self, Mac},
    scenario::{
        health::{self, MARGIN},
        realistic::{Bed, SERVICE},
    },
    traffic::{
        ordinary::{Client, Ordinary, OrdinaryConfig, Report},
        pacer::wall_now,
    },
};

/// The seed when `LB_CHAOS_SEED` is not set.
pub const DEFAULT_SEED: u64 = 0x6c62_6368_616f_7321;
/// Traffic before the first fault.
const WARM_UP: Duration = Duration::from_secs(5);
/// Traffic after every server is up again, before the next fault.
const QUIET: Duration = Duration::from_secs(4);
/// How long a killed server stays dead, a link stays down, a health check fails.
const KILLED_FOR: Duration = Duration::from_secs(3);
const LINK_DOWN_FOR: Duration = Duration::from_secs(3);
const SICK_FOR: Duration = Duration::from_secs(6);
/// Bound on the wait until every server is up again after a fault: the passive
/// `fail_timeout` (10 s) after the last failure, plus recovery and margins.
const RECOVERY_WAIT: Duration = Duration::from_secs(40);
/// After the last fault, so that the ports of connections refused during the faults
/// come back ([`CLIENT_PORTS`]) while every server is healthy.
const TAIL: Duration = Duration::from_secs(20);
/// The clients' ephemeral port range: 6,000 ports, of which `connect()` takes every
/// other one first, so at about 200 new connections a second every port comes back
/// within about 15 s, as it does within a minute or so for a default Linux client at
/// this rate. A port refused during a fault is then reused several times while the
/// server is healthy again (the resend rule of docs/passive-signals.md).
pub const CLIENT_PORTS: &str = "40000 45999";

/// One fault of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The server's process SIGKILLed, started again [`KILLED_FOR`] later.
    Kill(&'static str),
    /// The backend's `eth0` down for [`LINK_DOWN_FOR`].
    LinkDown(&'static str),
    /// The server's health endpoint answers 500 for [`SICK_FOR`]; its web port works.
    Sick(&'static str),
    /// The backend's `eth0` takes another MAC; `arp_notify` makes its kernel announce it.
    MacMove(&'static str),
    /// SIGHUP with the config unchanged.
    Reload,
    /// SIGTERM, then `lb-agent run` again.
    RestartTerm,
    /// SIGKILL, then `lb-agent run` again.
    RestartKill,
}

impl Fault {
    /// The server whose state may change during the fault.
    pub fn server(self) -> Option<&'static str> {
        match self {
            Fault::Kill(s) | Fault::LinkDown(s) | Fault::Sick(s) | Fault::MacMove(s) => Some(s),
            _ => None,
        }
    }

    /// Whether requests may fail during the fault (its server's port is gone).
    pub fn breaks_requests(self) -> bool {
        matches!(self, Fault::Kill(_) | Fault::LinkDown(_))
    }
}

/// A fault as it happened; wall-clock seconds.
#[derive(Clone, Debug)]
pub struct Window {
    pub fault: Fault,
    pub start: f64,
    /// When every server was up again.
    pub end: f64,
}

impl Window {
    fn covers(&self, at: f64) -> bool {
        at >= self.start - 0.01 && at <= self.end + MARGIN.as_secs_f64() / 2.0
    }
}

/// A small deterministic generator (SplitMix64): the same seed, the same run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The seed: `LB_CHAOS_SEED` (decimal or 0x-hex) when set, else [`DEFAULT_SEED`].
pub fn seed_from_env() -> u64 {
    std::env::var("LB_CHAOS_SEED")
        .ok()
        .and_then(|s| match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s.parse().ok(),
        })
        .unwrap_or(DEFAULT_SEED)
}

/// Every kind of fault once, in an order and on servers drawn from `seed`.
pub fn plan(seed: u64, servers: &[&'static str]) -> Vec<Fault> {
    let mut rng = Rng(seed);
    let mut pick = || servers[rng.below(servers.len())];
    let mut faults = vec![
        Fault::Kill(pick()),
        Fault::LinkDown(pick()),
        Fault::Sick(pick()),
        Fault::MacMove(pick()),
        Fault::Reload,
        Fault::RestartTerm,
        Fault::RestartKill,
    ];
    let mut rng = Rng(seed ^ 0x5eed);
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.below(i + 1));
    }
    faults
}

/// What a chaos run saw.
pub struct Run {
    pub seed: u64,
    pub windows: Vec<Window>,
    pub report: Report,
    /// State changes and membership notes over the whole run (every agent's log).
    pub events: Vec<EventView>,
    /// When the run began (after the baseline).
    pub started: f64,
}

/// Runs `faults` on `bed` under ordinary traffic (`new_loops` loops of new connections
/// with `gap` between connections, two keep-alive clients).
pub fn run(bed: &mut Bed, seed: u64, faults: &[Fault], new_loops: usize, gap: Duration) -> Run {
    bed.topo
        .client()
        .ns
        .sysctl("net.ipv4.ip_local_port_range", CLIENT_PORTS)
        .expect("narrowing the client's port range");
    let started = wall_now();
    let mut cfg = OrdinaryConfig::new(bed.vip, Duration::from_secs(600));
    cfg.new_loops = new_loops;
    cfg.gap = gap;
    let traffic = Ordinary::start(&bed.topo.client().ns, &cfg);
    let addrs: Vec<SocketAddr> = bed.roles.iter().map(|r| bed.addr(r.name)).collect();
    let mut events: Vec<EventView> = Vec::new();
    let mut windows = Vec::new();
    thread::sleep(WARM_UP);
    for &fault in faults {
        let start = apply(bed, fault, &mut events, started);
        health::wait_all_probed_up(&bed.api, SERVICE, &addrs, RECOVERY_WAIT).unwrap_or_else(|e| {
            panic!("seed {seed:#x}: after {fault:?}, every server up again: {e}")
        });
        let end = wall_now();
        eprintln!(
            "chaos: {fault:?} at +{:.1} s, every server up {:.1} s later",
            start - started,
            end - start
        );
        windows.push(Window { fault, start, end });
        thread::sleep(QUIET);
    }
    thread::sleep(TAIL);
    let report = traffic.finish(true);
    collect_events(bed, &mut events, started);
    Run {
        seed,
        windows,
        report,
        events,
        started,
    }
}

/// Applies `fault`; returns its start. Agent restarts first keep the old agent's events.
fn apply(bed: &mut Bed, fault: Fault, events: &mut Vec<EventView>, since: f64) -> f64 {
    let start = wall_now();
    match fault {
        Fault::Kill(s) => {
            bed.servers.kill(s).expect("killing a server");
            thread::sleep(KILLED_FOR);
            bed.servers.restart(s).expect("starting the server again");
        }
        Fault::LinkDown(s) => {
            let ns = &bed.topo.backends()[backend_of(bed, s)].ns;
            ns.ip(&["link", "set", "dev", "eth0", "down"])
                .expect("link down");
            thread::sleep(LINK_DOWN_FOR);
            ns.ip(&["link", "set", "dev", "eth0", "up"])
                .expect("link up");
        }
        Fault::Sick(s) => {
            bed.servers.control(s, "http 500\n");
            thread::sleep(SICK_FOR);
            bed.servers.control(s, "");
        }
        Fault::MacMove(s) => {
            let index = backend_of(bed, s);
            let ns = &bed.topo.backends()[index].ns;
            ns.sysctl("net.ipv4.conf.eth0.arp_notify", "1")
                .expect("arp_notify");
            let mac = Mac([0x02, 0xc4, 0xa0, 0x5e, 0x00, index as u8 + 1]);
            link::set_mac(ns, "eth0", mac).expect("a new MAC");
        }
        Fault::Reload => {
            bed.agent
                .reload_unchanged(Duration::from_secs(10))
                .expect("a reload of the unchanged config");
        }
        Fault::RestartTerm | Fault::RestartKill => {
            collect_events(bed, events, since);
            let signal = if fault == Fault::RestartTerm {
                libc::SIGTERM
            } else {
                libc::SIGKILL
            };
            bed.agent
                .restart(&bed.topo, signal, START_TIMEOUT)
                .expect("restarting the agent");
        }
    }
    start
}

fn backend_of(bed: &Bed, name: &str) -> usize {
    bed.roles
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no role {name}"))
        .backend
}

/// Adds the agent's events since `since` that `events` does not hold yet.
fn collect_events(bed: &Bed, events: &mut Vec<EventView>, since: f64) {
    let now = bed.events_since(since).expect("reading the events");
    for e in now {
        if !events.contains(&e) {
            events.push(e);
        }
    }
    events.sort_by(|a, b| health::event_time(a).total_cmp(&health::event_time(b)));
}

impl Run {
    /// Everything the run did wrong, one line each (empty: a clean run).
    pub fn violations(&self, bed: &Bed) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.events {
            let at = health::event_time(e);
            if e.server == "-" {
                if e.cause.contains("fail-open") {
                    out.push(format!(
                        "+{:.2} s: failed open ({})",
                        at - self.started,
                        e.cause
                    ));
                }
                continue;
            }
            let name = bed.name_of(&e.server);
            let own = self
                .windows
                .iter()
                .any(|w| w.fault.server() == Some(name.as_str()) && w.covers(at));
            if !own {
                out.push(format!(
                    "+{:.2} s: {name} {} -> {} ({}) outside its own fault",
                    at - self.started,
                    e.from,
                    e.to,
                    e.cause
                ));
            }
        }
        for (r, f) in self.report.failures() {
            let window = self
                .windows
                .iter()
                .find(|w| w.fault.breaks_requests() && w.covers(r.at));
            let excused = match (window, &r.client, &f.expected) {
                (None, _, _) => false,
                // A keep-alive connection on another server must not notice the fault.
                (Some(w), Client::KeepAlive(_), Some(b)) => w.fault.server() == Some(b.as_str()),
                (Some(_), _, _) => true,
            };
            if !excused {
                out.push(format!(
                    "+{:.2} s: {:?} failed ({}, expected {:?}) while no fault excused it",
                    r.at - self.started,
                    r.client,
                    f.cause,
                    f.expected
                ));
            }
        }
        out
    }

    /// The run in lines: seed, faults with their windows, traffic summary, events.
    pub fn describe(&self, bed: &Bed) -> String {
        let mut out = format!("chaos seed {:#x}\n", self.seed);
        for w in &self.windows {
            let _ = writeln!(
                out,
                "  {:?}: +{:.1} s .. +{:.1} s",
                w.fault,
                w.start - self.started,
                w.end - self.started
            );
        }
        let _ = writeln!(out, "  {}", self.report.summary());
        // What the data plane and the backends' kernels saw: a failure outside every
        // window is read against these (a SYN a backend's TIME_WAIT dropped, a pair
        // taken over, a drop counted by lb).
        match bed.counters() {
            Ok(c) => {
                let _ = writeln!(out, "  lb counters: {c:?}");
            }
            Err(e) => {
                let _ = writeln!(out, "  lb counters: unreadable ({e})");
            }
        }
        match bed.paws_timewait() {
            Ok(n) => {
                let _ = writeln!(out, "  backends' TcpExtPAWSTimewait: {n}");
            }
            Err(e) => {
                let _ = writeln!(out, "  backends' TcpExtPAWSTimewait: unreadable ({e})");
            }
        }
        out.push_str("  events:\n");
        out.push_str(&bed.describe_events(&self.events, self.started));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_has_every_fault_once_and_follows_its_seed() {
        let servers = ["b1", "b2", "b3", "b4"];
        let a = plan(1, &servers);
        assert_eq!(a, plan(1, &servers), "same seed, same plan");
        assert_eq!(a.len(), 7);
        for kind in [
            |f: &Fault| matches!(f, Fault::Kill(_)),
            |f: &Fault| matches!(f, Fault::LinkDown(_)),
            |f: &Fault| matches!(f, Fault::Sick(_)),
            |f: &Fault| matches!(f, Fault::MacMove(_)),
            |f: &Fault| *f == Fault::Reload,
            |f: &Fault| *f == Fault::RestartTerm,
            |f: &Fault| *f == Fault::RestartKill,
        ] {
            assert_eq!(a.iter().filter(|f| kind(f)).count(), 1, "{a:?}");
        }
        let orders: std::collections::BTreeSet<String> = (0..20)
            .map(|s| format!("{:?}", plan(s, &servers)))
            .collect();
        assert!(orders.len() > 10, "seeds must vary the plan: {orders:?}");
    }
}
