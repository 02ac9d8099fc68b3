//! Building blocks of the redundancy scenarios and the demo (DESIGN.md §6): servers with
//! a role (weight, spare, backup level) rendered into a service with a fast `tcp` probe,
//! backend servers named after their role that can be killed and restarted one by one
//! (with an optional separate health listener for the probe), fresh client source
//! ports per phase, connection attempts with a short connect timeout, a background
//! stream of new connections, and a long-lived connection opened on a chosen backend.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    agent::daemon::{Proto, Service},
    net::{
        netns::NetNs,
        topology::{Host, Topology},
    },
    scenario::balance::{self, BACKEND_TCP_PORT, SERVER_START},
    traffic::{
        clients::{EchoConn, Tally},
        pacer::greet,
    },
    util::{
        error::Error,
        process::{NsProcess, STOP_GRACE},
    },
};

/// Port of the separate health listener, when a scenario probes one.
pub const HEALTH_PORT: u16 = 9000;

/// One server of the service: a backend host with its role.
#[derive(Clone, Copy, Debug)]
pub struct Member<'t> {
    /// What the scenario calls it (`p1`, `s2`, `b1`…); the testserver answers with it.
    pub name: &'static str,
    pub host: &'t Host,
    pub weight: u32,
    /// `spare = true` (primary group only).
    pub spare: bool,
    /// `backup = N`; 0 = primary group.
    pub backup: u32,
}

impl<'t> Member<'t> {
    pub fn primary(name: &'static str, host: &'t Host, weight: u32) -> Self {
        Member {
            name,
            host,
            weight,
            spare: false,
            backup: 0,
        }
    }

    pub fn spare(name: &'static str, host: &'t Host, weight: u32) -> Self {
        Member {
            spare: true,
            ..Member::primary(name, host, weight)
        }
    }

    pub fn backup(name: &'static str, host: &'t Host, level: u32) -> Self {
        Member {
            backup: level,
            ..Member::primary(name, host, 1)
        }
    }

    /// Its service address (IPv4, [`BACKEND_TCP_PORT`]).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.host.ipv4.into(), BACKEND_TCP_PORT)
    }
}

/// The name of the member at `addr` (the address itself when none).
pub fn name_of(members: &[Member<'_>], addr: SocketAddr) -> String {
    members
        .iter()
        .find(|m| m.addr() == addr)
        .map_or_else(|| addr.to_string(), |m| m.name.to_owned())
}

/// `(name, weight)` of `members`, for [`Tally::check_shares`].
pub fn shares<'a>(members: &[&Member<'a>]) -> Vec<(&'static str, u32)> {
    members.iter().map(|m| (m.name, m.weight)).collect()
}

/// Opens `count` TCP connections from `client` to `vip` (fresh source ports, at most
/// 100 ms each), prints the distribution under `label`, and panics with `expected`
/// unless every connection was answered and the shares match `members`' weights within
/// [`balance::SHARE_TOLERANCE`], with no connection elsewhere.
pub fn expect_shares(
    client: &Host,
    ports: &mut SourcePorts,
    vip: SocketAddr,
    count: usize,
    members: &[&Member<'_>],
    label: &str,
    expected: &str,
) -> Tally {
    let deadline = Duration::from_millis(100) * u32::try_from(count).unwrap_or(u32::MAX);
    let tally = crate::traffic::clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        ports.take(count),
        vip,
        count,
        deadline,
    )
    .expect("entering the client namespace");
    let want = shares(members);
    println!("{label}:\n{}", tally.table(&want));
    tally
        .check_shares(&want, balance::SHARE_TOLERANCE)
        .unwrap_or_else(|e| panic!("{expected}:\n{e}"));
    tally
}

/// A `tcp` probe (DESIGN.md §5).
#[derive(Clone, Copy, Debug)]
pub struct TcpProbe {
    /// Probe port; `None` probes the server's own port.
    pub port: Option<u16>,
    pub interval: Duration,
    pub timeout: Duration,
    pub fails: u32,
    pub passes: u32,
}

