//! The bed of the neighbour scenarios (`netns_neighbour_*`): backends that the lb's kernel
//! resolves by ARP/NDP (no static entries), an http probe, the client's paced
//! connections, and the moves: a backend's MAC changed with or without an announcement,
//! and the judgement of the client's timeline around a move.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use crate::{
    agent::{
        api::Api,
        daemon::{Agent, AgentConfig, START_TIMEOUT, Service, locate_binary},
    },
    net::{
        link::{self, Mac},
        netns::NetNs,
        topology::{Forwarding, HOST_IF, Topology},
    },
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{HealthServers, Probe, wait_all_probed_up, with_health},
    },
    traffic::pacer::{Attempt, PaceConfig, Pacer},
    util::error::Error,
};

/// One new client connection this often.
pub const PACE: Duration = Duration::from_millis(20);
/// Bound of one client connect and greeting.
pub const CONNECT: Duration = Duration::from_secs(1);
/// Wait for the agent's first verdicts on every server.
const FIRST_VERDICTS: Duration = Duration::from_secs(20);
/// What the agent may take from the kernel's change to the maps (the watch's event,
/// the agent's turn, the publish).
pub const FOLLOW: Duration = Duration::from_millis(100);
/// What the agent logs once the maps hold a backend's new MAC.
pub const FOLLOWS_LINE: &str = "backend MAC follows the kernel's neighbour table";

/// How long after `since` (wall-clock seconds) the agent wrote log `line`, by the line's
/// own timestamp (RFC 3339, UTC): neither the test's reading of the log nor the test's
/// own commands after the change count. None if the line has no timestamp.
pub fn logged_after(line: &str, since: f64) -> Option<Duration> {
    let at = crate::agent::api::rfc3339_seconds(line.split_whitespace().next()?)?;
    Some(Duration::from_secs_f64((at - since).max(0.0)))
}

/// The probe of the scenarios: `GET /health` every 500 ms. It is also the traffic that
/// makes the lb's kernel use (and so re-check) its neighbour entries. Ten failures
/// (at least 5 s) before a verdict: longer than the neighbour bounds, so that the
/// neighbour table, not the health check, is what takes a moved backend out.
pub fn probe() -> Probe {
    Probe::http(
        Duration::from_millis(500),
        Duration::from_millis(400),
        10,
        2,
    )
}

/// Neighbour timing of the lb's kernel (`net.ipv4.neigh.eth0.*`, `net.ipv6.neigh.eth0.*`).
#[derive(Clone, Copy, Debug)]
pub struct NeighTiming {
    pub base_reachable_ms: u64,
    pub delay_first_probe_s: u64,
    pub retrans_ms: u64,
    pub ucast_solicit: u64,
}

impl NeighTiming {
    /// Short enough for a scenario: 1000 ms, 1 s, 3 × 200 ms (Linux: 30000 ms, 5 s,
    /// 3 × 1000 ms).
    pub const FAST: NeighTiming = NeighTiming {
        base_reachable_ms: 1000,
        delay_first_probe_s: 1,
        retrans_ms: 200,
        ucast_solicit: 3,
    };

    /// Writes the timing to both families' `eth0` tables in `ns`.
    pub fn apply(&self, ns: &NetNs) -> Result<(), Error> {
        for fam in ["ipv4", "ipv6"] {
            let base = format!("net.{fam}.neigh.{HOST_IF}");
            ns.sysctl(
                &format!("{base}.base_reachable_time_ms"),
                &self.base_reachable_ms.to_string(),
            )?;
            ns.sysctl(
                &format!("{base}.delay_first_probe_time"),
                &self.delay_first_probe_s.to_string(),
            )?;
            ns.sysctl(
                &format!("{base}.retrans_time_ms"),
                &self.retrans_ms.to_string(),
            )?;
            ns.sysctl(
                &format!("{base}.ucast_solicit"),
                &self.ucast_solicit.to_string(),
            )?;
        }
        Ok(())
    }

    /// The longest a backend's changed MAC goes unnoticed without an announcement: the
    /// entry stays REACHABLE up to 1.5 × base_reachable_time after its last confirmation
    /// (the kernel draws reachable_time in [0.5, 1.5] × base), then STALE until the
    /// kernel next sends to it (a probe, within `probe_interval`), DELAY for
    /// delay_first_probe_time, PROBE for ucast_solicit × retrans_time; then FAILED, and
    /// the backend is unselectable ([`FOLLOW`] later) until the kernel has the new MAC.
    /// The kernel's timers may fire up to 1/8 of their length late (the timer wheel's
    /// granularity), so its share counts 9/8.
    pub fn silent_bound(&self, probe_interval: Duration) -> Duration {
        let kernel = Duration::from_millis(self.base_reachable_ms * 3 / 2)
            + Duration::from_secs(self.delay_first_probe_s)
            + Duration::from_millis(self.retrans_ms * self.ucast_solicit);
        kernel * 9 / 8 + probe_interval + FOLLOW
    }
}

