//! The multi-node BGP topology (docs/multi-node.md): a client behind a router namespace
//! running BIRD with ECMP (`merge paths`, `fib_multipath_hash_policy = 1`), and on one LAN
//! segment the router, two lb nodes (each with BIRD from `contrib/bird/lb-node.conf` and
//! `lb-agent` in dsr, generic XDP) and the backends (VIP on `lo`, answering the client
//! through the router).
//!
//! | host     | address                     |
//! |----------|-----------------------------|
//! | client   | 10.91.0.10/24, via .1       |
//! | router   | 10.91.0.1 (client), 10.90.0.1/24 (LAN), AS 65000 |
//! | node n   | 10.90.0.(1+n)/24, AS 65001  |
//! | backend n| 10.90.0.(10+n)/24           |
//! | VIP      | 10.92.0.100                 |
//!
//! [`MultiNodeBuilder::routed`] puts the backends on a segment of their own behind the
//! router instead (10.93.0.(10+n)/24 via 10.93.0.1), the layout a nat service across
//! nodes needs: the backends' replies reach the nodes through the router too.
//!
//! Every host sends full checksums unless the bed is built with other [`Offloads`]
//! ([`MultiNodeBuilder::offloads`]); the router and the switches' ports are the wire
//! and always send full checksums.
//!
//! Everything (processes first, then links and namespaces, then the directory) is
//! removed on drop, also when a test fails.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    agent::{
        api::{self, Api},
        daemon::{API_LISTEN, READY_LINE, locate_binary},
    },
    net::{
        link::{self, Link, Mac, Offloads, VethEnd},
        names,
        netns::NetNs,
        switch::Switch,
    },
    util::{error::Error, json::Json, process::NsProcess, temp_dir::TempDir},
};

pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 92, 0, 100);
pub const PORT: u16 = 8080;
/// The backends' HTTP port (`lb-testserver --web`): a backend that closes first, for
/// scenarios with a second service on the VIP.
pub const WEB_PORT: u16 = 8081;
pub const ROUTER_LAN: Ipv4Addr = Ipv4Addr::new(10, 90, 0, 1);
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 91, 0, 10);
/// The announce interface on every node.
pub const ANNOUNCE_IF: &str = "lbvip";

/// The repository's BIRD configs, used as the scenario's (addresses substituted).
const NODE_CONF: &str = include_str!("../../../contrib/bird/lb-node.conf");
const ROUTER_CONF: &str = include_str!("../../../contrib/bird/router-example.conf");

/// One lb node.
pub struct Node {
    pub name: String,
    pub addr: Ipv4Addr,
    pub ns: NetNs,
    pub dir: PathBuf,
    pub agent: Option<NsProcess>,
    pub bird: Option<NsProcess>,
    /// More `[agent]` lines for the agent's config (e.g. `announce_lifetime = "4s"`).
    pub agent_keys: String,
    /// The service's `forwarding`: `dsr` unless a scenario sets another (`ipip`, whose
    /// backends then decapsulate; `nat`, which needs `service_keys` with its `snat_ip`).
    pub forwarding: &'static str,
    /// More lines for the service's table (e.g. `snat_ip = "10.90.0.2"`).
    pub service_keys: String,
    /// Tables appended after the service (e.g. a `[cluster]` section).
    pub extra_config: String,
}

impl Node {
    pub fn socket(&self) -> PathBuf {
        self.dir.join("api.sock")
    }

    fn bird_socket(&self) -> PathBuf {
        self.dir.join("bird.ctl")
    }

    /// Starts BIRD with the contrib node config.
    pub fn start_bird(&mut self) -> Result<(), Error> {
        let conf = NODE_CONF
            .replace(
                "router id 192.0.2.11;",
                &format!("router id {};", self.addr),
            )
            .replace(
                "neighbor 192.0.2.1 as",
                &format!("neighbor {ROUTER_LAN} as"),
            )
            .replace("log syslog all;", "log stderr all;");
        let path = self.dir.join("bird.conf");
        std::fs::write(&path, conf).map_err(Error::io(format!("writing {}", path.display())))?;
        self.bird = Some(start_bird(
            &self.ns,
            &self.name,
            &path,
            &self.bird_socket(),
        )?);
        Ok(())
    }

