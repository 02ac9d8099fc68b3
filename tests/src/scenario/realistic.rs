//! The test bed of the realistic-traffic scenarios (`netns_traffic_*`, `lb-soak`): backends
//! that serve HTTP as real ones do (closing first, or keep-alive) next to an http health
//! endpoint switchable through a control file, a web service with the default passive
//! settings and one http probe, the agent started as an operator starts it, and the
//! readings a scenario judges by: transitions from the API, the probe's `check-config`
//! bounds, data-plane counters, `TcpExtPAWSTimewait` of the backends, agent RSS, and in nat
//! the `LB_NAT` census (`nat_census`: how near any client came to `drop_nat_ports`).

use std::{
    collections::BTreeMap, fmt::Write as _, net::SocketAddr, path::Path, thread, time::Duration,
};

use crate::{
    agent::{
        api::{self, Api, ApiError, EventView, ServiceView},
        daemon::{Agent, AgentConfig, NAT_PORTS, Proto, START_TIMEOUT, Service},
        nat_census::{self, NatCensus},
    },
    net::{
        netns::NetNs,
        topology::{Forwarding, Topology},
    },
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{self, HealthServers, MARGIN, Probe},
    },
    traffic::{
        ordinary::{self, Ordinary, OrdinaryConfig, PinnedConn},
        pacer::wall_now,
    },
    util::error::Error,
};

/// The service's name in the config and the API.
pub const SERVICE: &str = "web";
/// The UDP service of [`Bed::start_with`].
pub const UDP_SERVICE: &str = "dns";
/// Wait for the baseline (every server up and probed once): the probe's first round is
/// spread over one interval (2 s), twice that plus a margin for a loaded machine.
pub const BASELINE_WAIT: Duration = Duration::from_secs(20);

/// The one http probe of the scenarios: `GET /health` every 2 s, 1 s timeout, 2 fails,
/// 2 passes; `check-config` bound 2 × (2 s + 1 s) = 6 s for a dead server, 4 s for a
/// wrong status, recovery within 4 s. The timeout leaves room for a loaded machine: a
/// probe that times out on a healthy server would be a transition the scenarios forbid.
pub fn http_probe() -> Probe {
    Probe::http(Duration::from_secs(2), Duration::from_secs(1), 2, 2)
}

/// One server of the service by its role; `backend` indexes the topology's `b1..bN`.
#[derive(Clone, Copy, Debug)]
pub struct Role {
    /// What the scenario calls it (`b1`, `p1`, `s1`…); its web service answers with it.
    pub name: &'static str,
    pub backend: usize,
    pub weight: u32,
    pub spare: bool,
    /// Backup level; 0 = primary group.
    pub backup: u32,
}

impl Role {
    pub fn primary(name: &'static str, backend: usize) -> Role {
        Role {
            name,
            backend,
            weight: 1,
            spare: false,
            backup: 0,
        }
    }

    pub fn spare(name: &'static str, backend: usize) -> Role {
        Role {
            spare: true,
            ..Role::primary(name, backend)
        }
    }

    pub fn backup(name: &'static str, backend: usize, level: u32) -> Role {
        Role {
            backup: level,
            ..Role::primary(name, backend)
        }
    }

    /// `n` primaries `b1..bn` of weight 1 on the backends of the same names.
    pub fn primaries(n: usize) -> Vec<Role> {
        const NAMES: [&str; 8] = ["b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8"];
        (0..n).map(|i| Role::primary(NAMES[i], i)).collect()
    }
}

