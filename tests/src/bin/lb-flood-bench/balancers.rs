//! The balancers the flood benchmark compares, each set up in the lb host of the same
//! topology and removed again: an nftables DNAT + SNAT balancer (conntrack), and lb
//! (XDP) with one udp service in nat and in dsr. All spread the VIP's UDP port over
//! the backends' same port with weights 1:1:2.

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::Context;
use lb_tests::{
    agent::{Agent, Proto, Service},
    cmd,
    process::STOP_GRACE,
    scenario::{self, WEIGHTS},
    topology::{Forwarding, HOST_IF, Topology},
};

/// The VIP's port and the backends' (dsr keeps the port).
pub const PORT: u16 = 8081;
const NFT_TABLE: &str = "lbflood";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Nftables,
    LbNat,
    LbDsr,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Nftables, Kind::LbNat, Kind::LbDsr];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Nftables => "nftables DNAT",
            Kind::LbNat => "lb (XDP, nat)",
            Kind::LbDsr => "lb (XDP, dsr)",
        }
    }

    /// The short name of the command line's `--only`.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Nftables => "nftables",
            Kind::LbNat => "nat",
            Kind::LbDsr => "dsr",
        }
    }
}

/// A running balancer; [`Running::stop`] removes it.
pub enum Running {
    Nftables,
    Lb(Agent),
}

impl Running {
    /// The balancer's process, if it has one.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Running::Nftables => None,
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
        Kind::Nftables => {
            let path = topo.dir().join("lbflood.nft");
            std::fs::write(&path, nft_rules(topo))?;
            let file = path.display().to_string();
            topo.lb()
                .ns
                .run(|| cmd::run("nft", &["-f", &file]))?
                .context("nft -f (is nftables installed? cargo xtask bench installs it)")?;
            Running::Nftables
        }
        Kind::LbNat | Kind::LbDsr => {
            let backends = scenario::weighted(topo, &WEIGHTS);
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
            let agent = scenario::start_agent(topo, vec![service], Some("native"))
                .with_context(|| format!("starting {}", kind.name()))?;
            Running::Lb(agent)
        }
    })
}

fn backends(topo: &Topology) -> Vec<(Ipv4Addr, u32)> {
    topo.backends()
        .iter()
        .zip(WEIGHTS)
        .map(|(b, w)| (b.ipv4, w))
        .collect()
}

/// DNAT to a backend chosen by `numgen random` over a map with one entry per weight
/// unit, SNAT to the lb's address: the nftables balancer of BENCHMARKS.md §4, for UDP.
fn nft_rules(topo: &Topology) -> String {
    let mut slots = Vec::new();
    for (ip, weight) in backends(topo) {
        slots.extend(std::iter::repeat_n(ip, weight as usize));
    }
    let map: Vec<String> = slots
        .iter()
        .enumerate()
        .map(|(i, ip)| format!("{i} : {ip}"))
        .collect();
    let set: Vec<String> = backends(topo)
        .iter()
        .map(|(ip, _)| ip.to_string())
        .collect();
    format!(
        "table ip {NFT_TABLE} {{\n\
         \tchain pre {{\n\
         \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
         \t\tip daddr {vip} udp dport {PORT} dnat to numgen random mod {n} map {{ {map} }} : {PORT}\n\
         \t}}\n\
         \tchain post {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip daddr {{ {set} }} udp dport {PORT} snat to {lb}\n\
         \t}}\n\
         }}\n",
        vip = topo.vip4(),
        n = slots.len(),
        map = map.join(", "),
        set = set.join(", "),
        lb = topo.lb().ipv4,
    )
}

/// The VIP as the sender addresses it.
pub fn vip(topo: &Topology) -> SocketAddr {
    SocketAddr::new(topo.vip4().into(), PORT)
}

/// Sysctls of the lb host that a forwarding (nftables) balancer needs: forwarding on,
/// and no ICMP redirects for packets that leave by the interface they came in on.
pub fn prepare_lb_host(topo: &Topology) -> anyhow::Result<()> {
    let ns = &topo.lb().ns;
    for (key, value) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv4.conf.all.send_redirects", "0"),
        (
            &format!("net.ipv4.conf.{HOST_IF}.send_redirects") as &str,
            "0",
        ),
    ] {
        ns.sysctl(key, value)?;
    }
    Ok(())
}
