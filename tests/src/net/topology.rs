//! The test network: a switch namespace with a bridge, and host namespaces `client`,
//! `lb`, `b1..bN`, each with `eth0` on the bridge.
//!
//! Addressing, for subnet index `k` (one per test, so that logs and captures of
//! different tests never look alike; the namespaces themselves are isolated anyway):
//!
//! | host   | index | IPv4          | IPv6 (optional)   | MAC (`eth0`)        |
//! |--------|-------|---------------|-------------------|---------------------|
//! | lb     | 2     | 10.77.k.2/24  | fd77:0:0:k::2/64  | 02:77:kk:00:00:02   |
//! | client | 10    | 10.77.k.10/24 | fd77:0:0:k::a/64  | 02:77:kk:00:00:0a   |
//! | bN     | 10+N  | 10.77.k.1N/24 | fd77:0:0:k::1N/64 | 02:77:kk:00:00:…    |
//! | VIP    |       | 10.77.k.200   | fd77:0:0:k::c8    |                     |
//!
//! The client routes the VIP via the lb's address. In `dsr` topologies every backend
//! holds the VIP on `lo` and neither answers nor announces ARP for it. By default every
//! host knows every other host's MAC (permanent neighbour entries), so no test depends
//! on ARP timing; `static_neighbours(false)` leaves resolution to the kernel (and to
//! the agent). Hosts send full checksums (see [`link::set_tx_checksum`]). `lb_pass` runs
//! in native mode on every switch-side veth. [`TopologyBuilder::offloads`] lets the hosts
//! keep their offloads instead ([`Offloads`]).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use aya::programs::XdpMode;

use crate::{
    net::{
        link::{self, Mac, Offloads, VethEnd},
        names,
        netns::NetNs,
        switch::Switch,
    },
    util::{error::Error, process::NsProcess, temp_dir::TempDir},
};

/// The bridge's name in the switch namespace.
pub const BRIDGE: &str = "br0";
/// Every host's interface on the bridge.
pub const HOST_IF: &str = "eth0";
/// Last byte of the lb's addresses.
pub const LB_INDEX: u8 = 2;
/// Last byte of the client's addresses.
pub const CLIENT_INDEX: u8 = 10;
/// Last byte of the VIP.
pub const VIP_INDEX: u8 = 200;
/// At most this many backends (their index must stay below the VIP's).
pub const MAX_BACKENDS: usize = 100;

/// How the balancer forwards, which decides how backends are set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forwarding {
    /// L2 direct server return: backends hold the VIP and answer the client directly.
    Dsr,
    /// Full NAT: backends see the lb's address and answer it.
    Nat,
    /// IP-in-IP to backends anywhere routable, which answer the client directly.
    Ipip,
    /// The same inside UDP (GUE).
    Gue,
}

impl Forwarding {
    /// The config spelling (`forwarding = "…"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Forwarding::Dsr => "dsr",
            Forwarding::Nat => "nat",
            Forwarding::Ipip => "ipip",
            Forwarding::Gue => "gue",
        }
    }
}

/// One host namespace with `eth0` on the bridge.
#[derive(Debug)]
pub struct Host {
    /// `client`, `lb`, `b1`…
    pub role: String,
    pub ns: NetNs,
    pub ipv4: Ipv4Addr,
    pub ipv6: Option<Ipv6Addr>,
    /// MAC address of `eth0`.
    pub mac: Mac,
}

impl Host {
    /// The host's address in the given family (IPv6 only when the topology has it).
    pub fn addr(&self, v6: bool) -> Option<IpAddr> {
        if v6 {
            self.ipv6.map(IpAddr::V6)
        } else {
            Some(IpAddr::V4(self.ipv4))
        }
    }

    /// Starts `program args…` in this host's namespace (see [`NsProcess::spawn`]).
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(
        &self,
        label: &str,
        program: &Path,
        args: &[S],
    ) -> Result<NsProcess, Error> {
        // NO_COLOR keeps tracing's colour codes out of the captured lines.
        NsProcess::spawn(&self.ns, label, program, args, &[("NO_COLOR", "1")])
    }
}

/// Options of a [`Topology`]; start with [`Topology::builder`].
#[derive(Clone, Debug)]
pub struct TopologyBuilder {
    backends: usize,
    forwarding: Forwarding,
    subnet: Option<u8>,
    ipv6: bool,
    static_neighbours: bool,
    pass_mode: XdpMode,
    no_pass: Vec<String>,
    offloads: Offloads,
    queues: u32,
}

impl TopologyBuilder {
    /// Number of backend hosts `b1..bN` (default 3).
    pub fn backends(mut self, n: usize) -> Self {
        self.backends = n;
        self
    }

