//! The bed of the scenarios about what keeps an established connection: three primaries
//! b1, b2, b3 weighted [`WEIGHTS`], each with a testserver and a health listener that
//! the fast `tcp` probe talks to (so the probe can fail while the service port answers),
//! the agent running with every server up, and a long-lived connection pinned to b1.

use std::{net::SocketAddr, path::Path, time::Duration};

use crate::{
    agent::{
        api::Api,
        daemon::{Agent, Service},
    },
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{self, WEIGHTS},
        redundancy::{self, Backends, HEALTH_PORT, Member, TcpProbe},
    },
    traffic::clients::EchoConn,
};

/// How long the agent has to bring every server up.
pub const VERDICT_WAIT: Duration = Duration::from_secs(15);

/// The three-backend topology of the bed, on `subnet`.
pub fn topology(forwarding: Forwarding, subnet: u8) -> Topology {
    Topology::builder()
        .backends(WEIGHTS.len())
        .forwarding(forwarding)
        .subnet(subnet)
        .build()
        .expect("building the topology")
}

/// The bed on `topo` (from [`topology`]), running.
pub struct PinnedToB1<'t> {
    pub members: [Member<'t>; 3],
    pub backends: Backends,
    pub probe: TcpProbe,
    pub vip: SocketAddr,
    pub agent: Agent,
    pub api: Api,
    /// The long-lived connection, answered by b1.
    pub pinned: EchoConn,
}

impl<'t> PinnedToB1<'t> {
    /// Starts the servers and the agent, waits for every server to be up, and opens the
    /// connection to b1. Panics (naming `mode`) when a step fails.
    pub fn start(topo: &'t Topology, testserver: &Path) -> Self {
        let mode = topo.forwarding().as_str();
        let h = topo.backends();
        let members = [
            Member::primary("b1", &h[0], WEIGHTS[0]),
            Member::primary("b2", &h[1], WEIGHTS[1]),
            Member::primary("b3", &h[2], WEIGHTS[2]),
        ];
        let backends = Backends::start(testserver, &members, true)
            .expect("starting a testserver and a health listener per member");
        let probe = TcpProbe::fast().on_port(HEALTH_PORT);
        let service = redundancy::service(topo, "web", &members, &probe, &[]);
        let vip = service.vip;
        let agent =
            balance::start_agent(topo, vec![service], Some("native")).expect("starting lb-agent");
        let api = Api::new(&topo.lb().ns);
        api.wait_service("web", "every server up", VERDICT_WAIT, |s| {
            s.servers.iter().all(|v| v.state == "up" && v.active)
        })
        .unwrap_or_else(|e| panic!("{mode}: all three servers should be up after start: {e}"));
        let client = topo.client();
        let mut pinned = redundancy::echo_on(&client.ns, client.ipv4.into(), vip, "b1", 60)
            .unwrap_or_else(|e| panic!("{mode}: a long-lived connection to b1: {e}"));
        pinned
            .check_echo("at the start")
            .unwrap_or_else(|e| panic!("{mode}: long-lived connection on b1: {e}"));
        PinnedToB1 {
            members,
            backends,
            probe,
            vip,
            agent,
            api,
            pinned,
        }
    }

    /// b1's health listener starts again: b1 must be `up` and take new flows once its
    /// probe passes, and the connection pinned to it must still echo.
    pub fn b1_health_returns(&mut self, mode: &str) {
        self.backends
            .restart_health("b1")
            .expect("starting b1's health listener");
        let b1 = self.members[0].addr();
        self.api
            .wait_service("web", "b1 up again", VERDICT_WAIT, |s| {
                s.server(b1).is_some_and(|v| v.state == "up" && v.active)
            })
            .unwrap_or_else(|e| panic!("{mode}: b1 returns once its probe passes: {e}"));
        self.pinned
            .check_echo("after b1 is up again")
            .unwrap_or_else(|e| panic!("{mode}: the connection pinned to b1: {e}"));
    }

    /// The service as the bed runs it, with only `members`.
    pub fn service_of(&self, topo: &Topology, members: &[Member<'_>]) -> Service {
        redundancy::service(topo, "web", members, &self.probe, &[])
    }
}
