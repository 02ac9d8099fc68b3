//! The cluster sync between two network namespaces whose input drops 1 % of the sync
//! datagrams (nftables `numgen random mod 100 < 1`, so 1 % each way): records
//! published on one node reach the other's replicas, every one within a second.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use lb_agent::cluster::{Change, Cluster, PeerState, Record, RecordKind};
use lb_agent::config::{ClusterConfig, ClusterPeer};
use lb_tests::net::{
    link::{Mac, VethEnd, veth_pair},
    names::unique_tag,
    netns::NetNs,
};

const PORT: u16 = 7946;
const KEY: [u8; 32] = [0x33; 32];

fn lossy_input(ns: &NetNs) {
    let rules = format!(
        "table inet syncloss {{ chain input {{ type filter hook input priority 0; \
         udp dport {PORT} numgen random mod 100 < 1 counter drop; }}; }}"
    );
    ns.nft(&[&rules]).expect("the loss rule");
}

/// The packets the loss rule dropped in `ns`.
fn dropped(ns: &NetNs) -> u64 {
    let text = ns
        .nft(&["list", "table", "inet", "syncloss"])
        .expect("listing the loss rule");
    text.split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in {text}"))
}

fn config(me: usize, addrs: &[SocketAddr; 2]) -> ClusterConfig {
    let other = 1 - me;
    ClusterConfig {
        node: format!("lb-{me}"),
        listen: addrs[me],
        key_file: "/unused".into(),
        resync_timeout: Duration::from_secs(5),
        peers: vec![ClusterPeer {
            name: format!("lb-{other}"),
            address: addrs[other],
        }],
    }
}

fn record(n: u32) -> Record {
    let [_, b, c, d] = n.to_be_bytes();
    Record {
        kind: RecordKind::Open,
        protocol: lb_common::IPPROTO_TCP,
        state: lb_common::maps::NAT_S_ESTABLISHED | lb_common::maps::NAT_S_ACKED,
        age_ms: 0,
        vip: "10.0.0.100:80".parse().unwrap(),
        client: SocketAddr::from(([100, b, c, d], 40000)).into(),
        backend: "10.0.1.11:8080".parse().unwrap(),
        snat: SocketAddr::from(([10, 0, 0, 2], 1024 + (n % 30000) as u16)).into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_percent_loss_every_replica_converges_within_a_second() {
    let tag = unique_tag();
    let ns: Vec<NetNs> = (0..2)
        .map(|i| NetNs::create(&format!("{tag}c{i}")).expect("namespace"))
        .collect();
    let _link = veth_pair(
        VethEnd {
            ns: &ns[0],
            name: "eth0",
            mac: Mac([0x02, 0x72, 0, 0, 0, 1]),
        },
        VethEnd {
            ns: &ns[1],
            name: "eth0",
            mac: Mac([0x02, 0x72, 0, 0, 0, 2]),
        },
    )
    .expect("veth pair");
    let addrs: [SocketAddr; 2] = [
        format!("10.72.0.1:{PORT}").parse().unwrap(),
        format!("10.72.0.2:{PORT}").parse().unwrap(),
    ];
    for (i, n) in ns.iter().enumerate() {
        n.ip_batch(&[
            format!("addr add {}/24 dev eth0", addrs[i].ip()),
            "link set eth0 up".to_string(),
        ])
        .expect("address");
        lossy_input(n);
    }
    let sockets: Vec<UdpSocket> = (0..2)
        .map(|i| {
            let a = addrs[i];
            ns[i]
                .run(move || UdpSocket::bind(a))
                .unwrap()
                .expect("bind")
        })
        .collect();
    let mut nodes: Vec<Cluster> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, s)| Cluster::start_on(&config(i, &addrs), &KEY, s).expect("start"))
        .collect();
    let up = Instant::now();
    while !nodes
        .iter()
        .all(|n| n.status().peers[0].state == PeerState::Up && n.status().resync_complete)
    {
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "{:#?}",
            nodes[0].status()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let mut published = std::collections::HashMap::new();
    let mut worst = Duration::ZERO;
    let mut seen = 0usize;
    let total = 5000usize;
    let start = Instant::now();
    // Small batches, often: about a thousand datagrams each way.
    const BATCH: usize = 5;
    for batch in 0..(total / BATCH) as u32 {
        let records: Vec<Record> = (0..BATCH as u32)
            .map(|k| record(batch * BATCH as u32 + k))
            .collect();
        let at = Instant::now();
        for r in &records {
            published.insert(r.client, at);
        }
        nodes[0].publish(&records);
        let next = at + Duration::from_millis(2);
        while Instant::now() < next || (batch as usize + 1) * BATCH == total && seen < total {
            while let Ok(changes) = nodes[1].changes().expect("the changes stream").try_recv() {
                for c in changes {
                    if let Change::Upsert(r) = c {
                        worst = worst.max(published[&r.client].elapsed());
                        seen += 1;
                    }
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{seen} of {total}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    eprintln!(
        "{total} records with 1 % loss each way ({} and {} datagrams dropped): the slowest \
         took {worst:?}",
        dropped(&ns[0]),
        dropped(&ns[1])
    );
    assert_eq!(seen, total);
    assert!(
        worst < Duration::from_secs(1),
        "the slowest record took {worst:?}"
    );
    assert!(
        dropped(&ns[0]) + dropped(&ns[1]) > 0,
        "the rule dropped nothing"
    );
}