    /// How the balancer will forward (default `nat`); `dsr` puts the VIP on the backends.
    pub fn forwarding(mut self, forwarding: Forwarding) -> Self {
        self.forwarding = forwarding;
        self
    }

    /// The `k` of 10.77.k.0/24 (default: from a per-process counter).
    pub fn subnet(mut self, k: u8) -> Self {
        self.subnet = Some(k);
        self
    }

    /// Also give every host an IPv6 address (default off).
    pub fn ipv6(mut self, on: bool) -> Self {
        self.ipv6 = on;
        self
    }

    /// Permanent neighbour entries between all hosts (default on).
    pub fn static_neighbours(mut self, on: bool) -> Self {
        self.static_neighbours = on;
        self
    }

    /// Mode of `lb_pass` on the switch-side veths (default native; that is what makes
    /// native `XDP_TX` on the hosts' `eth0` work).
    pub fn pass_mode(mut self, mode: XdpMode) -> Self {
        self.pass_mode = mode;
        self
    }

    /// Leaves `lb_pass` off the switch port `p-ROLE` (e.g. `lb`), for a caller that
    /// attaches an XDP program of its own there (one is needed for native `XDP_TX` from
    /// that host).
    pub fn without_pass_on(mut self, role: &str) -> Self {
        self.no_pass.push(format!("p-{role}"));
        self
    }

    /// What the hosts keep of veth's offloads (default [`Offloads::FullChecksums`]).
    pub fn offloads(mut self, offloads: Offloads) -> Self {
        self.offloads = offloads;
        self
    }

    /// Receive and transmit queues of every veth pair, each end (default 1). With 2 the
    /// lb's `eth0` has a NAPI instance per queue, so its XDP program runs on the CPU of
    /// whoever sent into each queue, on both CPUs at once (`netns_multiqueue`).
    pub fn queues(mut self, n: u32) -> Self {
        self.queues = n;
        self
    }

    /// Creates everything. On error, whatever was created is removed again.
    pub fn build(self) -> Result<Topology, Error> {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if uid != 0 {
            return Err(Error::Unexpected(format!(
                "network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF); \
                 running as uid {uid}"
            )));
        }
        if self.backends == 0 || self.backends > MAX_BACKENDS {
            return Err(Error::Unexpected(format!(
                "{} backends asked for; the topology holds 1..={MAX_BACKENDS}",
                self.backends
            )));
        }
        names::sweep_stale_once();
        let tag = names::unique_tag();
        let k = self.subnet.unwrap_or_else(|| default_subnet(&tag));

        let dir = TempDir::create(std::env::temp_dir().join(&tag))?;
        let mut switch = Switch::create(&tag)?;

        let mut roles = vec![
            ("lb".to_owned(), LB_INDEX),
            ("client".to_owned(), CLIENT_INDEX),
        ];
        roles.extend((1..=self.backends).map(|i| (format!("b{i}"), CLIENT_INDEX + i as u8)));

        let mut hosts = Vec::new();
        for (role, index) in roles {
            let ns = NetNs::create(&format!("{tag}-{role}"))?;
            let host = Host {
                ipv4: Ipv4Addr::new(10, 77, k, index),
                ipv6: self.ipv6.then(|| v6_addr(k, index)),
                mac: Mac([0x02, 0x77, k, 0, 0, index]),
                role,
                ns,
            };
            switch.plug_with_queues(
                &format!("p-{}", host.role),
                Mac([0x02, 0x78, k, 0, 0, index]),
                VethEnd {
                    ns: &host.ns,
                    name: HOST_IF,
                    mac: host.mac,
                },
                self.queues,
            )?;
            hosts.push(host);
        }
        let backends = hosts.split_off(2);
        let client = hosts.pop().expect("client host");
        let lb = hosts.pop().expect("lb host");

        let mut topo = Topology {
            switch,
            client,
            lb,
            backends,
            dir,
            subnet: k,
            forwarding: self.forwarding,
            ipv6: self.ipv6,
        };
        topo.configure_hosts(self.static_neighbours, self.offloads)?;
        topo.client.ns.keep_ephemeral_ports_above_fixed()?;
        topo.switch
            .attach_pass_for(self.offloads, self.pass_mode, &self.no_pass)?;
        Ok(topo)
    }
}

/// A built test network; dropping it removes every namespace, link and program.
#[derive(Debug)]
pub struct Topology {
    // Fields drop in this order: the switch (programs, ports, bridge), hosts, the
    // directory.
    switch: Switch,
    client: Host,
    lb: Host,
    backends: Vec<Host>,
    dir: TempDir,
    subnet: u8,
    forwarding: Forwarding,
    ipv6: bool,
}

