//! The tunnel test network: the client, the lb and a router on one bridge; three
//! backends, each on a subnet of its own behind the router, which the lb reaches only
//! through it (tunnel forwarding, docs/tunnel.md).
//!
//! ```text
//! client ─┐
//! lb ─────┤ br0 (10.93.0.0/24)      router ──(t1)── t1 10.94.1.10/24
//! router ─┘ (lan)                          ├─(t2)── t2 10.94.2.10/24
//!                                          └─(t3)── t3 10.94.3.10/24
//! ```
//!
//! | host   | IPv4        | IPv6 |
//! |--------|-------------|------|
//! | router | 10.93.0.1 (lan), 10.94.N.1 (tN) | fd93::1, fd94:N::1 |
//! | lb     | 10.93.0.2 (the tunnels' outer source) | fd93::2 |
//! | client | 10.93.0.10  | fd93::a |
//! | tN     | 10.94.N.10  | fd94:N::a |
//! | VIP    | 10.99.0.1   | fd99::1 |
//!
//! The client routes the VIPs to the lb; every backend holds them on `lo`.
//!
//! The lb routes 10.94.0.0/16 through the router, so the next hop it writes for every
//! backend is the router's MAC. Backends answer the client directly through the router
//! (their default route). Neighbours on the bridge are permanent entries; every host
//! sends full checksums, or, built with other [`Offloads`], the client, the lb and the
//! backends keep their offloads (the router always sends full checksums). Every
//! namespace, link, program and file is removed on drop,
//! also when a test fails.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
};

use aya::programs::XdpMode;

use crate::{
    agent::daemon::{AgentConfig, READY_LINE, START_TIMEOUT},
    net::{
        link::{self, Link, Mac, Offloads, VethEnd},
        names,
        netns::NetNs,
        switch::Switch,
        topology::HOST_IF,
    },
    util::{error::Error, process::NsProcess, temp_dir::TempDir},
};

/// The VIP.
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
/// The IPv6 VIP.
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 1);
/// The client's IPv6 address.
pub const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd93, 0, 0, 0, 0, 0, 0, 0xa);
const LB6: Ipv6Addr = Ipv6Addr::new(0xfd93, 0, 0, 0, 0, 0, 0, 2);
const ROUTER6: Ipv6Addr = Ipv6Addr::new(0xfd93, 0, 0, 0, 0, 0, 0, 1);
/// The lb's address (the tunnels' outer source).
pub const LB: Ipv4Addr = Ipv4Addr::new(10, 93, 0, 2);
/// The client's address.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 93, 0, 10);
/// The router's address on the bridge.
pub const ROUTER: Ipv4Addr = Ipv4Addr::new(10, 93, 0, 1);
/// The backends' names.
pub const BACKENDS: [&str; 3] = ["t1", "t2", "t3"];

const MAC_ROUTER: Mac = Mac([0x02, 0x93, 0, 0, 0, 0x01]);
const MAC_LB: Mac = Mac([0x02, 0x93, 0, 0, 0, 0x02]);
const MAC_CLIENT: Mac = Mac([0x02, 0x93, 0, 0, 0, 0x0a]);

/// The built network.
pub struct TunnelBed {
    // Fields drop in this order: the switch (programs, ports), the router's links,
    // namespaces, the directory.
    switch: Switch,
    links: Vec<Link>,
    pub client: NetNs,
    pub router: NetNs,
    pub lb: NetNs,
    /// `t1`, `t2`, `t3`, in [`BACKENDS`]' order.
    pub backends: Vec<NetNs>,
    dir: TempDir,
}

impl TunnelBed {
    /// Creates the namespaces, links, addresses, routes and neighbours; every host sends
    /// full checksums.
    pub fn build() -> Result<TunnelBed, Error> {
        TunnelBed::build_with(Offloads::FullChecksums)
    }

    /// [`TunnelBed::build`] with the hosts' `offloads`.
    pub fn build_with(offloads: Offloads) -> Result<TunnelBed, Error> {
        names::sweep_stale_once();
        let tag = names::unique_tag();
        let dir = TempDir::create(std::env::temp_dir().join(&tag))?;
        let switch = Switch::create(&tag)?;
        let ns = |role: &str| NetNs::create(&format!("{tag}-{role}"));
        let (router, lb, client) = (ns("rt")?, ns("lb")?, ns("cl")?);
        let mut backends = Vec::new();
        for name in BACKENDS {
            backends.push(ns(name)?);
        }
        let mut bed = TunnelBed {
            switch,
            links: Vec::new(),
            client,
            router,
            lb,
            backends,
            dir,
        };
        for (port, host, mac) in [
            ("p-rt", &bed.router, MAC_ROUTER),
            ("p-lb", &bed.lb, MAC_LB),
            ("p-cl", &bed.client, MAC_CLIENT),
        ] {
            bed.switch.plug(
                port,
                Mac([0x02, 0x98, 0, 0, 0, mac.0[5]]),
                VethEnd {
                    ns: host,
                    name: HOST_IF,
                    mac,
                },
            )?;
        }
        bed.client.keep_ephemeral_ports_above_fixed()?;
        for (i, (name, host)) in BACKENDS.iter().zip(&bed.backends).enumerate() {
            let n = i as u8 + 1;
            bed.links.push(link::veth_pair(
                VethEnd {
                    ns: &bed.router,
                    name,
                    mac: Mac([0x02, 0x94, n, 0, 0, 0x01]),
                },
                VethEnd {
                    ns: host,
                    name: HOST_IF,
                    mac: Mac([0x02, 0x94, n, 0, 0, 0x0a]),
                },
            )?);
        }
        bed.configure(offloads)?;
        bed.switch.attach_pass_for(offloads, XdpMode::Driver, &[])?;
        Ok(bed)
    }