    /// Starts `lb-agent run` (service `web` on the VIP over `backends` with their
    /// weights, fail-closed, in `forwarding`) and waits until it is ready.
    pub fn start_agent(&mut self, backends: &[(Ipv4Addr, u32)]) -> Result<(), Error> {
        let mut cfg = format!(
            "[agent]\ninterface = \"eth0\"\nxdp_mode = \"generic\"\napi_listen = \"{API_LISTEN}\"\npin_path = \"\"\n\
             api_socket = {:?}\nstate_file = {:?}\nannounce_interface = \"{ANNOUNCE_IF}\"\nbird_socket = {:?}\n{}\n\
             [[service]]\nname = \"web\"\nvip = \"{VIP}:{PORT}\"\nprotocol = \"tcp\"\nforwarding = \"{}\"\nfail_open = false\n{}",
            self.socket().display().to_string(),
            self.dir.join("admin-state.json").display().to_string(),
            self.bird_socket().display().to_string(),
            self.agent_keys,
            self.forwarding,
            self.service_keys,
        );
        for (b, weight) in backends {
            cfg.push_str(&format!(
                "\n[[service.server]]\naddress = \"{b}:{PORT}\"\nweight = {weight}\n"
            ));
        }
        cfg.push_str(&self.extra_config);
        let path = self.dir.join("lb.toml");
        std::fs::write(&path, cfg).map_err(Error::io(format!("writing {}", path.display())))?;
        let bin = locate_binary("lb-agent")?;
        let args = [
            "run".to_string(),
            "--config".into(),
            path.display().to_string(),
        ];
        let p = NsProcess::spawn(
            &self.ns,
            &format!("lb-agent {}", self.name),
            &bin,
            &args,
            &[("NO_COLOR", "1")],
        )?;
        p.wait_for_line(0, READY_LINE, Duration::from_secs(30))?;
        self.agent = Some(p);
        Ok(())
    }

    /// The VIP's lifetime on the node's announce interface in seconds (`None`: the
    /// address is not there; `u32::MAX`: forever), as `ip -o addr` shows it.
    pub fn vip_valid_lft(&self) -> Result<Option<u32>, Error> {
        let out = self
            .ns
            .ip(&["-o", "-4", "addr", "show", "dev", ANNOUNCE_IF])?;
        let Some(line) = out.lines().find(|l| l.contains(&format!("{VIP}/32"))) else {
            return Ok(None);
        };
        let lft = line
            .split_whitespace()
            .skip_while(|w| *w != "valid_lft")
            .nth(1)
            .ok_or_else(|| Error::Unexpected(format!("no valid_lft in {line:?}")))?;
        Ok(Some(if lft == "forever" {
            u32::MAX
        } else {
            lft.trim_end_matches("sec")
                .parse()
                .map_err(|_| Error::Unexpected(format!("valid_lft {lft:?} is not a number")))?
        }))
    }

