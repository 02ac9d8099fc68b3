//! Building blocks of the health scenarios (DESIGN.md §5): probes rendered into a
//! service with their TR7 bounds, backend testservers whose answers (HTTP status, hostile
//! modes, UDP reply) are switched at runtime through a control file, and readings of the
//! agent: transition events with their times, per-probe results, resident memory.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use crate::{
    agent::{
        api::{Api, ApiError, EventView, POLL_EVERY},
        daemon::Service,
    },
    net::{netns::NetNs, topology::Topology},
    scenario::balance::{BACKEND_TCP_PORT, BACKEND_UDP_PORT, SERVER_START},
    traffic::pacer::wall_now,
    util::{
        error::Error,
        json::Json,
        process::{NsProcess, STOP_GRACE},
    },
};

/// Port of every health testserver's HTTP listener (what http probes ask).
pub const HTTP_PORT: u16 = 8000;
/// Path the http probes ask and the testservers answer.
pub const HEALTH_PATH: &str = "/health";
/// Slack on every timing bound: scheduling on a loaded two-core machine, the API's poll,
/// the event's millisecond resolution. Propagation itself is under a millisecond.
pub const MARGIN: Duration = Duration::from_secs(1);

/// `type` of a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    Http,
    Tcp,
    Udp,
    Icmp,
}

impl ProbeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Http => "http",
            ProbeKind::Tcp => "tcp",
            ProbeKind::Udp => "udp",
            ProbeKind::Icmp => "icmp",
        }
    }
}

/// One `[[service.probe]]`.
#[derive(Clone, Debug)]
pub struct Probe {
    pub name: String,
    pub kind: ProbeKind,
    /// `port`; `None` probes the server's own port.
    pub port: Option<u16>,
    pub interval: Duration,
    pub timeout: Duration,
    pub fails: u32,
    pub passes: u32,
    pub essential: bool,
    /// Kind-specific `key = value` lines (`uri`, `expect_body`, `send`, `expect`…).
    pub keys: Vec<String>,
}

impl Probe {
    /// A probe of `kind` with the given timing; no port, no extra keys.
    pub fn new(
        name: &str,
        kind: ProbeKind,
        interval: Duration,
        timeout: Duration,
        fails: u32,
        passes: u32,
    ) -> Self {
        Probe {
            name: name.to_owned(),
            kind,
            port: None,
            interval,
            timeout,
            fails,
            passes,
            essential: false,
            keys: Vec::new(),
        }
    }

    /// An http probe of `GET /health` on [`HTTP_PORT`].
    pub fn http(interval: Duration, timeout: Duration, fails: u32, passes: u32) -> Self {
        Probe::new("health", ProbeKind::Http, interval, timeout, fails, passes)
            .port(HTTP_PORT)
            .key(&format!("uri = {HEALTH_PATH:?}"))
    }

    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Adds a `key = value` line, written as given.
    pub fn key(mut self, line: &str) -> Self {
        self.keys.push(line.to_owned());
        self
    }

    pub fn essential(mut self) -> Self {
        self.essential = true;
        self
    }

    /// TR7: a server that stops answering is out within `fails × (interval + timeout)`.
    pub fn detection_bound(&self) -> Duration {
        (self.interval + self.timeout) * self.fails
    }

    /// A failure known at once (refused port, wrong status): `fails × interval`.
    pub fn immediate_bound(&self) -> Duration {
        self.interval * self.fails
    }

    /// Recovery takes at most `passes × interval`.
    pub fn recovery_bound(&self) -> Duration {
        self.interval * self.passes
    }

    /// The `[[service.probe]]` table.
    pub fn render(&self) -> Vec<String> {
        let mut out = vec![
            "[[service.probe]]".to_owned(),
            format!("name = {:?}", self.name),
            format!("type = {:?}", self.kind.as_str()),
        ];
        if let Some(port) = self.port {
            out.push(format!("port = {port}"));
        }
        out.push(format!("interval = \"{}ms\"", self.interval.as_millis()));
        out.push(format!("timeout = \"{}ms\"", self.timeout.as_millis()));
        out.push(format!("fails = {}", self.fails));
        out.push(format!("passes = {}", self.passes));
        if self.essential {
            out.push("essential = true".to_owned());
        }
        out.extend(self.keys.iter().cloned());
        out
    }
}