/// The web service on the topology's IPv4 VIP (80 in nat, 8080 in dsr) over `roles`
/// on port 8080, with `probe` and the default passive settings (nothing about
/// `max_fails` or `fail_timeout` is written).
pub fn web_service(topo: &Topology, roles: &[Role], probe: &Probe) -> Service {
    let port = balance::vip_port(topo.forwarding(), BACKEND_TCP_PORT, 80);
    let mut svc = Service::on(
        topo,
        SERVICE,
        Proto::Tcp,
        false,
        port,
        &[],
        BACKEND_TCP_PORT,
    );
    for r in roles {
        let host = &topo.backends()[r.backend];
        svc.extra.push(String::new());
        svc.extra.push("[[service.server]]".into());
        svc.extra
            .push(format!("address = \"{}:{BACKEND_TCP_PORT}\"", host.ipv4));
        svc.extra.push(format!("weight = {}", r.weight));
        if r.spare {
            svc.extra.push("spare = true".into());
        }
        if r.backup > 0 {
            svc.extra.push(format!("backup = {}", r.backup));
        }
    }
    health::with_health(svc, &[], std::slice::from_ref(probe))
}

/// One lb-testserver per role: `--web 8080` (the service), `--http 8000` (`/health`,
/// switchable through a control file: `"http 500"` makes it answer 500 while the web
/// service keeps answering, `""` restores it), `--udp 8081`; killable and restartable by
/// name.
pub type WebServers = HealthServers;

/// Starts a [`WebServers`] server for every role and waits until each has bound its ports.
pub fn web_servers(topo: &Topology, binary: &Path, roles: &[Role]) -> Result<WebServers, Error> {
    let hosts = roles
        .iter()
        .map(|r| (r.name.to_owned(), topo.backends()[r.backend].ns.clone()))
        .collect();
    let service = [
        "--web",
        &BACKEND_TCP_PORT.to_string(),
        "--max-conns",
        "4096",
    ]
    .map(str::to_owned)
    .to_vec();
    let names: Vec<&str> = roles.iter().map(|r| r.name).collect();
    HealthServers::start_on(topo.dir(), binary, hosts, service, &names)
}

/// A running bed: topology, servers, agent (started as an operator does), its API, and
/// the probe's `check-config` bounds. Drops the agent, then the servers, then the
/// namespaces.
pub struct Bed {
    pub agent: Agent,
    pub servers: WebServers,
    pub api: Api,
    pub vip: SocketAddr,
    pub roles: Vec<Role>,
    /// What `lb-agent check-config` prints for the probe.
    pub bounds: lb_agent::config::Bounds,
    /// Wall time at which every server was up and probed (the baseline).
    pub baseline: f64,
    pub topo: Topology,
}

impl Bed {
    /// Builds a topology of `roles.len()` backends for `forwarding` on subnet `subnet`,
    /// starts the servers and the agent, and waits for the baseline. Panics naming the
    /// step that failed: it is for tests and the soak.
    pub fn start(forwarding: Forwarding, subnet: u8, roles: &[Role], testserver: &Path) -> Bed {
        Bed::start_with(forwarding, subnet, roles, testserver, false)
    }

    /// [`start`](Self::start), with `udp`: also the UDP service [`UDP_SERVICE`] (VIP port
    /// 53 in nat, 8081 in dsr) over the same servers' port 8081, without a probe, default
    /// passive settings.
    pub fn start_with(
        forwarding: Forwarding,
        subnet: u8,
        roles: &[Role],
        testserver: &Path,
        udp: bool,
    ) -> Bed {
        Bed::start_on(forwarding, subnet, roles, testserver, udp, true)
    }

    /// [`start`](Self::start) with the kernels resolving every neighbour by ARP/NDP, as
    /// on a real network (no permanent entries): a backend whose MAC changes is learnt
    /// from its announcement.
    pub fn start_resolving(
        forwarding: Forwarding,
        subnet: u8,
        roles: &[Role],
        testserver: &Path,
    ) -> Bed {
        Bed::start_on(forwarding, subnet, roles, testserver, false, false)
    }

