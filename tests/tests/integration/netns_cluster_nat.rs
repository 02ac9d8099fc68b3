//! A nat service on three lb nodes behind a BIRD ECMP router (docs/multi-node.md), the
//! backends on their own segment behind the same router: keep-alive connections and a
//! long download must survive every move the router makes (a node's agent and BIRD
//! killed, the node back, a node's link down and up, a node drained and undrained while
//! another node's agent is stopped) and the router's interface on the nodes' segment
//! moving to another MAC,
//! because every node forwards every packet of an established connection, in either
//! direction, exactly as the node that made it. New connections from several clients run
//! throughout and may fail only inside the router's detection window of an event. The
//! sync network of one node is then cut for a while: new connections keep working, and no
//! translation is ever held by two nodes (read from every node's `LB_NAT`; a collision
//! would also show at the backend as a new connection that fails).
//!
//! The hosts keep the offloads hosts with NICs have (`Offloads::HostDefaults`): TSO, GSO
//! and TX checksum offload on the client, the nodes and the backends, GRO on the nodes'
//! interfaces; the router and the switches' ports are the wire and send full checksums.
//!
//! Needs root and `bird` (`cargo xtask setup` installs bird2). Without bird the test
//! fails when `CI` is set and is skipped (with a message) otherwise.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use lb_common::maps::{FlowKey, NAT_S_FIN_BACKEND, NAT_S_FIN_CLIENT, NAT_S_RST};
use lb_tests::{
    agent::{flow_snapshot::NatTable, metric_families},
    net::{
        link::{self, Mac, Offloads},
        multinode::{self, MultiNode, Node},
    },
    traffic::{
        clients::EchoConn,
        download::Download,
        ordinary::{Ordinary, OrdinaryConfig},
        pacer::{Attempt, Outcome, PaceConfig, Pacer, summary, wall_now},
    },
};

/// First convergence: BGP sessions come up (connect retry) and exchange routes.
const CONVERGE: Duration = Duration::from_secs(30);
/// A dead BIRD or a link down: the router drops the path (BGP session closed, or BFD
/// after 300 ms); margin for a loaded host.
const WITHDRAW_BOUND: Duration = Duration::from_secs(3);
/// Keep-alive connections held through every event.
const KEEPALIVE: usize = 48;
/// The clients: one address each on the client host.
const CLIENTS: [Ipv4Addr; 4] = [
    multinode::CLIENT,
    Ipv4Addr::new(10, 91, 0, 11),
    Ipv4Addr::new(10, 91, 0, 12),
    Ipv4Addr::new(10, 91, 0, 13),
];
/// New connections: one per client this often.
const NEW_EVERY: Duration = Duration::from_millis(50);
/// Upper bound on the whole scenario's traffic.
const TRAFFIC_LIMIT: Duration = Duration::from_secs(150);
/// The long download: this many bytes at this rate (longer than every event together).
const DOWNLOAD_BYTES: u64 = 48 << 20;
const DOWNLOAD_RATE: u64 = 1 << 20;
/// A new connection may fail if it started this long before an event or within the
/// router's detection window after it (connect and greeting bounded by 2 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One event: when it began and when the router had moved the flows.
struct Event {
    what: &'static str,
    start: f64,
    moved: f64,
}

fn open_long_lived(topo: &MultiNode, n: usize) -> Vec<EchoConn> {
    (0..n)
        .map(|i| {
            let src = IpAddr::V4(CLIENTS[i % CLIENTS.len()]);
            EchoConn::connect(&topo.client, src, topo.vip())
                .expect("client namespace")
                .expect("a long-lived connection opens")
        })
        .collect()
}

/// The keep-alive connections and the first failure of each that broke.
struct Held {
    conns: Vec<EchoConn>,
    broken: Vec<Option<String>>,
}

impl Held {
    fn open(topo: &MultiNode, n: usize) -> Held {
        let conns = open_long_lived(topo, n);
        Held {
            broken: vec![None; conns.len()],
            conns,
        }
    }

    /// Echoes on every connection still working; notes the ones that fail now.
    fn check(&mut self, when: &str) {
        for (i, c) in self.conns.iter_mut().enumerate() {
            if self.broken[i].is_none()
                && let Err(e) = c.check_echo(&format!("{when}-{i}"))
            {
                self.broken[i] = Some(format!("{when}: connection {i} ({}): {e}", c.backend()));
            }
        }
    }