/// `svc` with `settings` (`[[service]]` keys such as `max_fails = 0`) and `probes`.
///
/// Both go into [`Service::extra`], settings first: the probe tables that follow them
/// are sub-tables of the service, and the `[[service.server]]` tables the config writes
/// after `extra` still belong to the same service.
pub fn with_health(mut svc: Service, settings: &[&str], probes: &[Probe]) -> Service {
    svc.extra.extend(settings.iter().map(|s| (*s).to_owned()));
    for p in probes {
        svc.extra.push(String::new());
        svc.extra.extend(p.render());
    }
    svc
}

/// One lb-testserver per backend host (`--tcp 8080 --udp 8081 --http 8000`, or with
/// `--web` for the realistic-traffic beds), each with a control file for switching its
/// answers, killable and restartable by role (`b1`…).
pub struct HealthServers {
    binary: PathBuf,
    dir: PathBuf,
    hosts: BTreeMap<String, NetNs>,
    running: BTreeMap<String, NsProcess>,
    /// What each server serves on the service port: `--tcp 8080` (echo) or `--web 8080`
    /// (HTTP that closes first or keeps alive), plus any extra flags.
    service: Vec<String>,
}

impl HealthServers {
    /// Knows every backend of `topo`; starts those named in `start` (TCP echo servers)
    /// and waits until each has bound its ports.
    pub fn start(topo: &Topology, binary: &Path, start: &[&str]) -> Result<Self, Error> {
        let hosts = topo
            .backends()
            .iter()
            .map(|b| (b.role.clone(), b.ns.clone()))
            .collect();
        let service = vec!["--tcp".to_owned(), BACKEND_TCP_PORT.to_string()];
        Self::start_on(topo.dir(), binary, hosts, service, start)
    }

    /// Servers on `hosts` (name → namespace) serving `service` on the service port,
    /// their control files in `dir`; starts those named in `start`.
    pub fn start_on(
        dir: &Path,
        binary: &Path,
        hosts: BTreeMap<String, NetNs>,
        service: Vec<String>,
        start: &[&str],
    ) -> Result<Self, Error> {
        let mut s = HealthServers {
            binary: binary.to_owned(),
            dir: dir.to_owned(),
            hosts,
            running: BTreeMap::new(),
            service,
        };
        for role in start {
            s.restart(role)?;
        }
        Ok(s)
    }

    /// The control file of `role`'s server (absent: the default answers).
    pub fn control_path(&self, role: &str) -> PathBuf {
        self.dir.join(format!("control-{role}"))
    }

    /// Replaces `role`'s control file with `text` (atomically) and returns the wall
    /// time at which the new answers are in force (every request reads the file).
    pub fn control(&self, role: &str, text: &str) -> f64 {
        let path = self.control_path(role);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        wall_now()
    }

    /// Starts `role`'s server (no-op while it runs); returns the wall time just before
    /// the start.
    pub fn restart(&mut self, role: &str) -> Result<f64, Error> {
        let before = wall_now();
        if self.running.contains_key(role) {
            return Ok(before);
        }
        let ns = self
            .hosts
            .get(role)
            .unwrap_or_else(|| panic!("{role} is not a backend of this topology"));
        let control = self.control_path(role).display().to_string();
        let (udp, http) = (BACKEND_UDP_PORT.to_string(), HTTP_PORT.to_string());
        let mut args = vec!["--name", role];
        args.extend(self.service.iter().map(String::as_str));
        args.extend([
            "--udp",
            &udp,
            "--http",
            &http,
            "--http-path",
            HEALTH_PATH,
            "--control",
            &control,
        ]);
        let p = NsProcess::spawn(ns, &format!("testserver {role}"), &self.binary, &args, &[])?;
        p.wait_for_line(0, "ready", SERVER_START)?;
        self.running.insert(role.to_owned(), p);
        Ok(before)
    }

    /// SIGKILLs `role`'s server (its ports close with it); returns the wall time just
    /// before the signal.
    pub fn kill(&mut self, role: &str) -> Result<f64, Error> {
        let p = self
            .running
            .remove(role)
            .unwrap_or_else(|| panic!("{role}'s server is not running"));
        let at = wall_now();
        p.signal(libc::SIGKILL)?;
        p.stop(STOP_GRACE)?;
        Ok(at)
    }
}

/// Wall-clock seconds of an event (its time has millisecond resolution).
pub fn event_time(e: &EventView) -> f64 {
    e.unix_seconds()
        .unwrap_or_else(|| panic!("event time {:?} is not RFC 3339", e.time))
}