    fn start_on(
        forwarding: Forwarding,
        subnet: u8,
        roles: &[Role],
        testserver: &Path,
        udp: bool,
        static_neighbours: bool,
    ) -> Bed {
        let backends = roles.iter().map(|r| r.backend + 1).max().unwrap_or(1);
        let topo = Topology::builder()
            .backends(backends)
            .forwarding(forwarding)
            .subnet(subnet)
            .static_neighbours(static_neighbours)
            .build()
            .expect("building the topology");
        let servers =
            web_servers(&topo, testserver, roles).expect("starting a web server per role");
        let service = web_service(&topo, roles, &http_probe());
        let vip = service.vip;
        let mut services = vec![service];
        if udp {
            let backends: Vec<_> = roles
                .iter()
                .map(|r| (&topo.backends()[r.backend], r.weight))
                .collect();
            let mut dns = balance::udp_service(&topo, &backends);
            dns.name = UDP_SERVICE.to_owned();
            services.push(dns);
        }
        let binary = crate::agent::daemon::locate_binary("lb-agent").expect("finding lb-agent");
        let agent =
            Agent::start_as_operator(&topo, &binary, &AgentConfig::new(services), START_TIMEOUT)
                .expect("starting lb-agent run --config in the lb namespace");
        let bounds = probe_bounds(agent.config_path());
        let api = Api::new(&topo.lb().ns);
        let addrs: Vec<SocketAddr> = roles.iter().map(|r| addr_of(&topo, r)).collect();
        health::wait_all_probed_up(&api, SERVICE, &addrs, BASELINE_WAIT)
            .expect("every server up and probed once before traffic");
        // The last start-up transition (a spare's `checking -> up`) may have been stamped
        // within the events' clock slack of the answer that showed it: the baseline
        // starts after that slack.
        thread::sleep(Duration::from_millis(20));
        Bed {
            agent,
            servers,
            api,
            vip,
            roles: roles.to_vec(),
            bounds,
            baseline: wall_now(),
            topo,
        }
    }

    /// The service address of the role named `name`.
    pub fn addr(&self, name: &str) -> SocketAddr {
        let r = self
            .roles
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no role {name}"));
        addr_of(&self.topo, r)
    }

    /// The role name of a server address (the address itself when none).
    pub fn name_of(&self, server: &str) -> String {
        self.roles
            .iter()
            .find(|r| addr_of(&self.topo, r).to_string() == server)
            .map_or_else(|| server.to_owned(), |r| r.name.to_owned())
    }

    /// Transitions (server state changes) and membership notes (`server` = `-`) the API
    /// lists from wall time `after` on.
    pub fn events_since(&self, after: f64) -> Result<Vec<EventView>, ApiError> {
        Ok(self
            .api
            .events()?
            .into_iter()
            .filter(|e| health::event_time(e) >= after - 0.005)
            .collect())
    }

    /// One line per event, with role names and times relative to `t0`.
    pub fn describe_events(&self, events: &[EventView], t0: f64) -> String {
        let mut out = String::new();
        for e in events {
            let _ = writeln!(
                out,
                "  +{:.2} s {} {} -> {} ({})",
                health::event_time(e) - t0,
                self.name_of(&e.server),
                e.from,
                e.to,
                e.cause
            );
        }
        if out.is_empty() {
            out.push_str("  (none)\n");
        }
        out
    }

    /// The data-plane counters that show port pressure and flow churn, from `/metrics`.
    pub fn counters(&self) -> Result<BTreeMap<&'static str, u64>, ApiError> {
        let text = self.api.metrics()?;
        Ok(PRESSURE_COUNTERS
            .iter()
            .map(|c| {
                let v = api::counter(&text, c);
                (*c, v.unwrap_or(0.0) as u64)
            })
            .collect())
    }

    /// `TcpExtPAWSTimewait` summed over the backends (SYNs a backend's TIME_WAIT
    /// socket dropped because their timestamp went backwards: a reused 5-tuple).
    pub fn paws_timewait(&self) -> Result<u64, Error> {
        let mut sum = 0;
        for b in self.topo.backends() {
            sum += tcp_ext(&b.ns, "PAWSTimewait")?.unwrap_or(0);
        }
        Ok(sum)
    }

    /// The agent's resident memory in KiB.
    pub fn agent_rss_kib(&self) -> Option<u64> {
        health::rss_kib(self.agent.process().pid())
    }
}