impl TcpProbe {
    /// Every 300 ms, 1 s timeout, one failure takes a server out, one success brings it
    /// back: quick verdicts for scenarios that are about what happens after them.
    pub fn fast() -> Self {
        TcpProbe {
            port: None,
            interval: Duration::from_millis(300),
            timeout: Duration::from_secs(1),
            fails: 1,
            passes: 1,
        }
    }

    /// The same probe against another port.
    pub fn on_port(self, port: u16) -> Self {
        TcpProbe {
            port: Some(port),
            ..self
        }
    }

    /// TR7 bound for a server that stops answering: `fails × (interval + timeout)`
    /// (propagation, under a millisecond, not included). A refused port is faster.
    pub fn detection_bound(&self) -> Duration {
        (self.interval + self.timeout) * self.fails
    }

    /// Upper recovery bound: `passes × interval`.
    pub fn recovery_bound(&self) -> Duration {
        self.interval * self.passes
    }

    fn render(&self, out: &mut Vec<String>) {
        out.push("[[service.probe]]".into());
        out.push("name = \"tcp\"".into());
        out.push("type = \"tcp\"".into());
        if let Some(port) = self.port {
            out.push(format!("port = {port}"));
        }
        out.push(format!("interval = \"{}ms\"", self.interval.as_millis()));
        out.push(format!("timeout = \"{}ms\"", self.timeout.as_millis()));
        out.push(format!("fails = {}", self.fails));
        out.push(format!("passes = {}", self.passes));
    }
}

