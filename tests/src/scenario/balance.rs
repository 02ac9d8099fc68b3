//! Pieces the scenarios and the demo share: backend servers on every backend host,
//! the weighted service of the balance scenarios, and an agent started on it.

use std::{path::Path, time::Duration};

use crate::{
    agent::daemon::{Agent, AgentConfig, Proto, START_TIMEOUT, Service},
    net::topology::{Forwarding, Host, Topology},
    util::{error::Error, process::NsProcess},
};

/// Port of every backend's TCP echo server.
pub const BACKEND_TCP_PORT: u16 = 8080;
/// Port of every backend's UDP server.
pub const BACKEND_UDP_PORT: u16 = 8081;
/// Weights of b1, b2, b3 in the balance scenarios and the demo.
pub const WEIGHTS: [u32; 3] = [1, 1, 2];
/// Relative tolerance of a measured share around its weight's share.
pub const SHARE_TOLERANCE: f64 = 0.15;
/// How long a testserver may take to bind its ports.
pub const SERVER_START: Duration = Duration::from_secs(10);

/// The test bed of the balance, UDP, reload and restart scenarios: three backends, each
/// running `lb-testserver`, in a topology for `forwarding` on subnet `subnet` (dual-stack
/// with `ipv6`). Panics naming the step that failed: it is for tests.
pub struct Testbed {
    // Fields drop in order: the servers before their namespaces.
    pub servers: Vec<NsProcess>,
    pub topo: Topology,
}

impl Testbed {
    pub fn start(forwarding: Forwarding, subnet: u8, ipv6: bool, testserver: &Path) -> Self {
        let topo = Topology::builder()
            .backends(WEIGHTS.len())
            .forwarding(forwarding)
            .subnet(subnet)
            .ipv6(ipv6)
            .build()
            .expect("building the topology");
        let servers =
            start_testservers(&topo, testserver).expect("starting lb-testserver on every backend");
        Testbed { servers, topo }
    }
}

/// Starts `lb-testserver --name bN --tcp 8080 --udp 8081` on every backend and waits
/// until each has bound its ports.
pub fn start_testservers(topo: &Topology, testserver: &Path) -> Result<Vec<NsProcess>, Error> {
    let (tcp, udp) = (BACKEND_TCP_PORT.to_string(), BACKEND_UDP_PORT.to_string());
    start_testservers_with(topo, testserver, &["--tcp", &tcp, "--udp", &udp])
}

/// Starts `lb-testserver --name bN PORTS…` (`--tcp PORT`, `--udp PORT`, …) on every
/// backend and waits until each has bound its ports.
pub fn start_testservers_with(
    topo: &Topology,
    testserver: &Path,
    ports: &[&str],
) -> Result<Vec<NsProcess>, Error> {
    let mut servers = Vec::new();
    for b in topo.backends() {
        let mut args = vec!["--name", b.role.as_str()];
        args.extend_from_slice(ports);
        let p = b.spawn(&format!("testserver {}", b.role), testserver, &args)?;
        p.wait_for_line(0, "ready", SERVER_START)?;
        servers.push(p);
    }
    Ok(servers)
}

/// The VIP port of a service: dsr keeps the backend's port, nat maps `nat_port` to it.
pub fn vip_port(forwarding: Forwarding, backend_port: u16, nat_port: u16) -> u16 {
    match forwarding {
        Forwarding::Dsr | Forwarding::Ipip | Forwarding::Gue => backend_port,
        Forwarding::Nat => nat_port,
    }
}

/// The backends paired with `weights` (as many as both have).
pub fn weighted<'t>(topo: &'t Topology, weights: &[u32]) -> Vec<(&'t Host, u32)> {
    topo.backends()
        .iter()
        .zip(weights.iter().copied())
        .collect()
}

/// `(name, weight)` pairs for [`crate::traffic::clients::Tally::check_shares`].
pub fn expected<'t>(backends: &[(&'t Host, u32)]) -> Vec<(&'t str, u32)> {
    backends
        .iter()
        .map(|(h, w)| (h.role.as_str(), *w))
        .collect()
}

/// The TCP service "web" over the topology's IPv4 VIP: port 80 (nat) or 8080 (dsr) to
/// the backends' 8080.
pub fn tcp_service(topo: &Topology, backends: &[(&Host, u32)]) -> Service {
    let port = vip_port(topo.forwarding(), BACKEND_TCP_PORT, 80);
    Service::on(
        topo,
        "web",
        Proto::Tcp,
        false,
        port,
        backends,
        BACKEND_TCP_PORT,
    )
}

/// The UDP service "dns" over the topology's IPv4 VIP: port 53 (nat) or 8081 (dsr) to
/// the backends' 8081.
pub fn udp_service(topo: &Topology, backends: &[(&Host, u32)]) -> Service {
    let port = vip_port(topo.forwarding(), BACKEND_UDP_PORT, 53);
    Service::on(
        topo,
        "dns",
        Proto::Udp,
        false,
        port,
        backends,
        BACKEND_UDP_PORT,
    )
}

/// Starts the agent found by [`crate::agent::daemon::locate_binary`] with `services`.
pub fn start_agent(
    topo: &Topology,
    services: Vec<Service>,
    xdp_mode: Option<&str>,
) -> Result<Agent, Error> {
    let binary = crate::agent::daemon::locate_binary("lb-agent")?;
    Agent::start(
        topo,
        &binary,
        &AgentConfig::new(services),
        xdp_mode,
        START_TIMEOUT,
    )
}
