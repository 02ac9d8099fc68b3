//! The agent's cluster component on the in-memory peer tables: what it writes into
//! `LB_CLUSTER` (member count, own index, the members' MACs, the shared SNAT ranges
//! before this node's slice is taken), and how peers' replicas become peer-table
//! entries in this node's terms (its backend ids, its next hop toward the client).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use crate::util::{Harness, LearnedNeighbours, sa, secs, servers};
use lb_agent::agent::{ClusterNode, Neighbours, StaticNeighbours};
use lb_agent::cluster::{self, Change, Cluster, Record, RecordKind};
use lb_agent::config::{ClusterConfig, ClusterPeer};
use lb_agent::neighbour::nexthops::Moved;
use lb_agent::testing::MemoryPeers;
use lb_common::maps::HopMove;

const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x77, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xc1, 0x01];
const BACKEND_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xbe, 0x01];

/// Two nat services sharing SNAT address 10.0.0.2 (one range), a third with its own.
fn config() -> String {
    let service = |name: &str, vip: &str, snat: &str, ports: &str| {
        format!(
            "[[service]]\nname = \"{name}\"\nvip = \"{vip}\"\nsnat_ip = \"{snat}\"\n\
             snat_ports = \"{ports}\"\n{}",
            servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")])
        )
    };
    service("web", "10.0.0.100:80", "10.0.0.2", "20000-29999")
        + &service("api", "10.0.0.101:80", "10.0.0.2", "20000-29999")
        + &service("dns", "10.0.0.102:80", "10.0.0.3", "1024-32767")
}

/// This node `lb-b` with one peer `lb-a` at 127.0.0.1 (no one answers there).
fn cluster_config(listen: SocketAddr) -> ClusterConfig {
    ClusterConfig {
        node: "lb-b".into(),
        listen,
        key_file: "/unused".into(),
        resync_timeout: Duration::from_secs(3),
        peers: vec![ClusterPeer {
            name: "lb-a".into(),
            address: sa("127.0.0.1:9"),
        }],
    }
}

async fn clustered() -> (Harness<StaticNeighbours>, MemoryPeers) {
    let neighbours = StaticNeighbours {
        table: [
            (sa("127.0.0.1:9").ip(), PEER_MAC),
            (sa("192.0.2.7:1").ip(), CLIENT_MAC),
        ]
        .into(),
        default: Some(BACKEND_MAC),
    };
    clustered_with(neighbours).await
}

async fn clustered_with<N: Neighbours>(neighbours: N) -> (Harness<N>, MemoryPeers) {
    let mut h = Harness::with_neighbours(&config(), neighbours).await;
    let socket = UdpSocket::bind("127.0.0.1:0").expect("a socket");
    let listen = socket.local_addr().expect("its address");
    let sync =
        Cluster::start_on(&cluster_config(listen), &[0x42; 32], socket).expect("the sync starts");
    let peers = MemoryPeers::default();
    h.agent_mut()
        .start_cluster(ClusterNode::new(sync, Box::new(peers.clone())));
    (h, peers)
}

fn record(kind: RecordKind, vip: &str, backend: &str) -> Record {
    Record {
        kind,
        protocol: lb_common::IPPROTO_TCP,
        state: lb_common::maps::NAT_S_ESTABLISHED | lb_common::maps::NAT_S_ACKED,
        age_ms: 0,
        vip: sa(vip).into(),
        client: sa("192.0.2.7:40000").into(),
        backend: sa(backend).into(),
        snat: sa("10.0.0.2:20001").into(),
    }
}

#[tokio::test(start_paused = true)]
async fn lb_cluster_holds_the_members_their_macs_and_each_shared_snat_range_once() {
    let (mut h, peers) = clustered().await;
    h.reload(&config()).await;
    h.agent_mut()
        .resolve_members(Duration::from_millis(5))
        .await;
    let members = peers.members();
    assert_eq!(members.count, 2);
    assert_eq!(members.own, 1, "lb-b after lb-a");
    assert_eq!(
        members.macs[0], PEER_MAC,
        "the peer's MAC, from its address"
    );
    assert_eq!(members.macs[1], [0; 6], "none for this node");
    assert_eq!(members.snat_count, 2, "10.0.0.2 once, 10.0.0.3");
    let ranges: Vec<(u16, u16)> = members.snat[..2]
        .iter()
        .map(|s| (s.port_min, s.port_max))
        .collect();
    assert_eq!(
        ranges,
        vec![(20000, 29999), (1024, 32767)],
        "whole ranges, before this node's slice"
    );
}

#[tokio::test(start_paused = true)]
async fn replicas_are_installed_in_this_nodes_terms_and_removed_when_they_expire() {
    let (mut h, peers) = clustered().await;
    let web = record(RecordKind::Open, "10.0.0.100:80", "10.0.1.2:80");
    let api = record(RecordKind::Open, "10.0.0.101:80", "10.0.1.1:80");
    let unknown = record(RecordKind::Open, "10.0.0.200:80", "10.0.1.1:80");
    h.agent_mut()
        .on_cluster_changes(vec![
            Change::Upsert(web),
            Change::Upsert(unknown),
            Change::Upsert(api),
        ])
        .await;
    let installed = peers.installed();
    assert_eq!(
        installed.len(),
        2,
        "the unknown service's replica is skipped"
    );
    for (rec, service) in [(web, "web"), (api, "api")] {
        let conn = installed[&cluster::client_key(&rec)];
        let ids = h.backend_ids(service, rec.backend.addr());
        assert!(
            ids.contains(&conn.flow.backend_id),
            "{service}: pinned to this node's id of its backend"
        );
        assert_eq!(conn.reply, cluster::reply_key(&rec));
        assert_eq!(
            conn.nat.client_mac, CLIENT_MAC,
            "the next hop toward the client"
        );
        assert_eq!(conn.flow.nat_addr, 0, "the service's first SNAT address");
    }
    h.agent_mut()
        .on_cluster_changes(vec![Change::Remove(web)])
        .await;
    let installed = peers.installed();
    assert_eq!(installed.len(), 1);
    assert!(installed.contains_key(&cluster::client_key(&api)));
}

