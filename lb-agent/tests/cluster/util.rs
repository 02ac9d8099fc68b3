//! Nodes of a test cluster on loopback, and waiting for what they report.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use lb_agent::cluster::{Change, Cluster, ClusterStatus, Record, RecordKind};
use lb_agent::config::{ClusterConfig, ClusterPeer};

/// The key every member holds.
pub const KEY: [u8; 32] = [0x5a; 32];

/// A member's name and the address the others dial for it.
pub struct Seat {
    pub name: String,
    pub address: SocketAddr,
    socket: Option<UdpSocket>,
}

impl Seat {
    /// Member `name` whose peers dial `address`, served on `socket`.
    pub fn new(name: &str, address: SocketAddr, socket: UdpSocket) -> Seat {
        Seat {
            name: name.into(),
            address,
            socket: Some(socket),
        }
    }
}

/// `n` members `lb-0`.. on loopback sockets bound now.
pub fn seats(n: usize) -> Vec<Seat> {
    (0..n)
        .map(|i| {
            let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
            Seat {
                name: format!("lb-{i}"),
                address: socket.local_addr().unwrap(),
                socket: Some(socket),
            }
        })
        .collect()
}

/// The config of member `me` among `seats`.
pub fn config(seats: &[Seat], me: usize) -> ClusterConfig {
    ClusterConfig {
        node: seats[me].name.clone(),
        listen: seats[me].address,
        key_file: "/unused".into(),
        resync_timeout: Duration::from_secs(3),
        peers: seats
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != me)
            .map(|(_, s)| ClusterPeer {
                name: s.name.clone(),
                address: s.address,
            })
            .collect(),
    }
}

/// Starts member `me` on its socket (bound again on its address after a stop).
pub fn start(seats: &mut [Seat], me: usize) -> Cluster {
    start_with(seats, me, &config(seats, me), &KEY)
}

pub fn start_with(seats: &mut [Seat], me: usize, config: &ClusterConfig, key: &[u8]) -> Cluster {
    let socket = match seats[me].socket.take() {
        Some(s) => s,
        None => rebind(seats[me].address),
    };
    Cluster::start_on(config, key, socket).unwrap()
}

/// A record of connection `n` of node `node` (distinct clients per pair).
pub fn record(node: u8, n: u32, kind: RecordKind) -> Record {
    let [_, b, c, d] = n.to_be_bytes();
    Record {
        kind,
        protocol: lb_common::IPPROTO_TCP,
        state: lb_common::maps::NAT_S_ESTABLISHED | lb_common::maps::NAT_S_ACKED,
        age_ms: 0,
        vip: "10.0.0.100:80".parse().unwrap(),
        client: SocketAddr::from(([100 + node, b, c, d], 40000)).into(),
        backend: "10.0.1.11:8080".parse().unwrap(),
        snat: SocketAddr::from(([10, 0, 0, 2], 1024 + (n % 30000) as u16)).into(),
    }
}

/// Waits up to `limit` for `cond` on `cluster`'s status; panics with the last status.
pub async fn until(
    cluster: &Cluster,
    limit: Duration,
    what: &str,
    cond: impl Fn(&ClusterStatus) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let s = cluster.status();
        if cond(&s) {
            return start.elapsed();
        }
        if start.elapsed() > limit {
            panic!("{what}: not within {limit:?}; status: {s:#?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every change `cluster` has handed out so far.
pub fn drain(cluster: &mut Cluster) -> Vec<Change> {
    let mut out = Vec::new();
    let Some(changes) = cluster.changes() else {
        return out;
    };
    while let Ok(batch) = changes.try_recv() {
        out.extend(batch);
    }
    out
}

/// Binds `address` again, once the stopped node's endpoint has let it go.
fn rebind(address: SocketAddr) -> UdpSocket {
    let start = Instant::now();
    loop {
        match UdpSocket::bind(address) {
            Ok(s) => return s,
            Err(e) if start.elapsed() > Duration::from_secs(5) => panic!("{address}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