/// Counters reported as port pressure and churn (the `nat_port_*` side counters give the
/// pairs' utilisation: docs/nat-ports.md, "Port pressure: the counters").
pub const PRESSURE_COUNTERS: [&str; 11] = [
    "flow_new",
    "flow_rehash",
    "tx_nat_forward",
    "nat_port_first",
    "nat_port_retried",
    "nat_port_reclaimed",
    "drop_nat_ports",
    "drop_no_backend",
    "drop_bad_source",
    "drop_source_limit",
    "events_lost",
];

fn addr_of(topo: &Topology, r: &Role) -> SocketAddr {
    SocketAddr::new(topo.backends()[r.backend].ipv4.into(), BACKEND_TCP_PORT)
}

/// The bounds `lb-agent check-config` prints for the (one) probe of the file, computed
/// by the same library function.
pub fn probe_bounds(config: &Path) -> lb_agent::config::Bounds {
    let cfg = lb_agent::config::load(config)
        .unwrap_or_else(|e| panic!("the agent's own config does not load: {e}"));
    let probe = cfg
        .services
        .first()
        .and_then(|s| s.probes.first())
        .expect("the service has a probe");
    lb_agent::config::detection_bounds(probe)
}

/// The `TcpExt` counter `name` of namespace `ns` (`/proc/net/netstat` as the namespace
/// sees it).
pub fn tcp_ext(ns: &NetNs, name: &str) -> Result<Option<u64>, Error> {
    let text = ns.run(|| std::fs::read_to_string("/proc/thread-self/net/netstat"))?;
    Ok(text.ok().and_then(|t| netstat_value(&t, "TcpExt:", name)))
}

/// The value of `name` in the `prefix` section (`TcpExt:`) of a `/proc/net/netstat`
/// text: a line of names followed by a line of values.
fn netstat_value(text: &str, prefix: &str, name: &str) -> Option<u64> {
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(prefix)).collect();
    let [names, values] = lines.as_slice() else {
        return None;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netstat_values_by_name() {
        let text = "TcpExt: SyncookiesSent PAWSTimewait Other\nTcpExt: 0 529 7\n\
                    IpExt: InNoRoutes PAWSTimewait\nIpExt: 1 99\n";
        assert_eq!(netstat_value(text, "TcpExt:", "PAWSTimewait"), Some(529));
        assert_eq!(netstat_value(text, "TcpExt:", "Missing"), None);
        assert_eq!(netstat_value(text, "IpExt:", "PAWSTimewait"), Some(99));
        assert_eq!(netstat_value("", "TcpExt:", "PAWSTimewait"), None);
    }

    #[test]
    fn http_probe_has_the_documented_bound() {
        let text = http_probe().render().join("\n");
        assert!(text.contains("interval = \"2000ms\""), "{text}");
        assert!(text.contains("fails = 2"), "{text}");
        assert_eq!(
            http_probe().detection_bound(),
            std::time::Duration::from_secs(6)
        );
    }
}

/// What a scenario measured besides the requests: for the "before/after" figures.
#[derive(Clone, Debug, Default)]
pub struct Readings {
    /// Server state changes since the baseline.
    pub transitions: usize,
    /// Membership notes (spares, levels, fail-open) since the baseline.
    pub notes: usize,
    /// `TcpExtPAWSTimewait` over the backends during the run.
    pub paws_timewait: u64,
    /// Data-plane counters' growth during the run.
    pub counters: BTreeMap<&'static str, u64>,
    pub agent_rss_kib: Option<u64>,
    /// nat: the `LB_NAT` census at the end (or why it could not be taken).
    pub nat_census: Option<Result<NatCensus, String>>,
}

/// Counters and PAWS drops at the start of a run, to take differences at its end.
pub struct Start {
    paws: u64,
    counters: BTreeMap<&'static str, u64>,
}

