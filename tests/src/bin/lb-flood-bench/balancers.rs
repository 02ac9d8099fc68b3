//! The balancers the flood benchmark compares, each set up in the lb host of the same
//! topology and removed again: an nftables DNAT + SNAT balancer (conntrack), and lb
//! (XDP) with one udp service in nat and in dsr. All spread the VIP's UDP port over
//! the backends' same port with weights 1:1:2. Next to them, the bed's physical limit:
//! the bare XDP_TX reflector ([`crate::reflector`]), which sends every frame back.

use std::net::SocketAddr;

use anyhow::Context;

use crate::reflector::Reflector;
use lb_tests::{
    agent::daemon::{Agent, Proto, Service},
    bench::nft_balancer,
    net::topology::{Forwarding, HOST_IF, Topology},
    scenario::balance::{self, WEIGHTS},
    util::{cmd, process::STOP_GRACE},
};

/// The VIP's port and the backends' (dsr keeps the port).
pub const PORT: u16 = 8081;
const NFT_TABLE: &str = "lbflood";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Nftables,
    LbNat,
    LbDsr,
    /// Not a balancer: the bare reflector, the bed's limit.
    Reflector,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Reflector, Kind::Nftables, Kind::LbNat, Kind::LbDsr];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Nftables => "nftables DNAT",
            Kind::LbNat => "lb (XDP, nat)",
            Kind::LbDsr => "lb (XDP, dsr)",
            Kind::Reflector => "XDP_TX reflector",
        }
    }

    /// The short name of the command line's `--only`.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Nftables => "nftables",
            Kind::LbNat => "nat",
            Kind::LbDsr => "dsr",
            Kind::Reflector => "reflector",
        }
    }
}

/// A running balancer; [`Running::stop`] removes it.
pub enum Running {
    Nftables,
    Lb(Agent),
    Reflector(Reflector),
}

impl Running {
    /// The balancer's process, if it has one.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Running::Nftables | Running::Reflector(_) => None,
            Running::Lb(a) => Some(a.process().pid()),
        }
    }

    pub fn stop(self, topo: &Topology) -> anyhow::Result<()> {
        match self {
            Running::Nftables => {
                topo.lb()
                    .ns
                    .run(|| cmd::run("nft", &["delete", "table", "ip", NFT_TABLE]))??;
            }
            Running::Reflector(reflector) => {
                // Dropping it detaches the program (and the NAPI thread is re-created).
                drop(reflector);
            }
            Running::Lb(agent) => {
                agent.stop(STOP_GRACE)?;
                // A stopped agent leaves its program forwarding (docs/restarts.md).
                topo.lb()
                    .ns
                    .ip(&["link", "set", "dev", HOST_IF, "xdp", "off"])?;
            }
        }
        Ok(())
    }
}

/// Whether `nft` can be run here.
pub fn nft_available() -> bool {
    cmd::run("sh", &["-c", "command -v nft"]).is_ok()
}

/// Starts `kind` in the lb host (the agent: until it is ready).
pub fn start(kind: Kind, topo: &Topology) -> anyhow::Result<Running> {
    Ok(match kind {
        Kind::Reflector => Running::Reflector(Reflector::attach(&topo.lb().ns)?),
        Kind::Nftables => {
            let path = topo.dir().join("lbflood.nft");
            std::fs::write(
                &path,
                nft_balancer::rules(NFT_TABLE, "udp", topo, PORT, PORT),
            )?;
            let file = path.display().to_string();
            topo.lb()
                .ns
                .run(|| cmd::run("nft", &["-f", &file]))?
                .context("nft -f (is nftables installed? cargo xtask bench installs it)")?;
            Running::Nftables
        }
        Kind::LbNat | Kind::LbDsr => {
            let backends = balance::weighted(topo, &WEIGHTS);
            let mut service = Service::on(topo, "flood", Proto::Udp, false, PORT, &backends, PORT);
            if kind == Kind::LbDsr {
                // The topology is built for nat (the sinks drop everything in XDP, so the
                // VIP on their loopback is never needed); the service forwards in dsr.
                service.forwarding = Forwarding::Dsr;
                service.snat_ip = None;
                service.snat_ports = None;
            } else {
                // One client address opens thousands of flows at once.
                service.extra.push("source_rate = 0".into());
            }
            let agent = balance::start_agent(topo, vec![service], Some("native"))
                .with_context(|| format!("starting {}", kind.name()))?;
            Running::Lb(agent)
        }
    })
}

/// The VIP as the sender addresses it.
pub fn vip(topo: &Topology) -> SocketAddr {
    SocketAddr::new(topo.vip4().into(), PORT)
}