#[tokio::test(start_paused = true)]
async fn a_clients_next_hop_that_moved_is_looked_up_again() {
    const MOVED_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xc1, 0x02];
    let neighbours = LearnedNeighbours::default();
    for backend in ["10.0.1.1", "10.0.1.2"] {
        neighbours.learn(backend.parse().unwrap(), BACKEND_MAC);
    }
    let client = sa("192.0.2.7:1").ip();
    neighbours.learn(client, CLIENT_MAC);
    let (mut h, peers) = clustered_with(neighbours).await;
    let web = record(RecordKind::Open, "10.0.0.100:80", "10.0.1.2:80");
    let installed_mac =
        |peers: &MemoryPeers| peers.installed()[&cluster::client_key(&web)].nat.client_mac;
    h.agent_mut()
        .on_cluster_changes(vec![Change::Upsert(web)])
        .await;
    assert_eq!(installed_mac(&peers), CLIENT_MAC);

    // The router toward the client moves to another MAC.
    h.neighbours.learn(client, MOVED_MAC);
    let refresh = Record {
        kind: RecordKind::Refresh,
        ..web
    };
    h.agent_mut()
        .on_cluster_changes(vec![Change::Upsert(refresh)])
        .await;
    assert_eq!(installed_mac(&peers), CLIENT_MAC, "kept a while");
    tokio::time::advance(secs(31)).await;
    h.agent_mut().refresh_cluster().await;
    h.agent_mut()
        .on_cluster_changes(vec![Change::Upsert(refresh)])
        .await;
    assert_eq!(installed_mac(&peers), MOVED_MAC, "looked up again");
}

#[tokio::test(start_paused = true)]
async fn a_neighbour_that_moves_reaches_lb_cluster_and_the_replicas() {
    const MOVED_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xc1, 0x03];
    const BACK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xc1, 0x04];
    const OTHER_BACKEND_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xc1, 0x05];
    // One router in front: the backends' next hop and the client's.
    let router: IpAddr = "10.0.0.254".parse().unwrap();
    let neighbours = LearnedNeighbours::default();
    for backend in ["10.0.1.1", "10.0.1.2"] {
        neighbours.learn(backend.parse().unwrap(), BACKEND_MAC);
    }
    let client = sa("192.0.2.7:1").ip();
    neighbours.learn(client, BACKEND_MAC);
    let (mut h, peers) = clustered_with(neighbours).await;
    let web = record(RecordKind::Open, "10.0.0.100:80", "10.0.1.2:80");
    let installed_mac =
        |peers: &MemoryPeers| peers.installed()[&cluster::client_key(&web)].nat.client_mac;
    let moves = |peers: &MemoryPeers| {
        let m = peers.members();
        m.hop_moves[..usize::from(m.hop_move_count)].to_vec()
    };
    h.agent_mut()
        .on_cluster_changes(vec![Change::Upsert(web)])
        .await;
    assert_eq!(installed_mac(&peers), BACKEND_MAC);
    assert_eq!(moves(&peers), []);

    // The router answers from another MAC; the kernel's neighbour watch reports the move
    // (no lookup is needed, so a loaded host cannot miss it).
    let moved = |old, new| Moved {
        addr: router,
        old,
        new,
    };
    h.send_neighbour_moves(&[moved(BACKEND_MAC, MOVED_MAC)])
        .await;
    let first = HopMove {
        old: BACKEND_MAC,
        new: MOVED_MAC,
    };
    assert_eq!(moves(&peers), [first], "LB_CLUSTER carries the move");
    let refresh = Record {
        kind: RecordKind::Refresh,
        ..web
    };
    h.agent_mut()
        .on_cluster_changes(vec![Change::Upsert(refresh)])
        .await;
    assert_eq!(
        installed_mac(&peers),
        MOVED_MAC,
        "a replica installed from now on names the new MAC, without waiting for the cache"
    );

    // A backend's own move is the backend table's business: no client is behind it.
    h.send_neighbour_moves(&[Moved {
        addr: "10.0.1.2".parse().unwrap(),
        old: OTHER_BACKEND_MAC,
        new: BACK_MAC,
    }])
    .await;
    assert_eq!(moves(&peers), [first], "nothing more");

    // The router moves on, then back: no reply is sent round a chain of moves.
    h.send_neighbour_moves(&[moved(MOVED_MAC, BACK_MAC)]).await;
    let on = HopMove {
        old: MOVED_MAC,
        new: BACK_MAC,
    };
    assert_eq!(
        moves(&peers),
        [
            HopMove {
                old: BACKEND_MAC,
                new: BACK_MAC
            },
            on
        ],
        "the first move carried along"
    );
    h.send_neighbour_moves(&[moved(BACK_MAC, BACKEND_MAC)])
        .await;
    assert_eq!(
        moves(&peers),
        [
            HopMove {
                old: MOVED_MAC,
                new: BACKEND_MAC
            },
            HopMove {
                old: BACK_MAC,
                new: BACKEND_MAC
            }
        ],
        "back where it began: nothing moves away from it"
    );
}