impl Bed {
    /// Readings now, for [`finish_readings`](Self::finish_readings) at the end.
    pub fn start_readings(&self) -> Start {
        Start {
            paws: self.paws_timewait().expect("reading the backends' TcpExt"),
            counters: self.counters().expect("reading /metrics"),
        }
    }

    /// The readings since `start` (events since the baseline).
    pub fn finish_readings(&self, start: &Start, events: &[EventView]) -> Readings {
        let now = self.counters().expect("reading /metrics");
        Readings {
            transitions: events.iter().filter(|e| e.server != "-").count(),
            notes: events.iter().filter(|e| e.server == "-").count(),
            paws_timewait: self
                .paws_timewait()
                .expect("reading the backends' TcpExt")
                .saturating_sub(start.paws),
            counters: now
                .iter()
                .map(|(k, v)| {
                    (
                        *k,
                        v.saturating_sub(start.counters.get(k).copied().unwrap_or(0)),
                    )
                })
                .collect(),
            agent_rss_kib: self.agent_rss_kib(),
            nat_census: (self.topo.forwarding() == Forwarding::Nat).then(|| self.nat_census()),
        }
    }

    /// The web service's `LB_NAT` census (every source port of the client checked).
    pub fn nat_census(&self) -> Result<NatCensus, String> {
        let lb = self
            .topo
            .lb()
            .addr(false)
            .ok_or("the lb host has no IPv4 address")?;
        let client = self
            .topo
            .client()
            .addr(false)
            .ok_or("the client has no IPv4 address")?;
        nat_census::take(&nat_census::Scope {
            vip: self.vip.ip(),
            vip_port: self.vip.port(),
            snat: &[lb],
            ports: NAT_PORTS,
            clients: &[client],
        })
        .map_err(|e| e.to_string())
    }
}

impl Readings {
    /// One line.
    pub fn line(&self) -> String {
        format!(
            "transitions {}, membership notes {}, TcpExtPAWSTimewait {}, agent RSS {} KiB, counters {:?}",
            self.transitions,
            self.notes,
            self.paws_timewait,
            self.agent_rss_kib
                .map_or_else(|| "?".to_owned(), |k| k.to_string()),
            self.counters
        ) + &match &self.nat_census {
            Some(Ok(c)) => format!("\n  {c}"),
            Some(Err(e)) => format!("\n  LB_NAT census: {e}"),
            None => String::new(),
        }
    }
}

/// What the API must show at one step of a [`Takeover`], and what a timeout means.
pub struct Expect<'a> {
    /// What is waited for (in the API error).
    pub what: &'a str,
    pub cond: &'a dyn Fn(&ServiceView) -> bool,
    /// The failure's message before `": {error}"`.
    pub failed: String,
}

/// A take-over under ordinary traffic: the health endpoints of `failing` answer 500 for
/// a while, then heal; a keep-alive connection is held on the first of them.
pub struct Takeover<'a> {
    pub label: &'a str,
    /// Traffic before the failure, after the wait for `out` and after the wait for `back`.
    pub phase: Duration,
    pub failing: &'a [&'static str],
    /// Within `detect_fast` (plus margins) of the 500s.
    pub out: Expect<'a>,
    /// Within `recover_max` (plus margins) of the healing.
    pub back: Expect<'a>,
    /// The only servers that may change state.
    pub changing: &'a [SocketAddr],
    /// The message when another server changed state (before `":\n{events}"`).
    pub others_changed: String,
    /// The first line of the printed figures, from the seconds to `out` and to `back`.
    pub headline: &'a dyn Fn(f64, f64) -> String,
}

/// What a [`Takeover`] saw, for the scenario's own checks; wall-clock times in seconds.
pub struct TakeoverRun {
    pub report: ordinary::Report,
    pub events: Vec<EventView>,
    /// When the 500s began and when the API showed `out`.
    pub failing: f64,
    pub out_at: f64,
    /// When the endpoints healed and when the API showed `back`.
    pub healed: f64,
    pub back_at: f64,
}