/// A topology of `n` backends resolved dynamically, a testserver on each, and the agent
/// serving "web" over all of them with [`probe`] (passive checks off: every verdict is
/// the probe's, so nothing but the neighbour table takes a moved backend out).
///
/// Fields drop in order: the agent, then the servers, then the topology.
pub struct Moves {
    pub agent: Agent,
    pub servers: HealthServers,
    pub api: Api,
    pub vip: SocketAddr,
    pub addrs: Vec<SocketAddr>,
    pub v6: bool,
    pub topo: Topology,
}

impl Moves {
    /// Panics naming the step that failed: it is for tests. `timing` is applied to the
    /// lb's kernel before the agent starts.
    pub fn start(
        forwarding: Forwarding,
        subnet: u8,
        v6: bool,
        n: usize,
        timing: Option<NeighTiming>,
        testserver: &Path,
    ) -> Moves {
        let topo = Topology::builder()
            .backends(n)
            .forwarding(forwarding)
            .subnet(subnet)
            .ipv6(v6)
            .static_neighbours(false)
            .build()
            .expect("building the topology");
        if let Some(t) = timing {
            t.apply(&topo.lb().ns)
                .expect("setting the lb's neighbour timing");
        }
        let roles: Vec<&str> = topo.backends().iter().map(|b| b.role.as_str()).collect();
        let servers = HealthServers::start(&topo, testserver, &roles)
            .expect("starting lb-testserver on every backend");
        let addrs: Vec<SocketAddr> = topo
            .backends()
            .iter()
            .map(|b| SocketAddr::new(b.addr(v6).expect("backend address"), BACKEND_TCP_PORT))
            .collect();
        let weights = vec![1; n];
        let backends = balance::weighted(&topo, &weights);
        let port = balance::vip_port(forwarding, BACKEND_TCP_PORT, 80);
        let svc = crate::agent::daemon::Service::on(
            &topo,
            "web",
            crate::agent::daemon::Proto::Tcp,
            v6,
            port,
            &backends,
            BACKEND_TCP_PORT,
        );
        let svc = with_health(svc, &["max_fails = 0"], &[probe()]);
        let vip = svc.vip;
        let (agent, api) = start_agent(&topo, svc);
        Moves {
            agent,
            servers,
            api,
            vip,
            addrs,
            v6,
            topo,
        }
    }

    /// Paced connections from the client to the VIP for at most `limit`.
    pub fn pacer(&self, first_port: u16, limit: Duration) -> Pacer {
        let client = self.topo.client();
        Pacer::start(
            &client.ns,
            PaceConfig {
                src: client.addr(self.v6).expect("client address"),
                first_port,
                dst: self.vip,
                every: PACE,
                count: (limit.as_millis() / PACE.as_millis()) as usize,
                limit,
                connect_timeout: CONNECT,
            },
        )
    }

    fn backend_ns(&self, role: &str) -> &NetNs {
        &self
            .topo
            .backends()
            .iter()
            .find(|b| b.role == role)
            .unwrap_or_else(|| panic!("no backend {role}"))
            .ns
    }

    /// The MAC `role` moves to: its own with the fourth byte set (locally administered,
    /// unique in the topology).
    pub fn moved_mac(&self, role: &str) -> Mac {
        let b = self
            .topo
            .backends()
            .iter()
            .find(|b| b.role == role)
            .unwrap_or_else(|| panic!("no backend {role}"));
        let mut mac = b.mac.0;
        mac[3] = 0x5a;
        Mac(mac)
    }

    /// Gives `role`'s `eth0` a new MAC, as a NIC swap or a migrated VM does; says
    /// nothing to the segment by itself (`arp_notify` and `ndisc_notify` are off).
    pub fn change_mac(&self, role: &str, mac: Mac) {
        link::set_mac(self.backend_ns(role), HOST_IF, mac).expect("changing the backend's MAC");
    }

    /// Makes `role`'s kernel announce its addresses itself when its MAC changes (an
    /// unsolicited NA for IPv6 with `ndisc_notify`, a gratuitous ARP with `arp_notify`).
    pub fn announce_on_change(&self, role: &str) {
        let ns = self.backend_ns(role);
        for key in [
            format!("net.ipv4.conf.{HOST_IF}.arp_notify"),
            format!("net.ipv6.conf.{HOST_IF}.ndisc_notify"),
        ] {
            ns.sysctl(&key, "1").expect("turning the announcement on");
        }
    }