    fn failures(&self) -> Vec<&str> {
        self.broken.iter().flatten().map(String::as_str).collect()
    }
}

/// The second service: HTTP on the same VIP and SNAT address, whose backends close
/// first (`lb-testserver --web`).
fn http_service(backends: &[Ipv4Addr]) -> String {
    let mut text = format!(
        "\n[[service]]\nname = \"http\"\nvip = \"{}:{}\"\nprotocol = \"tcp\"\nforwarding = \"nat\"\n\
         fail_open = false\nsnat_ip = \"{SNAT}\"\n",
        multinode::VIP,
        multinode::WEB_PORT
    );
    for b in backends {
        text.push_str(&format!(
            "\n[[service.server]]\naddress = \"{b}:{}\"\n",
            multinode::WEB_PORT
        ));
    }
    text
}

/// The MAC the router's interface on the nodes' segment moves to.
const MOVED_ROUTER_MAC: Mac = Mac([0x02, 0x90, 0, 0x5a, 0, 1]);
/// From the router's announcement until every node's agent holds its new MAC.
const FOLLOW_BOUND: Duration = Duration::from_secs(3);

/// The MACs node's service `web` holds for its servers (`None`: not known), from its API.
fn server_macs(node: &Node) -> Vec<Option<String>> {
    let text = lb_tests::agent::api::Api::new(&node.ns)
        .request_ok("GET", "/api/v1/services/web", None)
        .expect("the node's service");
    let service = lb_tests::util::json::Json::parse(&text).expect("the service's JSON");
    service
        .get("servers")
        .map(|servers| {
            servers
                .items()
                .iter()
                .map(|s| s.get("mac").and_then(|m| m.as_str()).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Polls every node until its agent holds `mac` for every server.
fn wait_servers_at(topo: &MultiNode, mac: Mac, limit: Duration) {
    let want = Some(mac.to_string());
    let start = std::time::Instant::now();
    loop {
        let held: Vec<_> = topo.nodes.iter().map(server_macs).collect();
        if held.iter().flatten().all(|m| *m == want) {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "every node holds {mac} for every server within {limit:?}: {held:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until every node's status page lists a next-hop move to `mac` (replies whose
/// entry names the router's old MAC go to the new one); fails after `limit`.
fn wait_hop_moves_to(topo: &MultiNode, mac: Mac, limit: Duration) {
    let want = mac.to_string();
    let start = std::time::Instant::now();
    loop {
        let moves: Vec<Vec<String>> = topo
            .nodes
            .iter()
            .map(|n| {
                let page = n.cluster_page().expect("the node's cluster page");
                page.get("next_hop_moves")
                    .map(|m| m.items().to_vec())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|m| m.get("new").and_then(|v| v.as_str()).map(str::to_owned))
                    .collect()
            })
            .collect();
        if moves.iter().all(|m| m.contains(&want)) {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "every node follows the router's move to {mac} within {limit:?}: {moves:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `lb_cluster_adoptions_total{table="flow"}` of `node`: the client flows its data plane
/// took over from its peer tables.
fn flows_taken_over(node: &Node) -> f64 {
    let text = lb_tests::agent::api::Api::new(&node.ns)
        .metrics()
        .expect("the node's /metrics");
    lb_tests::agent::api::metric(&text, "lb_cluster_adoptions_total", &[("table", "flow")])
        .unwrap_or(0.0)
}

/// How long the sync network stays partitioned.
const PARTITION: Duration = Duration::from_secs(5);
/// After the partition heals, the time its resent records and reconnections take.
const HEAL_WINDOW: Duration = Duration::from_secs(1);

/// Cuts (`true`) or restores the sync traffic of the node in `ns`, both ways.
fn cut_sync(ns: &lb_tests::net::netns::NetNs, cut: bool) {
    if cut {
        let drop = format!("udp dport {SYNC_PORT} drop; udp sport {SYNC_PORT} drop;");
        let rules = format!(
            "table inet partition {{ chain input {{ type filter hook input priority 0; {drop} }}; \
             chain output {{ type filter hook output priority 0; {drop} }}; }}"
        );
        ns.nft(&[&rules]).expect("nft: cutting the sync network");
    } else {
        ns.nft(&["delete", "table", "inet", "partition"])
            .expect("nft: healing the sync network");
    }
}

/// The SNAT address every node shares (announced by each agent, not on an interface).
const SNAT: Ipv4Addr = Ipv4Addr::new(10, 94, 0, 1);
/// The sync port on every node's address.
const SYNC_PORT: u16 = 7946;

/// The `[cluster]` section of node `index` (every node lists the others as peers and
/// holds the same key file, written into its directory).
fn cluster_config(topo: &MultiNode, index: usize) -> String {
    let key: Vec<u8> = (0..32u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    let node = &topo.nodes[index];
    let key_file = node.dir.join("cluster.key");
    std::fs::write(&key_file, &key).expect("writing the key file");
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("key file mode");
    let mut text = format!(
        "\n[cluster]\nnode = \"{}\"\nlisten = \"{}:{SYNC_PORT}\"\nkey_file = {:?}\n",
        node.name,
        node.addr,
        key_file.display().to_string()
    );
    for (i, peer) in topo.nodes.iter().enumerate() {
        if i != index {
            text.push_str(&format!(
                "\n[[cluster.peer]]\nname = \"{}\"\naddress = \"{}:{SYNC_PORT}\"\n",
                peer.name, peer.addr
            ));
        }
    }
    text
}

/// Live translations that two nodes hold for different connections: the same reply
/// 5-tuple (backend <- SNAT address and port) in two nodes' `LB_NAT`, each not closed
/// (no reset, not both FINs), with another client or VIP. A backend would see one
/// 4-tuple used by two connections at once.
fn collisions(topo: &MultiNode) -> Vec<String> {
    let both_fins = NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND;
    let closed = |state: u8| state & NAT_S_RST != 0 || state & both_fins == both_fins;
    // Reply 5-tuple -> the node that holds it and the connection (client and VIP).
    let mut held: HashMap<FlowKey, (String, Connection)> = HashMap::new();
    let mut found = Vec::new();
    for node in &topo.nodes {
        let table = NatTable::open(&node.ns, "eth0").expect("the node's LB_NAT");
        table
            .for_each(|key, v| {
                if closed(v.state) {
                    return;
                }
                let this = Connection {
                    client: (v.client_addr, v.client_port),
                    vip: (v.vip_addr, v.vip_port),
                };
                match held.get(key) {
                    Some((other_node, other)) if *other != this => found.push(format!(
                        "{key:?}: {other_node} {other:?}, {} {this:?}",
                        node.name
                    )),
                    Some(_) => {}
                    None => {
                        held.insert(*key, (node.name.clone(), this));
                    }
                }
            })
            .expect("reading LB_NAT");
    }
    found
}

/// A nat connection by its client side: client and VIP (address and port, as on the wire).
#[derive(Debug, PartialEq, Eq)]
struct Connection {
    client: ([u32; 4], u16),
    vip: ([u32; 4], u16),
}

/// The event a failure that started at `start` (wall clock) belongs to. A new connection
/// may fail if it started within an event's window (from its start until the router
/// moved the flows), up to its timeout (`slack`) before an event (it was in flight), or
/// up to its timeout after the window closed. Windows with their slack overlap, so in
/// that order: the last event whose window holds it, else the first that began while
/// it was in flight, else the last whose window closed less than its timeout before.
fn owner(start: f64, events: &[Event], slack: Duration) -> Option<usize> {
    let slack = slack.as_secs_f64();
    let last = |held: &dyn Fn(&Event) -> bool| (0..events.len()).rev().find(|&i| held(&events[i]));
    last(&|e| start >= e.start && start <= e.moved)
        .or_else(|| {
            (0..events.len()).find(|&i| events[i].start > start && events[i].start <= start + slack)
        })
        .or_else(|| last(&|e| start > e.moved && start <= e.moved + slack))
}

/// The failures (wall-clock start, what) that no event explains ([`owner`]).
fn unexplained(
    failed: impl Iterator<Item = (f64, String)>,
    events: &[Event],
    slack: Duration,
) -> Vec<String> {
    failed
        .filter(|(start, _)| owner(*start, events, slack).is_none())
        .map(|(start, what)| format!("{what} at {start:.3}"))
        .collect()
}

#[test]
fn three_nat_nodes_keep_connections_when_the_router_moves_them() {
    if !multinode::bird_present() {
        return;
    }
    let mut topo = MultiNode::builder(3, 3)
        .routed()
        .offloads(Offloads::HostDefaults)
        .build()
        .expect("building the multi-node topology");
    for extra in &CLIENTS[1..] {
        topo.client
            .ip(&["addr", "add", &format!("{extra}/24"), "dev", "eth0"])
            .expect("client address");
    }
    let backends: Vec<_> = topo.backend_addrs().into_iter().map(|b| (b, 1)).collect();
    let topo_backends = topo.backend_addrs();
    for i in 0..topo.nodes.len() {
        let cluster = cluster_config(&topo, i);
        let n = &mut topo.nodes[i];
        n.forwarding = "nat";
        n.service_keys = format!("snat_ip = \"{SNAT}\"\n");
        n.extra_config = format!("{}{cluster}", http_service(&topo_backends));
        n.start_bird().expect("node BIRD");
        n.start_agent(&backends).expect("node agent");
    }
    let all: Vec<_> = topo.nodes.iter().map(|n| n.addr).collect();
    topo.wait_next_hops(&all, CONVERGE)
        .expect("the router learns the VIP from every node");

    let mut held = Held::open(&topo, KEEPALIVE);
    let download = Download::start(
        &topo.client,
        IpAddr::V4(CLIENTS[0]),
        topo.vip(),
        DOWNLOAD_BYTES,
        DOWNLOAD_RATE,
    )
    .expect("the download starts");
    let pacers: Vec<Pacer> = CLIENTS
        .iter()
        .map(|&src| {
            Pacer::start(
                &topo.client,
                PaceConfig {
                    src: IpAddr::V4(src),
                    first_port: 20000,
                    dst: topo.vip(),
                    every: NEW_EVERY,
                    count: (TRAFFIC_LIMIT.as_millis() / NEW_EVERY.as_millis()) as usize,
                    limit: TRAFFIC_LIMIT,
                    connect_timeout: CONNECT_TIMEOUT,
                },
            )
        })
        .collect();
    // HTTP as users make it: loops of new connections the backend closes first, and
    // keep-alive clients (the backend closes after 100 requests; they reconnect).
    let http_cfg = OrdinaryConfig::new(
        SocketAddr::new(IpAddr::V4(multinode::VIP), multinode::WEB_PORT),
        TRAFFIC_LIMIT,
    );
    let http = Ordinary::start(&topo.client, &http_cfg);
    // Every keep-alive connection is established well over 1 s before the first event.
    std::thread::sleep(Duration::from_millis(1500));
    held.check("before");
    let mut events = Vec::new();
    let settle = || std::thread::sleep(Duration::from_millis(1000));

    // n2's agent and BIRD killed: the router moves n2's flows to n1 and n3.
    let start = wall_now();
    let (agent, bird) = (
        topo.nodes[1].agent.take().expect("n2 agent"),
        topo.nodes[1].bird.take().expect("n2 BIRD"),
    );
    agent.signal(libc::SIGKILL).unwrap();
    bird.signal(libc::SIGKILL).unwrap();
    topo.wait_next_hops(&[all[0], all[2]], WITHDRAW_BOUND)
        .expect("n2 withdrawn when its BIRD dies");
    events.push(Event {
        what: "n2 killed",
        start,
        moved: wall_now(),
    });
    drop((agent, bird));
    settle();
    held.check("n2-killed");

    // n2 back: its agent resyncs before it announces, then BIRD brings it back.
    let start = wall_now();
    topo.nodes[1].start_agent(&backends).expect("n2 agent back");
    topo.nodes[1].start_bird().expect("n2 BIRD back");
    topo.wait_next_hops(&all, CONVERGE).expect("n2 back");
    events.push(Event {
        what: "n2 back",
        start,
        moved: wall_now(),
    });
    settle();
    held.check("n2-back");

    // n3's link down: BFD withdraws it; then up again.
    let start = wall_now();
    topo.nodes[2]
        .ns
        .ip(&["link", "set", "eth0", "down"])
        .expect("n3 link down");
    topo.wait_next_hops(&[all[0], all[1]], WITHDRAW_BOUND)
        .expect("n3 withdrawn when its link goes down");
    events.push(Event {
        what: "n3 link down",
        start,
        moved: wall_now(),
    });
    settle();
    held.check("n3-link-down");
    let start = wall_now();
    topo.nodes[2]
        .ns
        .ip(&["link", "set", "eth0", "up"])
        .expect("n3 link up");
    topo.nodes[2]
        .ns
        .ip(&[
            "route",
            "replace",
            "default",
            "via",
            &multinode::ROUTER_LAN.to_string(),
        ])
        .expect("n3 default route");
    topo.wait_next_hops(&all, CONVERGE).expect("n3 back");
    events.push(Event {
        what: "n3 link up",
        start,
        moved: wall_now(),
    });
    settle();
    held.check("n3-link-up");

    // n1 drained and undrained, n2's agent starved meanwhile (stopped: no CPU at all):
    // the router moves n1's flows to n2 and n3 for the first time, and n2's data plane
    // takes over those its agent installed before it stopped, alone.
    let adopted_before = flows_taken_over(&topo.nodes[1]);
    let starved = topo.nodes[1].agent.as_ref().expect("n2 agent");
    starved.signal(libc::SIGSTOP).expect("stopping n2's agent");
    let start = wall_now();
    topo.nodes[0].cli(&["node", "drain"]).expect("drain n1");
    topo.wait_next_hops(&[all[1], all[2]], WITHDRAW_BOUND)
        .expect("n1 withdrawn when drained");
    events.push(Event {
        what: "n1 drained, n2's agent stopped",
        start,
        moved: wall_now(),
    });
    settle();
    held.check("n1-drained-n2-starved");
    starved.signal(libc::SIGCONT).expect("resuming n2's agent");
    let start = wall_now();
    topo.nodes[0].cli(&["node", "undrain"]).expect("undrain n1");
    topo.wait_next_hops(&all, CONVERGE).expect("n1 back");
    events.push(Event {
        what: "n1 undrained, n2's agent resumed",
        start,
        moved: wall_now(),
    });
    settle();
    held.check("n1-undrained");
    let adopted = flows_taken_over(&topo.nodes[1]) - adopted_before;
    println!("n2 took over {adopted} client flows while its agent was stopped");
    assert!(
        adopted >= 1.0,
        "n2's data plane took n1's connections over while its agent was stopped"
    );

    // The router's interface on the nodes' segment moves to another MAC (a NIC swap, a
    // VRRP failover), announced by the kernel's gratuitous ARP. The router is every
    // backend's next hop from the nodes: each agent follows it through its neighbour
    // watch into its backend table, which the replicas installed on peers name by id.
    // It is also every client's previous hop: replies of established connections must
    // go to its new MAC too.
    let start = wall_now();
    topo.router
        .sysctl("net.ipv4.conf.eth0.arp_notify", "1")
        .expect("arp_notify on the router");
    link::set_mac(&topo.router, "eth0", MOVED_ROUTER_MAC).expect("the router's new MAC");
    wait_servers_at(&topo, MOVED_ROUTER_MAC, FOLLOW_BOUND);
    wait_hop_moves_to(&topo, MOVED_ROUTER_MAC, FOLLOW_BOUND);
    events.push(Event {
        what: "router MAC moved",
        start,
        moved: wall_now(),
    });
    settle();
    held.check("router-mac-moved");

    // The sync network partitioned: n3 neither sends to nor hears from its peers while
    // new connections keep coming through every node. Each node still hands out only
    // its own slice, and replies still reach their owner (the second hop needs no
    // sync): no translation is held twice and no new connection fails for it.
    cut_sync(&topo.nodes[2].ns, true);
    std::thread::sleep(PARTITION);
    let collided_partitioned = collisions(&topo);
    cut_sync(&topo.nodes[2].ns, false);
    // The resent records and reconnections right after the heal: a new connection
    // there may be reset (docs/multi-node.md, "What still breaks").
    let healed = wall_now();
    events.push(Event {
        what: "sync healed",
        start: healed,
        moved: healed + HEAL_WINDOW.as_secs_f64(),
    });
    settle();
    held.check("partition-healed");

    let attempts: Vec<Attempt> = pacers.into_iter().flat_map(Pacer::finish).collect();
    let http = http.finish(true);
    let download = download.finish();
    let failed_http: Vec<(f64, String)> = http
        .failures()
        .map(|(r, f)| (r.at, format!("http {:?}: {f:?}", r.client)))
        .collect();
    let failed: Vec<(f64, String)> = attempts
        .iter()
        .filter(|a| !matches!(a.outcome, Outcome::Answered(_)))
        .map(|a| (a.start, format!("port {}: {:?}", a.port, a.outcome)))
        .chain(failed_http)
        .collect();
    let slack = CONNECT_TIMEOUT.max(http_cfg.timeout);
    let late = unexplained(failed.iter().cloned(), &events, slack);
    let mut collided = collided_partitioned;
    collided.extend(collisions(&topo));
    let broke = held.failures();
    for (i, e) in events.iter().enumerate() {
        let inside: Vec<f64> = failed
            .iter()
            .filter(|(start, _)| owner(*start, &events, slack) == Some(i))
            .map(|(start, _)| start - e.start)
            .collect();
        eprintln!(
            "{} at {:.3}: over (the router's flows moved, or the window closed) {:.3} s after it began; \
             {} new connections failed in its window{}",
            e.what,
            e.start,
            e.moved - e.start,
            inside.len(),
            if inside.is_empty() {
                String::new()
            } else {
                let first = inside.iter().copied().fold(f64::INFINITY, f64::min);
                let last = inside.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!(", started {first:+.2} s to {last:+.2} s after it began")
            }
        );
    }
    eprintln!("new connections: {}", summary(&attempts));
    eprintln!("http: {}", http.summary());
    eprintln!("download: {download:?}");
    let mut shared = [0u64; 3];
    for node in &topo.nodes {
        let [bounced, flows, nats] = ["tx_peer_bounce", "peer_flow_adopted", "peer_nat_adopted"]
            .map(|c| node.counter(c).expect("the node's counters"));
        eprintln!(
            "{}: replies sent on to their owner {bounced}, flows taken over {flows}, reverse entries taken over {nats}",
            node.name
        );
        for (sum, n) in shared.iter_mut().zip([bounced, flows, nats]) {
            *sum += n;
        }
    }
    // A node in a cluster exports every family docs/metrics.md lists for it.
    let text = lb_tests::agent::api::Api::new(&topo.nodes[0].ns)
        .metrics()
        .expect("n1's /metrics");
    let exported = metric_families::exposed(&text);
    let missing: Vec<_> = metric_families::documented_by_section()
        .into_iter()
        .filter(|(name, (kind, section))| {
            section == metric_families::CLUSTER_SECTION && exported.get(name) != Some(kind)
        })
        .map(|(name, _)| name)
        .collect();
    assert!(
        missing.is_empty(),
        "cluster families documented, not exported: {missing:?}"
    );
    // The router's move was counted.
    let moves_followed =
        lb_tests::agent::api::metric(&text, "lb_cluster_next_hop_moves_total", &[]);
    assert!(
        moves_followed.is_some_and(|n| n >= 1.0),
        "n1 counts the router's move: lb_cluster_next_hop_moves_total {moves_followed:?}"
    );
    // Every node's status page shows its peers up, records going both ways, nothing
    // refused.
    for node in &topo.nodes {
        let c = node.cluster_page().expect("the status page's cluster");
        let peers = c
            .get("peers")
            .map(|p| p.items().to_vec())
            .unwrap_or_default();
        let refused = c.get("refused").expect("refusals");
        let refused_total: u64 = [
            "wrong_key",
            "foreign_node",
            "fingerprint",
            "version",
            "malformed",
            "replayed",
        ]
        .iter()
        .filter_map(|k| refused.get(k).and_then(|v| v.as_u64()))
        .sum();
        eprintln!("{}: cluster {c:?}", node.name);
        assert_eq!(peers.len(), 2, "{}: two peers on the page", node.name);
        for p in &peers {
            let field = |k: &str| p.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
            assert!(
                p.get("state").and_then(|s| s.as_str()) == Some("up")
                    && field("sent") > 0
                    && field("received") > 0,
                "{}: peer {p:?} is up and records went both ways",
                node.name
            );
        }
        assert_eq!(
            refused_total, 0,
            "{}: nothing refused: {refused:?}",
            node.name
        );
    }
    // The router spreads the backends' replies over every node: SYN-ACKs reach nodes
    // that have not heard of their connection yet, and the moves hand connections over.
    assert!(
        shared[0] > 0 && shared[1] > 0 && shared[2] > 0,
        "every mechanism was exercised (sent on, flows and reverse entries taken over): {shared:?}"
    );
    assert!(
        broke.is_empty() && late.is_empty() && download.is_ok() && collided.is_empty(),
        "{} of {KEEPALIVE} keep-alive connections broke:\n{broke:#?}\nnew connections that failed outside every \
         event's window:\n{late:#?}\ndownload: {download:?}\ntranslations held by two nodes:\n{collided:#?}",
        broke.len()
    );
}
