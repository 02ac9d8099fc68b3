//! The test bed the SYN-check scenarios share: a nat service "web" whose backends (one
//! address family) are each probed by the SYN check (probe "port") and by connect (probe
//! "connect", the reference), the agent running, every server up after its first checks.

use std::{net::SocketAddr, path::Path, process::Command, time::Duration};

use crate::{
    agent::{
        api::Api,
        daemon::{Agent, Proto, Service},
    },
    net::{
        netns::NetNs,
        topology::{Forwarding, Topology},
    },
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{HealthServers, Probe, ProbeKind, wait_all_probed_up, with_health},
    },
};

/// How long the first verdicts may take.
const FIRST_VERDICTS: Duration = Duration::from_secs(15);

/// A running SYN-check scenario. Fields drop in order: the API, the agent, the servers,
/// then the namespaces.
pub struct SynBed {
    pub api: Api,
    pub agent: Agent,
    pub servers: HealthServers,
    /// Each backend's probed address, in backend order.
    pub addrs: Vec<SocketAddr>,
    /// The SYN check as configured (its TR7 bounds).
    pub probe: Probe,
    pub topo: Topology,
}

impl SynBed {
    /// `backends` servers over IPv6 when `v6` (else IPv4) in 10.77.`subnet`.0/24, both
    /// probes with `interval`, `timeout`, fails 2, passes 2, `max_fails = 0` (no passive
    /// signals): started and waited for until every server is up.
    pub fn start(
        testserver: &Path,
        backends: usize,
        v6: bool,
        subnet: u8,
        interval: Duration,
        timeout: Duration,
    ) -> Self {
        let family = if v6 { "IPv6" } else { "IPv4" };
        let probe =
            Probe::new("port", ProbeKind::Tcp, interval, timeout, 2, 2).key("tcp_check = \"syn\"");
        let connect = Probe::new("connect", ProbeKind::Tcp, interval, timeout, 2, 2)
            .key("tcp_check = \"connect\"");
        let topo = Topology::builder()
            .backends(backends)
            .forwarding(Forwarding::Nat)
            .ipv6(v6)
            .subnet(subnet)
            .build()
            .expect("building the topology");
        let roles: Vec<&str> = topo.backends().iter().map(|b| b.role.as_str()).collect();
        let servers = HealthServers::start(&topo, testserver, &roles)
            .expect("starting lb-testserver on every backend");
        let weighted = balance::weighted(&topo, &vec![1; backends]);
        let port = balance::vip_port(Forwarding::Nat, BACKEND_TCP_PORT, 80);
        let service = with_health(
            Service::on(
                &topo,
                "web",
                Proto::Tcp,
                v6,
                port,
                &weighted,
                BACKEND_TCP_PORT,
            ),
            &["max_fails = 0"],
            &[probe.clone(), connect],
        );
        let agent =
            balance::start_agent(&topo, vec![service], Some("native")).expect("starting lb-agent");
        let api = Api::new(&topo.lb().ns);
        let addrs: Vec<SocketAddr> = topo
            .backends()
            .iter()
            .map(|b| SocketAddr::new(b.addr(v6).expect("backend address"), BACKEND_TCP_PORT))
            .collect();
        assert_eq!(addrs[0].is_ipv6(), v6);
        wait_all_probed_up(&api, "web", &addrs, FIRST_VERDICTS)
            .unwrap_or_else(|e| panic!("{family}: every server up after its first checks: {e}"));
        Self {
            api,
            agent,
            servers,
            addrs,
            probe,
            topo,
        }
    }
}

/// Adds an nftables rule for tcp to `port` arriving in `ns` (`verdict`: `drop`, `reject
/// with …`) in a table `syncheck`; the namespace's end removes it.
pub fn nft_port(ns: &NetNs, port: u16, verdict: &str) {
    let rules = format!(
        "table inet syncheck {{ chain input {{ type filter hook input priority 0; \
         tcp dport {port} {verdict}; }}; }}"
    );
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name(), "nft", &rules])
        .output()
        .expect("running nft");
    assert!(
        out.status.success(),
        "nft in {}: {}",
        ns.name(),
        String::from_utf8_lossy(&out.stderr)
    );
}