    /// Sends one gratuitous ARP for `role`'s IPv4 address from its `eth0`
    /// (`arping -U`, as keepalived does on failover). The frame leaves at once; arping
    /// itself lingers about a second before it exits, so it runs in the background:
    /// [`Announcer::finish`] waits for it.
    pub fn gratuitous_arp(&self, role: &str) -> Announcer {
        let b = self
            .topo
            .backends()
            .iter()
            .find(|b| b.role == role)
            .unwrap_or_else(|| panic!("no backend {role}"));
        let ip = b.ipv4.to_string();
        let child = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                b.ns.name(),
                "arping",
                "-q",
                "-U",
                "-c",
                "1",
                "-I",
                HOST_IF,
                "-s",
                &ip,
                &ip,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting arping (from iputils-arping)");
        Announcer { child: Some(child) }
    }

    /// The server at `addr` as the API shows it: its MAC (`None`: unknown), its state
    /// and whether it takes new flows; `None` if the API did not answer.
    pub fn server(&self, addr: SocketAddr) -> Option<(Option<String>, String, bool)> {
        let text = self
            .api
            .request_ok("GET", "/api/v1/services/web", None)
            .ok()?;
        let v = crate::util::json::Json::parse(&text).ok()?;
        let s = v
            .get("servers")?
            .as_array()?
            .iter()
            .find(|s| s.get("address").and_then(|a| a.as_str()) == Some(&addr.to_string()))?;
        Some((
            s.get("mac").and_then(|m| m.as_str()).map(str::to_owned),
            s.get("state")?.as_str()?.to_owned(),
            s.get("active")?.as_bool()?,
        ))
    }

    /// Takes `role`'s `eth0` down (`false`) or up: a host that stops answering.
    pub fn set_link(&self, role: &str, up: bool) {
        self.backend_ns(role)
            .ip(&[
                "link",
                "set",
                "dev",
                HOST_IF,
                if up { "up" } else { "down" },
            ])
            .expect("setting the backend's link");
    }

    /// The lb's kernel neighbour entry for `addr` (`ip neigh show`), for messages.
    pub fn lb_neigh(&self, addr: IpAddr) -> String {
        self.topo
            .lb()
            .ns
            .ip(&["neigh", "show", "to", &addr.to_string(), "dev", HOST_IF])
            .unwrap_or_else(|e| e.to_string())
    }
}

/// Starts lb-agent (native XDP) on `topo` with `svc` alone and waits until each of its
/// servers is up after its first probes. Panics naming the step that failed: it is for
/// tests.
pub fn start_agent(topo: &Topology, svc: Service) -> (Agent, Api) {
    let addrs: Vec<SocketAddr> = svc.servers.iter().map(|(addr, _)| *addr).collect();
    let name = svc.name.clone();
    let binary = locate_binary("lb-agent").expect("finding lb-agent");
    let agent = Agent::start(
        topo,
        &binary,
        &AgentConfig::new(vec![svc]),
        Some("native"),
        START_TIMEOUT,
    )
    .expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    wait_all_probed_up(&api, &name, &addrs, FIRST_VERDICTS)
        .expect("every server up after its first probes");
    (agent, api)
}

/// Waits (at most `timeout`) until `pacer` has a connection answered by `name` that
/// started after `after`; whether it has.
pub fn wait_answered(pacer: &Pacer, name: &str, after: f64, timeout: Duration) -> bool {
    let start = Instant::now();
    loop {
        if pacer
            .attempts()
            .iter()
            .any(|a| a.start >= after && a.answered_by(name))
        {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Connections that did not get a greeting and started at or after `after`.
pub fn failed_after(attempts: &[Attempt], after: f64) -> Vec<&Attempt> {
    attempts
        .iter()
        .filter(|a| {
            a.start >= after && !matches!(a.outcome, crate::traffic::pacer::Outcome::Answered(_))
        })
        .collect()
}

/// The last failed connection's start, relative to `t0` (seconds), if any failed
/// at or after `t0`.
pub fn last_failure(attempts: &[Attempt], t0: f64) -> Option<f64> {
    failed_after(attempts, t0)
        .iter()
        .map(|a| a.start - t0)
        .fold(None, |m, x| Some(m.map_or(x, |m: f64| m.max(x))))
}

/// A running `arping`; killed if dropped before [`finish`](Self::finish).
pub struct Announcer {
    child: Option<std::process::Child>,
}

impl Announcer {
    /// Waits for arping; panics if it failed.
    pub fn finish(mut self) {
        let child = self.child.take().expect("finished once");
        let out = child.wait_with_output().expect("waiting for arping");
        assert!(
            out.status.success(),
            "arping failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Announcer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_lines_own_timestamp_dates_it() {
        let line = "    2026-12-03T18:05:31.549063Z  INFO lb_agent::agent::neighbours: backend MAC \
                    follows the kernel's neighbour table";
        let since = crate::agent::api::rfc3339_seconds("2026-12-03T18:05:31.500Z").unwrap();
        let took = logged_after(line, since).unwrap();
        assert!((took.as_secs_f64() - 0.049063).abs() < 1e-4, "{took:?}");
        assert_eq!(logged_after(line, since + 1.0), Some(Duration::ZERO));
        assert_eq!(logged_after("no time here", since), None);
    }
}