/// The first event of server `server` (its address) going to `to`, at or after the wall
/// time `after` (less 5 ms, for the event's millisecond resolution).
pub fn find_event(
    events: &[EventView],
    server: SocketAddr,
    to: &str,
    after: f64,
) -> Option<EventView> {
    let server = server.to_string();
    events
        .iter()
        .find(|e| e.server == server && e.to == to && event_time(e) >= after - 0.005)
        .cloned()
}

/// Polls `/api/v1/events` until [`find_event`] finds `server` going to `to` after
/// `after`.
pub fn wait_event(
    api: &Api,
    server: SocketAddr,
    to: &str,
    after: f64,
    timeout: Duration,
) -> Result<EventView, ApiError> {
    let start = Instant::now();
    loop {
        let events = api.events()?;
        if let Some(e) = find_event(&events, server, to, after) {
            return Ok(e);
        }
        if crate::util::interrupt::requested() {
            return Err(Error::Interrupted {
                what: format!("{server} -> {to}"),
            }
            .into());
        }
        let waited = start.elapsed();
        if waited >= timeout {
            let last: Vec<String> = events
                .iter()
                .rev()
                .take(10)
                .map(|e| {
                    format!(
                        "{} {} {} -> {} ({})",
                        e.time, e.server, e.from, e.to, e.cause
                    )
                })
                .collect();
            return Err(Error::Timeout {
                what: format!("an event {server} -> {to}"),
                waited,
                last: last.join("\n"),
            }
            .into());
        }
        thread::sleep(POLL_EVERY);
    }
}

/// One probe of a server as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeView {
    pub name: String,
    pub count: u64,
    /// `passed`, `failed: <reason>` or `none`.
    pub last_result: String,
    /// The probe's whole record as the API shows it (counters, times, local faults), for
    /// a failing test to print.
    pub record: String,
}

/// The server at `addr` of service `service`: its state and its probes.
pub fn server_health(
    api: &Api,
    service: &str,
    addr: SocketAddr,
) -> Result<(String, Vec<ProbeView>), ApiError> {
    let path = format!("/api/v1/services/{service}");
    let text = api.request_ok("GET", &path, None)?;
    let shape = |what: &str| ApiError::Shape {
        path: path.clone(),
        what: what.to_owned(),
        body: text.clone(),
    };
    let v = Json::parse(&text).map_err(|source| ApiError::Json {
        path: path.clone(),
        source,
    })?;
    let wanted = addr.to_string();
    let server = v
        .get("servers")
        .and_then(Json::as_array)
        .and_then(|all| {
            all.iter()
                .find(|s| s.get("address").and_then(Json::as_str) == Some(wanted.as_str()))
        })
        .ok_or_else(|| shape(&format!("server {wanted}")))?;
    let state = server.str_at(&["state"]).to_owned();
    let probes = server
        .at(&["health", "probes"])
        .and_then(Json::as_object)
        .ok_or_else(|| shape("health.probes"))?
        .iter()
        .map(|(name, p)| ProbeView {
            name: name.clone(),
            count: p.get("count").and_then(Json::as_u64).unwrap_or(0),
            last_result: p.str_at(&["last_result"]).to_owned(),
            record: p.to_string(),
        })
        .collect();
    Ok((state, probes))
}

/// Waits until the API shows the server at `addr` of `service` in `state`; returns its
/// probes as last seen. The agent writes its event log, and answers an API change, a
/// moment before it rebuilds the snapshot the API serves.
pub fn wait_state(
    api: &Api,
    service: &str,
    addr: SocketAddr,
    state: &str,
    timeout: Duration,
) -> Result<Vec<ProbeView>, ApiError> {
    let start = Instant::now();
    loop {
        // A server just added may not be in the snapshot yet.
        let last = match server_health(api, service, addr) {
            Ok((now, probes)) if now == state => return Ok(probes),
            Ok((now, probes)) => format!("{now} {probes:?}"),
            Err(ApiError::Shape { body, .. }) => format!("not listed yet: {body}"),
            Err(err) => return Err(err),
        };
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(Error::Timeout {
                what: format!("{addr} of {service} {state}"),
                waited,
                last,
            }
            .into());
        }
        thread::sleep(POLL_EVERY);
    }
}