/// The TCP service `name` on the topology's IPv4 VIP (port 80 in nat, 8080 in dsr) with
/// `members` and `probe`. `settings` are `[[service]]` lines (`backup_switch = …`).
///
/// Passive checks are off (`max_fails = 0`) unless `settings` says otherwise, so that
/// every verdict comes from the probe and the scenarios' timings are the probe's.
/// The servers and the probe are rendered into [`Service::extra`] as sub-tables after
/// the settings, because `Service::servers` has no place for spare and backup.
pub fn service(
    topo: &Topology,
    name: &str,
    members: &[Member<'_>],
    probe: &TcpProbe,
    settings: &[&str],
) -> Service {
    let port = balance::vip_port(topo.forwarding(), BACKEND_TCP_PORT, 80);
    let mut svc = Service::on(topo, name, Proto::Tcp, false, port, &[], BACKEND_TCP_PORT);
    if !settings
        .iter()
        .any(|s| s.trim_start().starts_with("max_fails"))
    {
        svc.extra.push("max_fails = 0".into());
    }
    svc.extra.extend(settings.iter().map(|s| (*s).to_owned()));
    for m in members {
        svc.extra.push(String::new());
        svc.extra.push("[[service.server]]".into());
        svc.extra.push(format!("address = \"{}\"", m.addr()));
        svc.extra.push(format!("weight = {}", m.weight));
        if m.spare {
            svc.extra.push("spare = true".into());
        }
        if m.backup > 0 {
            svc.extra.push(format!("backup = {}", m.backup));
        }
    }
    svc.extra.push(String::new());
    probe.render(&mut svc.extra);
    svc
}

/// Testservers on the members' hosts, named after the members, each killable and
/// restartable; optionally a second testserver per host on [`HEALTH_PORT`] that only the
/// probe talks to, so a probe can fail while the service port keeps answering.
pub struct Backends {
    binary: PathBuf,
    hosts: BTreeMap<&'static str, NetNs>,
    servers: BTreeMap<&'static str, NsProcess>,
    health: BTreeMap<&'static str, NsProcess>,
}

impl Backends {
    /// Starts a testserver for every member (tcp [`BACKEND_TCP_PORT`]) and, with
    /// `health_listener`, one on [`HEALTH_PORT`]; waits until each has bound its port.
    pub fn start(
        binary: &Path,
        members: &[Member<'_>],
        health_listener: bool,
    ) -> Result<Backends, Error> {
        let mut b = Backends {
            binary: binary.to_owned(),
            hosts: members
                .iter()
                .map(|m| (m.name, m.host.ns.clone()))
                .collect(),
            servers: BTreeMap::new(),
            health: BTreeMap::new(),
        };
        for m in members {
            b.restart(m.name)?;
            if health_listener {
                b.restart_health(m.name)?;
            }
        }
        Ok(b)
    }

    fn spawn(&self, name: &'static str, port: u16, what: &str) -> Result<NsProcess, Error> {
        let ns = self.hosts.get(name).expect("a member of this scenario");
        let port = port.to_string();
        let p = NsProcess::spawn(
            ns,
            &format!("{what} {name}"),
            &self.binary,
            &["--name", name, "--tcp", &port],
            &[],
        )?;
        p.wait_for_line(0, "ready", SERVER_START)?;
        Ok(p)
    }

    /// Stops `name`'s service server (SIGTERM; its connections are reset).
    pub fn kill(&mut self, name: &'static str) -> Result<(), Error> {
        if let Some(p) = self.servers.remove(name) {
            p.stop(STOP_GRACE)?;
        }
        Ok(())
    }

    /// Starts `name`'s service server again (no-op while it runs).
    pub fn restart(&mut self, name: &'static str) -> Result<(), Error> {
        if !self.servers.contains_key(name) {
            let p = self.spawn(name, BACKEND_TCP_PORT, "testserver")?;
            self.servers.insert(name, p);
        }
        Ok(())
    }

    /// Stops `name`'s health listener: its probe fails, its service port still answers.
    pub fn kill_health(&mut self, name: &'static str) -> Result<(), Error> {
        if let Some(p) = self.health.remove(name) {
            p.stop(STOP_GRACE)?;
        }
        Ok(())
    }

    /// Starts `name`'s health listener again.
    pub fn restart_health(&mut self, name: &'static str) -> Result<(), Error> {
        if !self.health.contains_key(name) {
            let p = self.spawn(name, HEALTH_PORT, "health listener")?;
            self.health.insert(name, p);
        }
        Ok(())
    }
}

/// Client source ports handed out in disjoint ranges, one per traffic phase, so that no
/// phase meets a flow-table entry (or a TIME_WAIT socket) of an earlier one.
#[derive(Debug)]
pub struct SourcePorts {
    next: u16,
}

impl SourcePorts {
    /// Ports from 10000 up.
    pub fn new() -> Self {
        SourcePorts { next: 10_000 }
    }

    /// The first of `count` fresh ports.
    pub fn take(&mut self, count: usize) -> u16 {
        let first = self.next;
        self.next = u16::try_from(usize::from(first) + count)
            .ok()
            .filter(|n| *n < 61_000)
            .expect("source ports 10000..61000 exhausted: fewer connections per scenario");
        first
    }
}

impl Default for SourcePorts {
    fn default() -> Self {
        Self::new()
    }
}

/// `count` TCP connections from `src:first_port+i` to `dst`, each given `connect` to be
/// answered (a greeting line), one after the other; stops at `deadline`. For phases where
/// connections are expected to fail: a dropped SYN costs `connect`, not the 2 s of
/// [`crate::traffic::clients::tcp_names`].
pub fn tcp_attempts(
    ns: &NetNs,
    src: IpAddr,
    first_port: u16,
    dst: SocketAddr,
    count: usize,
    connect: Duration,
    deadline: Duration,
) -> Result<Tally, Error> {
    ns.run(|| {
        let start = Instant::now();
        let mut tally = Tally::default();
        for i in 0..count {
            let port = first_port.saturating_add(i as u16);
            if start.elapsed() > deadline || crate::util::interrupt::requested() {
                tally.failures.push(format!(
                    "stopped after {i} of {count}: deadline {deadline:?} passed or interrupted"
                ));
                break;
            }
            tally.attempted += 1;
            match greet(SocketAddr::new(src, port), dst, connect) {
                Ok(name) => *tally.counts.entry(name).or_default() += 1,
                Err(err) => tally.failures.push(format!("port {port}: {err}")),
            }
        }
        tally.elapsed = start.elapsed();
        tally
    })
}

/// Opens connections from `src` (ephemeral ports) to `vip` until one is greeted by
/// `backend`, at most `tries`; the others are closed. The returned connection is a
/// long-lived flow pinned to `backend`.
pub fn echo_on(
    ns: &NetNs,
    src: IpAddr,
    vip: SocketAddr,
    backend: &str,
    tries: usize,
) -> Result<EchoConn, String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..tries {
        let conn = EchoConn::connect(ns, src, vip)
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("connecting to {vip}: {e}"))?;
        if conn.backend() == backend {
            return Ok(conn);
        }
        *seen.entry(conn.backend().to_owned()).or_default() += 1;
    }
    Err(format!(
        "none of {tries} connections to {vip} reached {backend}; they reached {seen:?}"
    ))
}