impl Topology {
    /// Defaults: 3 backends, nat, IPv4 only, static neighbours, native `lb_pass`, one
    /// queue per veth.
    pub fn builder() -> TopologyBuilder {
        TopologyBuilder {
            backends: 3,
            forwarding: Forwarding::Nat,
            subnet: None,
            ipv6: false,
            static_neighbours: true,
            pass_mode: XdpMode::Driver,
            no_pass: Vec::new(),
            offloads: Offloads::FullChecksums,
            queues: 1,
        }
    }

    pub fn client(&self) -> &Host {
        &self.client
    }

    pub fn lb(&self) -> &Host {
        &self.lb
    }

    /// `b1..bN` in order.
    pub fn backends(&self) -> &[Host] {
        &self.backends
    }

    /// The switch namespace (bridge `br0`, ports `p-<role>`).
    pub fn switch(&self) -> &NetNs {
        self.switch.ns()
    }

    /// Every host: lb, client, then the backends.
    pub fn hosts(&self) -> impl Iterator<Item = &Host> {
        [&self.lb, &self.client]
            .into_iter()
            .chain(self.backends.iter())
    }

    pub fn forwarding(&self) -> Forwarding {
        self.forwarding
    }

    /// The `k` of 10.77.k.0/24.
    pub fn subnet(&self) -> u8 {
        self.subnet
    }

    pub fn vip4(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, VIP_INDEX)
    }

    /// The IPv6 VIP, when the topology has IPv6.
    pub fn vip6(&self) -> Option<Ipv6Addr> {
        self.ipv6.then(|| v6_addr(self.subnet, VIP_INDEX))
    }

    /// A directory for this topology's files (configs), removed with it.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn configure_hosts(&self, static_neighbours: bool, offloads: Offloads) -> Result<(), Error> {
        let vip4 = self.vip4();
        let vip6 = self.vip6();
        for host in self.hosts() {
            let mut cmds = vec![
                format!("link set {HOST_IF} up"),
                format!("addr add {}/24 dev {HOST_IF}", host.ipv4),
            ];
            if let Some(v6) = host.ipv6 {
                cmds.push(format!("addr add {v6}/64 dev {HOST_IF} nodad"));
            }
            if host.role == "client" {
                cmds.push(format!("route add {vip4}/32 via {}", self.lb.ipv4));
                if let (Some(vip6), Some(lb6)) = (vip6, self.lb.ipv6) {
                    cmds.push(format!("route add {vip6}/128 via {lb6}"));
                }
            }
            let is_backend = host.role.starts_with('b');
            if is_backend && self.forwarding == Forwarding::Dsr {
                cmds.push(format!("addr add {vip4}/32 dev lo"));
                if let Some(vip6) = vip6 {
                    cmds.push(format!("addr add {vip6}/128 dev lo"));
                }
            }
            if static_neighbours {
                for other in self.hosts().filter(|o| o.role != host.role) {
                    cmds.push(format!(
                        "neigh replace {} lladdr {} dev {HOST_IF} nud permanent",
                        other.ipv4, other.mac
                    ));
                    if let Some(v6) = other.ipv6.filter(|_| host.ipv6.is_some()) {
                        cmds.push(format!(
                            "neigh replace {v6} lladdr {} dev {HOST_IF} nud permanent",
                            other.mac
                        ));
                    }
                }
            }
            host.ns.ip_batch(&cmds)?;
            if is_backend && self.forwarding == Forwarding::Dsr {
                // The VIP lives on lo: never answer or announce it on the wire, and accept
                // packets for it on eth0 whatever the reverse path looks like.
                for (key, value) in [
                    ("net.ipv4.conf.all.arp_ignore", "1"),
                    ("net.ipv4.conf.all.arp_announce", "2"),
                    ("net.ipv4.conf.eth0.arp_ignore", "1"),
                    ("net.ipv4.conf.eth0.arp_announce", "2"),
                    ("net.ipv4.conf.all.rp_filter", "0"),
                    ("net.ipv4.conf.eth0.rp_filter", "0"),
                ] {
                    host.ns.sysctl(key, value)?;
                }
            }
            link::set_host_offloads(&host.ns, HOST_IF, offloads, host.role == "lb")?;
        }
        Ok(())
    }
}

fn v6_addr(k: u8, index: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd77, 0, 0, u16::from(k), 0, 0, 0, u16::from(index))
}

/// A subnet index from the tag's counter: 1..=250.
fn default_subnet(tag: &str) -> u8 {
    let n: u32 = tag
        .rsplit_once('x')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(1);
    (n % 250 + 1) as u8
}