/// Waits until every server in `addrs` is `up` and each of its probes has run at least
/// once (the baseline before a scenario breaks something).
pub fn wait_all_probed_up(
    api: &Api,
    service: &str,
    addrs: &[SocketAddr],
    timeout: Duration,
) -> Result<(), ApiError> {
    let start = Instant::now();
    loop {
        let mut pending = Vec::new();
        for a in addrs {
            let (state, probes) = server_health(api, service, *a)?;
            if state != "up" || probes.iter().any(|p| p.count == 0) {
                pending.push(format!("{a} {state} {probes:?}"));
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(Error::Timeout {
                what: format!("every server of {service} up and probed"),
                waited,
                last: pending.join("\n"),
            }
            .into());
        }
        thread::sleep(POLL_EVERY);
    }
}

/// Resident memory of process `pid` in KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// `1.23 s`.
pub fn secs(d: f64) -> String {
    format!("{d:.2} s")
}

/// Local faults the agent counts while the balancer's own queue drops every packet for
/// `window` (a `pfifo` of length 0 on its host interface, removed afterwards): each probe
/// packet fails to leave with `ENOBUFS`, a local fault, never a verdict against a server.
pub fn local_faults_while_the_queue_drops(topo: &Topology, api: &Api, window: Duration) -> f64 {
    let faults = || {
        let text = api.metrics().expect("GET /metrics");
        crate::agent::api::metric(&text, "lb_agent_local_faults_total", &[])
            .expect("local faults metric")
    };
    let tc = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", topo.lb().ns.name(), "tc", "qdisc"])
            .args(args)
            .output()
            .expect("running tc");
        assert!(
            out.status.success(),
            "tc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let before = faults();
    let lb_if = crate::net::topology::HOST_IF;
    tc(&["replace", "dev", lb_if, "root", "pfifo", "limit", "0"]);
    thread::sleep(window);
    tc(&["del", "dev", lb_if, "root"]);
    faults() - before
}

/// `lb_probe_syn_packets_total{kind=KIND}` from the agent's `/metrics` (the SYN check's
/// packet counters: accepted, rejected, unmatched, unreachable, ...).
pub fn syn_packets(api: &Api, kind: &str) -> f64 {
    let text = api.metrics().expect("GET /metrics");
    crate::agent::api::metric(&text, "lb_probe_syn_packets_total", &[("kind", kind)])
        .unwrap_or_else(|| panic!("lb_probe_syn_packets_total{{kind={kind}}} in:\n{text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_tables_and_bounds() {
        let p = Probe::http(Duration::from_secs(1), Duration::from_millis(500), 2, 3)
            .essential()
            .key("expect_body = \"ok\"");
        assert_eq!(p.detection_bound(), Duration::from_secs(3));
        assert_eq!(p.immediate_bound(), Duration::from_secs(2));
        assert_eq!(p.recovery_bound(), Duration::from_secs(3));
        let text = p.render().join("\n");
        for want in [
            "[[service.probe]]",
            "name = \"health\"",
            "type = \"http\"",
            "port = 8000",
            "interval = \"1000ms\"",
            "timeout = \"500ms\"",
            "fails = 2",
            "passes = 3",
            "essential = true",
            "uri = \"/health\"",
            "expect_body = \"ok\"",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        let icmp = Probe::new(
            "ping",
            ProbeKind::Icmp,
            Duration::from_secs(1),
            Duration::from_secs(1),
            1,
            1,
        );
        assert!(!icmp.render().join("\n").contains("port"));
    }

    #[test]
    fn events_are_found_by_server_state_and_time() {
        let ev = |time: &str, server: &str, to: &str| EventView {
            time: time.into(),
            service: "web".into(),
            server: server.into(),
            from: "up".into(),
            to: to.into(),
            cause: "x".into(),
        };
        let events = [
            ev("2026-01-01T00:00:01.000Z", "10.0.0.1:80", "unhealthy"),
            ev("2026-01-01T00:00:02.000Z", "10.0.0.2:80", "unhealthy"),
            ev("2026-01-01T00:00:03.000Z", "10.0.0.1:80", "unhealthy"),
        ];
        let t0 = event_time(&events[0]);
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        assert_eq!(
            find_event(&events, a, "unhealthy", t0).unwrap().time,
            events[0].time
        );
        assert_eq!(
            find_event(&events, a, "unhealthy", t0 + 0.5).unwrap().time,
            events[2].time
        );
        assert!(find_event(&events, a, "up", t0).is_none());
    }

    #[test]
    fn own_rss_is_readable() {
        assert!(rss_kib(std::process::id()).is_some_and(|k| k > 0));
    }
}