impl Bed {
    /// Runs `t` and checks what every take-over must keep: both waits met, the held
    /// connection answered throughout, only `changing` servers changed state, nothing
    /// failed open and no request failed. Prints the figures first.
    pub fn takeover(&self, t: &Takeover) -> TakeoverRun {
        let label = t.label;
        let held_on = t.failing[0];
        let start = self.start_readings();
        // Long enough for three phases and both verdicts; stopped at the end.
        let traffic = Ordinary::start(
            &self.topo.client().ns,
            &OrdinaryConfig::new(self.vip, t.phase * 3 + Duration::from_secs(40)),
        );
        let mut held = PinnedConn::open_on(&self.topo.client().ns, self.vip, held_on, 64)
            .unwrap_or_else(|e| panic!("{label}: a keep-alive connection on {held_on}: {e}"));
        thread::sleep(t.phase);

        let failing = self.control_all(t.failing, "http 500\n");
        let wait = self.bounds.detect_fast + MARGIN * 2;
        // A wait that fails is reported after the traffic's figures, at the end.
        let went_out = self
            .api
            .wait_service(SERVICE, t.out.what, wait, t.out.cond)
            .map_err(|e| format!("{}: {e}", t.out.failed));
        let out_at = failing + went_out.as_ref().map_or(f64::NAN, |(_, t)| t.as_secs_f64());
        // The connection held keeps working while its server is out (30 requests, under
        // the server's keep-alive cap of 100).
        let held_answers = held.requests_for(t.phase, t.phase / 30);

        let healed = self.control_all(t.failing, "");
        let wait = self.bounds.recover_max + MARGIN * 2;
        let came_back = self
            .api
            .wait_service(SERVICE, t.back.what, wait, t.back.cond)
            .map_err(|e| format!("{}: {e}", t.back.failed));
        let back_at = healed
            + came_back
                .as_ref()
                .map_or(f64::NAN, |(_, t)| t.as_secs_f64());
        thread::sleep(t.phase);
        let report = traffic.finish(true);
        let events = self
            .events_since(self.baseline)
            .expect("reading the events");
        let readings = self.finish_readings(&start, &events);
        println!(
            "{}\n  {}  {}\n  events since the baseline:\n{}",
            (t.headline)(out_at - failing, back_at - healed),
            report.summary(),
            readings.line(),
            self.describe_events(&events, failing)
        );

        println!(
            "{label}: the connection held on {held_on} while it was out: {}",
            ordinary::held_summary(&held_answers, held_on)
        );
        if let Err(e) = went_out.and(came_back) {
            panic!("{e}");
        }
        assert!(
            held_answers.iter().all(|a| a.as_deref() == Ok(held_on)),
            "{label}: a working keep-alive connection to {held_on} must keep answering while \
             {held_on} is out of the table: {}",
            ordinary::held_summary(&held_answers, held_on)
        );
        let others: Vec<_> = events
            .iter()
            .filter(|e| e.server != "-" && !t.changing.iter().any(|a| e.server == a.to_string()))
            .collect();
        assert!(
            others.is_empty(),
            "{}:\n{}",
            t.others_changed,
            self.describe_events(&events, failing)
        );
        assert!(
            !events.iter().any(|e| e.cause.contains("fail-open")),
            "{label}: nothing may fail open:\n{}",
            self.describe_events(&events, failing)
        );
        assert_eq!(
            report.failures().count(),
            0,
            "{label}: every backend's web service answered throughout; no request may fail:\n{}",
            report.summary()
        );
        TakeoverRun {
            report,
            events,
            failing,
            out_at,
            healed,
            back_at,
        }
    }

    /// Writes `text` to the control files of `names`; the time of the first write.
    fn control_all(&self, names: &[&str], text: &str) -> f64 {
        let at = self.servers.control(names[0], text);
        for name in &names[1..] {
            self.servers.control(name, text);
        }
        at
    }
}