    fn configure(&self, offloads: Offloads) -> Result<(), Error> {
        let neigh = |addr: IpAddr, mac: Mac| {
            format!("neigh replace {addr} lladdr {mac} dev {HOST_IF} nud permanent")
        };
        let (v4, v6) = (IpAddr::V4, IpAddr::V6);
        let mut router = vec![
            format!("link set {HOST_IF} up"),
            format!("addr add {ROUTER}/24 dev {HOST_IF}"),
            format!("addr add {ROUTER6}/64 dev {HOST_IF} nodad"),
            neigh(v4(LB), MAC_LB),
            neigh(v4(CLIENT), MAC_CLIENT),
            neigh(v6(LB6), MAC_LB),
            neigh(v6(CLIENT6), MAC_CLIENT),
        ];
        for (i, name) in BACKENDS.iter().enumerate() {
            router.push(format!("link set {name} up"));
            router.push(format!("addr add 10.94.{}.1/24 dev {name}", i + 1));
            router.push(format!("addr add fd94:{}::1/64 dev {name} nodad", i + 1));
        }
        self.router.ip_batch(&router)?;
        self.router.sysctl("net.ipv4.ip_forward", "1")?;
        self.router.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        self.router.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
        self.lb.ip_batch(&[
            format!("link set {HOST_IF} up"),
            format!("addr add {LB}/24 dev {HOST_IF}"),
            format!("addr add {LB6}/64 dev {HOST_IF} nodad"),
            format!("route add 10.94.0.0/16 via {ROUTER}"),
            format!("route add fd94::/16 via {ROUTER6}"),
            neigh(v4(ROUTER), MAC_ROUTER),
            neigh(v4(CLIENT), MAC_CLIENT),
            neigh(v6(ROUTER6), MAC_ROUTER),
            neigh(v6(CLIENT6), MAC_CLIENT),
        ])?;
        self.client.ip_batch(&[
            format!("link set {HOST_IF} up"),
            format!("addr add {CLIENT}/24 dev {HOST_IF}"),
            format!("addr add {CLIENT6}/64 dev {HOST_IF} nodad"),
            format!("route add {VIP}/32 via {LB}"),
            format!("route add {VIP6}/128 via {LB6}"),
            neigh(v4(ROUTER), MAC_ROUTER),
            neigh(v4(LB), MAC_LB),
            neigh(v6(ROUTER6), MAC_ROUTER),
            neigh(v6(LB6), MAC_LB),
        ])?;
        for (i, host) in self.backends.iter().enumerate() {
            host.ip_batch(&[
                format!("link set {HOST_IF} up"),
                format!("addr add {}/24 dev {HOST_IF}", self.backend_ip(i)),
                format!("addr add {}/64 dev {HOST_IF} nodad", self.backend_ip6(i)),
                format!("route add default via 10.94.{}.1", i + 1),
                format!("route add default via fd94:{}::1", i + 1),
                format!("addr add {VIP}/32 dev lo"),
                format!("addr add {VIP6}/128 dev lo"),
            ])?;
        }
        // The router is the wire: it sends full checksums in every bed.
        for dev in std::iter::once(HOST_IF).chain(BACKENDS) {
            link::set_tx_checksum(&self.router, dev, false)?;
        }
        let hosts = [(&self.lb, true), (&self.client, false)]
            .into_iter()
            .chain(self.backends.iter().map(|b| (b, false)));
        for (ns, is_lb) in hosts {
            link::set_host_offloads(ns, HOST_IF, offloads, is_lb)?;
        }
        Ok(())
    }

    /// Backend `i`'s address (`10.94.{i+1}.10`).
    pub fn backend_ip(&self, i: usize) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 94, i as u8 + 1, 10))
    }

    /// Backend `i`'s IPv6 address (`fd94:{i+1}::a`).
    pub fn backend_ip6(&self, i: usize) -> IpAddr {
        IpAddr::V6(Ipv6Addr::new(0xfd94, i as u16 + 1, 0, 0, 0, 0, 0, 0xa))
    }

    /// Backend `i` on `port`.
    pub fn backend_addr(&self, i: usize, port: u16) -> SocketAddr {
        SocketAddr::new(self.backend_ip(i), port)
    }

    /// Writes `config`, with the lb's address as `agent.tunnel_source`, into the bed's
    /// directory and starts `binary run` (`lb-agent`) with it on the lb's interface,
    /// `flags` added; waits until it is ready.
    pub fn start_agent(
        &self,
        binary: &Path,
        config: &AgentConfig,
        flags: &[&str],
    ) -> Result<NsProcess, Error> {
        let mut config = config.clone();
        config.agent_extra.push(format!("tunnel_source = \"{LB}\""));
        let path = self.dir().join("lb.toml");
        std::fs::write(&path, config.render())
            .map_err(Error::io(format!("writing {}", path.display())))?;
        let path = path.display().to_string();
        let mut args = vec!["run", "--config", &path, "--interface", HOST_IF];
        args.extend(flags);
        let agent = NsProcess::spawn(&self.lb, "lb-agent", binary, &args, &[("NO_COLOR", "1")])?;
        agent.wait_for_line(0, READY_LINE, START_TIMEOUT)?;
        Ok(agent)
    }

    /// A directory for this bed's files (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The switch's namespace (bridge `br0`, ports `p-rt`, `p-lb`, `p-cl`).
    pub fn switch(&self) -> &NetNs {
        self.switch.ns()
    }
}
