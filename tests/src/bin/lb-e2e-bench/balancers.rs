//! The three balancers the end-to-end benchmark compares, each set up in the lb host of
//! the same topology and removed again: lb (XDP, nat), an nftables DNAT + SNAT
//! balancer, and HAProxy in TCP mode. All three balance the VIP's port 80 over the
//! backends' port 8080 with weights 1:1:2 and hide the client from the backends.

use std::{fmt::Write as _, path::Path, time::Duration};

use anyhow::{Context, bail};
use lb_tests::{
    agent::daemon::Agent,
    bench::nft_balancer,
    net::topology::{HOST_IF, Topology},
    scenario::balance::{self, BACKEND_TCP_PORT, WEIGHTS},
    traffic::clients,
    util::{
        cmd,
        process::{NsProcess, STOP_GRACE},
    },
};

/// The VIP's port.
pub const VIP_PORT: u16 = 80;
const NFT_TABLE: &str = "lbbench";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Nftables,
    Haproxy,
    Lb,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Nftables, Kind::Haproxy, Kind::Lb];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Nftables => "nftables DNAT",
            Kind::Haproxy => "HAProxy (tcp mode)",
            Kind::Lb => "lb (XDP, nat)",
        }
    }
}

/// A running balancer; [`Running::stop`] removes it.
pub enum Running {
    Nftables,
    Haproxy(NsProcess),
    Lb(Agent),
}

impl Running {
    /// The balancer's process, if it has one (its CPU is the balancer's too).
    pub fn pid(&self) -> Option<u32> {
        match self {
            Running::Nftables => None,
            Running::Haproxy(p) => Some(p.pid()),
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
            Running::Haproxy(p) => {
                p.stop(STOP_GRACE)?;
                let vip = format!("{}/32", topo.vip4());
                topo.lb().ns.ip(&["addr", "del", &vip, "dev", "lo"])?;
            }
            Running::Lb(agent) => {
                agent.stop(STOP_GRACE)?;
                // A stopped agent leaves its program forwarding (docs/restarts.md); the
                // next balancer measured must not run behind it.
                topo.lb()
                    .ns
                    .ip(&["link", "set", "dev", HOST_IF, "xdp", "off"])?;
            }
        }
        Ok(())
    }
}

/// Starts `kind` in the lb host and waits until the VIP answers.
pub fn start(kind: Kind, topo: &Topology) -> anyhow::Result<Running> {
    let running = match kind {
        Kind::Nftables => {
            let rules = nft_balancer::rules(NFT_TABLE, "tcp", topo, VIP_PORT, BACKEND_TCP_PORT);
            let path = topo.dir().join("lbbench.nft");
            std::fs::write(&path, rules)?;
            let file = path.display().to_string();
            topo.lb().ns.run(|| cmd::run("nft", &["-f", &file]))??;
            Running::Nftables
        }
        Kind::Haproxy => {
            let vip = format!("{}/32", topo.vip4());
            topo.lb().ns.ip(&["addr", "add", &vip, "dev", "lo"])?;
            let path = topo.dir().join("haproxy.cfg");
            std::fs::write(&path, haproxy_config(topo))?;
            let cfg = path.display().to_string();
            let haproxy = which("haproxy")?;
            let p = topo
                .lb()
                .spawn("haproxy", Path::new(&haproxy), &["-db", "-f", &cfg])?;
            Running::Haproxy(p)
        }
        Kind::Lb => {
            let backends = balance::weighted(topo, &WEIGHTS);
            let mut service = balance::tcp_service(topo, &backends);
            // One client opening thousands of connections a second: no per-source limit.
            service.extra.push("source_rate = 0".into());
            Running::Lb(balance::start_agent(topo, vec![service], Some("native"))?)
        }
    };
    if let Err(err) = wait_answering(topo) {
        let log = match &running {
            Running::Haproxy(p) => p.tail(20),
            Running::Lb(a) => a.process().tail(20),
            Running::Nftables => String::new(),
        };
        let _ = running.stop(topo);
        return Err(err.context(format!("{} did not start:\n{log}", kind.name())));
    }
    Ok(running)
}

/// One connection through the VIP answered, tried for up to 10 s.
fn wait_answering(topo: &Topology) -> anyhow::Result<()> {
    let client = topo.client();
    let vip = std::net::SocketAddr::new(topo.vip4().into(), VIP_PORT);
    for attempt in 0..100u16 {
        // Ports 1000.. are never used by the measured runs.
        let tally = clients::tcp_names(
            &client.ns,
            client.ipv4.into(),
            1000 + attempt,
            vip,
            1,
            Duration::from_secs(1),
        )?;
        if tally.answered() == 1 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the VIP {vip} did not answer within 10 s")
}

/// One process, one thread, TCP mode, weighted round robin.
fn haproxy_config(topo: &Topology) -> String {
    let mut cfg = format!(
        "global\n\
         \tmaxconn 5000\n\
         \tnbthread 1\n\
         defaults\n\
         \tmode tcp\n\
         \ttimeout connect 2s\n\
         \ttimeout client 10s\n\
         \ttimeout server 10s\n\
         frontend vip\n\
         \tbind {}:{VIP_PORT}\n\
         \tdefault_backend pool\n\
         backend pool\n\
         \tbalance roundrobin\n",
        topo.vip4()
    );
    for (i, (ip, weight)) in nft_balancer::weighted_backends(topo)
        .into_iter()
        .enumerate()
    {
        let _ = writeln!(
            cfg,
            "\tserver b{} {ip}:{BACKEND_TCP_PORT} weight {weight}",
            i + 1
        );
    }
    cfg
}

fn which(program: &str) -> anyhow::Result<String> {
    let out = cmd::run("sh", &["-c", &format!("command -v {program}")])
        .with_context(|| format!("{program} is not installed (cargo xtask bench installs it)"))?;
    Ok(out.trim().to_owned())
}