    /// Runs `lb-agent ARGS… --socket <node's socket>` and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> Result<String, Error> {
        let bin = locate_binary("lb-agent")?;
        let socket = self.socket().display().to_string();
        let out = std::process::Command::new(bin)
            .args(args)
            .args(["--socket", &socket])
            .output()
            .map_err(|source| Error::Spawn {
                cmd: format!("lb-agent {args:?}"),
                source,
            })?;
        if !out.status.success() {
            return Err(Error::Command {
                cmd: format!("lb-agent {args:?} on {}", self.name),
                status: out.status.to_string(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `lb-agent status --json` of the node.
    fn status(&self) -> Result<Json, Error> {
        Json::parse(&self.cli(&["status", "--json"])?).map_err(|source| Error::Json {
            what: format!("`lb-agent status --json` on {}", self.name),
            source,
        })
    }

    /// The data plane's counter `name` (`lb_common::counters::NAMES`) from the node's
    /// `/metrics` (its API on the node's own loopback).
    pub fn counter(&self, name: &str) -> Result<u64, Error> {
        let text = Api::new(&self.ns)
            .metrics()
            .map_err(|e| Error::Unexpected(format!("/metrics on {}: {e}", self.name)))?;
        Ok(api::counter(&text, name).unwrap_or(0.0) as u64)
    }

    /// The cluster part of the status page's data (`/api/v1/page`, `cluster`).
    pub fn cluster_page(&self) -> Result<Json, Error> {
        let text = Api::new(&self.ns)
            .request_ok("GET", "/api/v1/page", None)
            .map_err(|e| Error::Unexpected(format!("/api/v1/page on {}: {e}", self.name)))?;
        let page = Json::parse(&text).map_err(|source| Error::Json {
            what: format!("/api/v1/page on {}", self.name),
            source,
        })?;
        page.get("cluster")
            .cloned()
            .ok_or_else(|| Error::Unexpected(format!("no cluster on {}'s page", self.name)))
    }

    /// The service's Maglev table fingerprint (`lb-agent status --json`).
    pub fn fingerprint(&self) -> Result<String, Error> {
        let json = self.status()?;
        Ok(json
            .items()
            .first()
            .and_then(|s| s.get("table_fingerprint"))
            .and_then(|f| f.as_str())
            .unwrap_or_default()
            .to_string())
    }

    /// New flows the node's service has seen (`lb-agent status --json`).
    pub fn flows(&self) -> Result<u64, Error> {
        let json = self.status()?;
        Ok(json
            .items()
            .first()
            .and_then(|s| s.at(&["stats", "flows"]))
            .and_then(|f| f.as_u64())
            .unwrap_or(0))
    }
}

/// The whole multi-node testbed. Field order is drop order.
pub struct MultiNode {
    pub servers: Vec<NsProcess>,
    pub router_bird: Option<NsProcess>,
    pub nodes: Vec<Node>,
    pub backends: Vec<(Ipv4Addr, NetNs)>,
    pub client: NetNs,
    pub router: NetNs,
    _links: Vec<Link>,
    _switch: Switch,
    _backend_switch: Option<Switch>,
    dir: TempDir,
}

impl MultiNode {
    /// Builds the topology with `nodes` lb nodes and `backends` backends running
    /// `lb-testserver` on the nodes' segment, BIRD on the router, every host sending
    /// full checksums; the nodes' BIRD and agents are not started.
    pub fn build(nodes: usize, backends: usize) -> Result<Self, Error> {
        Self::builder(nodes, backends).build()
    }

    /// Options for a topology of `nodes` lb nodes and `backends` backends, as
    /// [`build`](Self::build) makes it unless they say otherwise.
    pub fn builder(nodes: usize, backends: usize) -> MultiNodeBuilder {
        MultiNodeBuilder {
            nodes,
            backends,
            place: BackendPlace::Lan,
            offloads: Offloads::FullChecksums,
        }
    }

    fn build_with(
        nodes: usize,
        backends: usize,
        place: BackendPlace,
        offloads: Offloads,
    ) -> Result<Self, Error> {
        names::sweep_stale_once();
        let tag = names::unique_tag();
        let dir = TempDir::create(std::env::temp_dir().join(&tag))?;
        let mut switch = Switch::create(&tag)?;
        let mut links = Vec::new();
        let router = NetNs::create(&format!("{tag}-r"))?;
        let client = NetNs::create(&format!("{tag}-c"))?;
        links.push(link::veth_pair(
            VethEnd {
                ns: &router,
                name: "eth1",
                mac: Mac([0x02, 0x91, 0, 0, 0, 1]),
            },
            VethEnd {
                ns: &client,
                name: "eth0",
                mac: Mac([0x02, 0x91, 0, 0, 0, 10]),
            },
        )?);
        client.ip_batch(&[
            format!("addr add {CLIENT}/24 dev eth0"),
            "link set eth0 up".into(),
            "route add default via 10.91.0.1".into(),
        ])?;
        link::set_host_offloads(&client, "eth0", offloads, false)?;
        // Batches bind fixed source ports below 40000; ephemeral ones (long-lived
        // connections) stay above, so the two never collide.
        client.sysctl("net.ipv4.ip_local_port_range", "40000 60999")?;
        router.ip_batch(&[
            "addr add 10.91.0.1/24 dev eth1".into(),
            "link set eth1 up".into(),
        ])?;
        // The router is the wire: it sends full checksums in every bed.
        link::set_tx_checksum(&router, "eth1", false)?;
        router.sysctl("net.ipv4.ip_forward", "1")?;
        router.sysctl("net.ipv4.fib_multipath_hash_policy", "1")?;

        let mut lan = |ns: &NetNs, index: u8| -> Result<(), Error> {
            switch.plug(
                &format!("p{index}"),
                Mac([0x02, 0x89, 0, 0, 0, index]),
                VethEnd {
                    ns,
                    name: "eth0",
                    mac: Mac([0x02, 0x90, 0, 0, 0, index]),
                },
            )?;
            ns.ip_batch(&[
                format!("addr add 10.90.0.{index}/24 dev eth0"),
                "link set eth0 up".into(),
            ])?;
            Ok(())
        };
        lan(&router, 1)?;
        link::set_tx_checksum(&router, "eth0", false)?;
        let mut node_list = Vec::new();
        for n in 1..=nodes {
            let name = format!("n{n}");
            let ns = NetNs::create(&format!("{tag}-{name}"))?;
            lan(&ns, 1 + n as u8)?;
            link::set_host_offloads(&ns, "eth0", offloads, true)?;
            ns.ip(&["route", "add", "default", "via", &ROUTER_LAN.to_string()])?;
            let ndir = dir.path().join(&name);
            std::fs::create_dir_all(&ndir)
                .map_err(Error::io(format!("creating {}", ndir.display())))?;
            node_list.push(Node {
                name,
                addr: Ipv4Addr::new(10, 90, 0, 1 + n as u8),
                ns,
                dir: ndir,
                agent: None,
                bird: None,
                agent_keys: String::new(),
                forwarding: "dsr",
                service_keys: String::new(),
                extra_config: String::new(),
            });
        }
        let (backend_list, mut backend_switch) = match place {
            BackendPlace::Lan => (
                lan_backends(&tag, backends, &mut lan, &node_list, offloads)?,
                None,
            ),
            BackendPlace::Routed => {
                let (list, switch) = routed_backends(&tag, backends, &router, offloads)?;
                (list, Some(switch))
            }
        };
        switch.wire_ports(offloads)?;
        if let Some(s) = backend_switch.as_mut() {
            s.wire_ports(offloads)?;
        }
        let mut topo = MultiNode {
            servers: Vec::new(),
            router_bird: None,
            nodes: node_list,
            backends: backend_list,
            client,
            router,
            _links: links,
            _switch: switch,
            _backend_switch: backend_switch,
            dir,
        };
        let testserver = locate_binary("lb-testserver")?;
        for (i, (_, ns)) in topo.backends.iter().enumerate() {
            let name = format!("b{}", i + 1);
            let p = NsProcess::spawn(
                ns,
                &format!("testserver {name}"),
                &testserver,
                &[
                    "--name",
                    &name,
                    "--tcp",
                    &PORT.to_string(),
                    "--web",
                    &WEB_PORT.to_string(),
                ],
                &[],
            )?;
            p.wait_for_line(0, "ready", Duration::from_secs(10))?;
            topo.servers.push(p);
        }
        topo.start_router_bird()?;
        Ok(topo)
    }

    fn start_router_bird(&mut self) -> Result<(), Error> {
        let mut conf = ROUTER_CONF
            .replace("router id 192.0.2.1;", &format!("router id {ROUTER_LAN};"))
            .replace("log syslog all;", "log stderr all;");
        for (i, n) in self.nodes.iter().enumerate() {
            let example = format!("neighbor 192.0.2.1{} as", i + 1);
            if conf.contains(&example) {
                conf = conf.replace(&example, &format!("neighbor {} as", n.addr));
            } else {
                // The example config has two nodes; more are added as it adds them.
                conf.push_str(&format!(
                    "\nprotocol bgp lb{} from lb_node {{\n\tneighbor {} as 65001;\n}}\n",
                    i + 1,
                    n.addr
                ));
            }
        }
        let path = self.dir.path().join("router-bird.conf");
        std::fs::write(&path, conf).map_err(Error::io(format!("writing {}", path.display())))?;
        let socket = self.dir.path().join("router-bird.ctl");
        self.router_bird = Some(start_bird(&self.router, "router", &path, &socket)?);
        Ok(())
    }

    pub fn backend_addrs(&self) -> Vec<Ipv4Addr> {
        self.backends.iter().map(|(a, _)| *a).collect()
    }

    pub fn vip(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(VIP), PORT)
    }

    /// The next hops of the router's route to the VIP (empty: no route).
    pub fn next_hops(&self) -> Result<Vec<Ipv4Addr>, Error> {
        next_hops(&self.router)
    }

    /// Polls the router's next hops every 10 ms on another thread until
    /// [`HopWatch::finish`]; that returns every distinct set seen, in order.
    pub fn watch_next_hops(&self) -> HopWatch {
        let router = self.router.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen: Vec<Vec<Ipv4Addr>> = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                if let Ok(hops) = next_hops(&router)
                    && seen.last() != Some(&hops)
                {
                    seen.push(hops);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        });
        HopWatch { stop, thread }
    }

    /// Polls the router until its next hops for the VIP are `want`; how long it took.
    pub fn wait_next_hops(&self, want: &[Ipv4Addr], limit: Duration) -> Result<Duration, Error> {
        let start = Instant::now();
        let mut want = want.to_vec();
        want.sort();
        loop {
            let hops = self.next_hops()?;
            if hops == want {
                return Ok(start.elapsed());
            }
            if start.elapsed() > limit {
                return Err(Error::Timeout {
                    what: format!("the router's next hops for {VIP} to be {want:?}"),
                    waited: limit,
                    last: format!("{hops:?}"),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Whether BIRD is installed: without it a multi-node scenario fails when `CI` is set
/// (setup installs bird2) and is skipped with a message otherwise.
pub fn bird_present() -> bool {
    match which("bird") {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_some() => panic!("{e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}

impl MultiNode {
    /// `n` new connections from the client, source ports from `first_port`, each
    /// answered by a backend's name (60 s at most for the batch).
    pub fn batch(&self, first_port: u16, n: usize) -> crate::traffic::clients::Tally {
        crate::traffic::clients::tcp_names(
            &self.client,
            CLIENT.into(),
            first_port,
            self.vip(),
            n,
            Duration::from_secs(60),
        )
        .expect("client namespace")
    }
}

/// The next hops of `router`'s route to the VIP, sorted (empty: no route).
fn next_hops(router: &NetNs) -> Result<Vec<Ipv4Addr>, Error> {
    let out = router.ip(&["-4", "route", "show", &format!("{VIP}/32")])?;
    let words: Vec<&str> = out.split_whitespace().collect();
    let mut hops: Vec<Ipv4Addr> = words
        .windows(2)
        .filter(|w| w[0] == "via")
        .filter_map(|w| w[1].parse().ok())
        .collect();
    hops.sort();
    Ok(hops)
}

/// A running [`MultiNode::watch_next_hops`].
pub struct HopWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Vec<Ipv4Addr>>>,
}

impl HopWatch {
    /// Stops polling; every set of next hops seen, in order (repeats collapsed).
    pub fn finish(self) -> Vec<Vec<Ipv4Addr>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Starts `bird -f -c CONF -s SOCKET` in `ns`; ready once its control socket exists.
pub fn start_bird(ns: &NetNs, label: &str, conf: &Path, socket: &Path) -> Result<NsProcess, Error> {
    let bird = which("bird")?;
    let args = [
        "-f".to_string(),
        "-c".into(),
        conf.display().to_string(),
        "-s".into(),
        socket.display().to_string(),
    ];
    let p = NsProcess::spawn(ns, &format!("bird {label}"), &bird, &args, &[])?;
    // Ready once its control socket exists.
    let start = Instant::now();
    while !socket.exists() {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(Error::Timeout {
                what: format!("bird {label}'s control socket"),
                waited: Duration::from_secs(10),
                last: p.tail(20),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(p)
}

/// `bird` on PATH; missing → an error naming `cargo xtask setup`.
pub fn which(program: &str) -> Result<PathBuf, Error> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Unexpected(format!(
                "`{program}` is not installed: run `cargo xtask setup` (bird2)"
            ))
        })
}

/// Options of a [`MultiNode`]; start with [`MultiNode::builder`].
#[derive(Clone, Copy, Debug)]
pub struct MultiNodeBuilder {
    nodes: usize,
    backends: usize,
    place: BackendPlace,
    offloads: Offloads,
}

impl MultiNodeBuilder {
    /// The backends on a segment of their own behind the router (default: on the
    /// nodes' segment).
    pub fn routed(mut self) -> Self {
        self.place = BackendPlace::Routed;
        self
    }

    /// What the hosts (client, nodes, backends) keep of veth's offloads (default
    /// [`Offloads::FullChecksums`]); the nodes' interfaces get GRO on with any other.
    pub fn offloads(mut self, offloads: Offloads) -> Self {
        self.offloads = offloads;
        self
    }

    /// Builds the topology and starts BIRD on the router and `lb-testserver` on every
    /// backend; the nodes' BIRD and agents are not started.
    pub fn build(self) -> Result<MultiNode, Error> {
        MultiNode::build_with(self.nodes, self.backends, self.place, self.offloads)
    }
}

/// Where a [`MultiNode`]'s backends are.
#[derive(Clone, Copy, Debug)]
enum BackendPlace {
    /// On the nodes' segment, the VIP on `lo` (dsr and tunnels).
    Lan,
    /// On a segment of their own behind the router.
    Routed,
}

/// Backends on the nodes' segment: the VIP on `lo`, answering ARP only for their own
/// address; the nodes know their MACs (no test depends on ARP timing).
fn lan_backends(
    tag: &str,
    backends: usize,
    lan: &mut impl FnMut(&NetNs, u8) -> Result<(), Error>,
    nodes: &[Node],
    offloads: Offloads,
) -> Result<Vec<(Ipv4Addr, NetNs)>, Error> {
    let mut backend_list = Vec::new();
    for b in 1..=backends {
        let ns = NetNs::create(&format!("{tag}-b{b}"))?;
        lan(&ns, 10 + b as u8)?;
        link::set_host_offloads(&ns, "eth0", offloads, false)?;
        ns.ip_batch(&[
            format!("addr add {VIP}/32 dev lo"),
            format!("route add default via {ROUTER_LAN}"),
        ])?;
        for (k, v) in [
            ("net.ipv4.conf.all.arp_ignore", "1"),
            ("net.ipv4.conf.all.arp_announce", "2"),
            ("net.ipv4.conf.eth0.arp_ignore", "1"),
            ("net.ipv4.conf.eth0.arp_announce", "2"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.eth0.rp_filter", "0"),
        ] {
            ns.sysctl(k, v)?;
        }
        backend_list.push((Ipv4Addr::new(10, 90, 0, 10 + b as u8), ns));
    }
    // Nodes know the backends' MACs (no test depends on ARP timing).
    for node in nodes {
        for (i, (addr, _)) in backend_list.iter().enumerate() {
            let mac = Mac([0x02, 0x90, 0, 0, 0, 11 + i as u8]).to_string();
            node.ns.ip(&[
                "neigh",
                "replace",
                &addr.to_string(),
                "lladdr",
                &mac,
                "dev",
                "eth0",
                "nud",
                "permanent",
            ])?;
        }
    }
    Ok(backend_list)
}

/// The router's address on the backends' own segment ([`MultiNode::build_routed`]).
pub const ROUTER_BACKENDS: Ipv4Addr = Ipv4Addr::new(10, 93, 0, 1);

/// Backends on a segment of their own (a second switch) behind the router: router
/// `eth2` at [`ROUTER_BACKENDS`]/24, backend n at 10.93.0.(10+n), routed through it.
fn routed_backends(
    tag: &str,
    backends: usize,
    router: &NetNs,
    offloads: Offloads,
) -> Result<(Vec<(Ipv4Addr, NetNs)>, Switch), Error> {
    let mut switch = Switch::create(&format!("{tag}s"))?;
    let mut plug = |ns: &NetNs, name: &str, index: u8| -> Result<(), Error> {
        switch.plug(
            &format!("p{index}"),
            Mac([0x02, 0x92, 0, 0, 0, index]),
            VethEnd {
                ns,
                name,
                mac: Mac([0x02, 0x93, 0, 0, 0, index]),
            },
        )?;
        ns.ip_batch(&[
            format!("addr add 10.93.0.{index}/24 dev {name}"),
            format!("link set {name} up"),
        ])
    };
    plug(router, "eth2", 1)?;
    link::set_tx_checksum(router, "eth2", false)?;
    let mut list = Vec::new();
    for b in 1..=backends {
        let ns = NetNs::create(&format!("{tag}-b{b}"))?;
        plug(&ns, "eth0", 10 + b as u8)?;
        link::set_host_offloads(&ns, "eth0", offloads, false)?;
        ns.ip(&[
            "route",
            "add",
            "default",
            "via",
            &ROUTER_BACKENDS.to_string(),
        ])?;
        list.push((Ipv4Addr::new(10, 93, 0, 10 + b as u8), ns));
    }
    Ok((list, switch))
}