/// One connection of a [`Stream`]: when it was attempted, and the backend that answered
/// or what went wrong.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub at: Instant,
    pub result: Result<String, String>,
}

/// New connections in the background, one every `pace`, each from a fresh source port,
/// each given `connect` to be answered (so a dropped SYN counts as a failure instead of
/// being retransmitted); stops when told, at `limit`, when its ports run out, or on
/// Ctrl-C.
/// Dropping it unfinished stops it too.
pub struct Stream {
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<Result<Vec<Attempt>, Error>>>,
}

impl Stream {
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        ns: &NetNs,
        src: IpAddr,
        first_port: u16,
        ports: usize,
        dst: SocketAddr,
        pace: Duration,
        connect: Duration,
        limit: Duration,
    ) -> Stream {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let ns = ns.clone();
        let handle = thread::spawn(move || {
            ns.run(|| {
                let started = Instant::now();
                let mut attempts = Vec::new();
                for i in 0..ports {
                    if flag.load(Ordering::Relaxed)
                        || started.elapsed() > limit
                        || crate::util::interrupt::requested()
                    {
                        break;
                    }
                    let Some(port) = u16::try_from(i)
                        .ok()
                        .and_then(|i| first_port.checked_add(i))
                    else {
                        break;
                    };
                    let at = Instant::now();
                    let result = greet(SocketAddr::new(src, port), dst, connect)
                        .map_err(|e| format!("port {port}: {e}"));
                    attempts.push(Attempt { at, result });
                    thread::sleep(pace);
                }
                attempts
            })
        });
        Stream {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the stream and returns every attempt in order.
    pub fn finish(mut self) -> Result<Vec<Attempt>, Error> {
        self.stop.store(true, Ordering::Relaxed);
        let handle = self.handle.take().expect("joined only here or on drop");
        match handle.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// `name: n (x %)` per answering backend, for one-line reports.
pub fn spread(tally: &Tally) -> String {
    let mut out = String::new();
    for (name, n) in &tally.counts {
        let _ = write!(out, "{name} {n} ({:.1}%), ", 100.0 * tally.share(name));
    }
    let _ = write!(out, "{} of {} answered", tally.answered(), tally.attempted);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ports_are_disjoint() {
        let mut p = SourcePorts::new();
        let a = p.take(600);
        let b = p.take(10);
        assert_eq!((a, b), (10_000, 10_600));
        assert_eq!(p.take(1), 10_610);
    }

    #[test]
    fn probe_bounds_and_rendering() {
        let p = TcpProbe::fast().on_port(HEALTH_PORT);
        assert_eq!(p.detection_bound(), Duration::from_millis(1300));
        assert_eq!(p.recovery_bound(), Duration::from_millis(300));
        let mut lines = Vec::new();
        p.render(&mut lines);
        let text = lines.join("\n");
        for want in [
            "type = \"tcp\"",
            "port = 9000",
            "interval = \"300ms\"",
            "timeout = \"1000ms\"",
        ] {
            assert!(text.contains(want), "{want:?} missing:\n{text}");
        }
    }
}
