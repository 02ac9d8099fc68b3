//! Records published on one node reach every other, in bulk and live, and again after
//! a restart.

use std::time::{Duration, Instant};

use lb_agent::cluster::{Change, PeerState, Record, RecordKind};
use lb_agent::config::ClusterConfig;

use crate::util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_converge_on_opens_refreshes_and_closes() {
    let mut seats = seats(3);
    let mut nodes: Vec<_> = (0..3).map(|i| start(&mut seats, i)).collect();
    for n in &nodes {
        until(n, Duration::from_secs(5), "resync", |s| {
            s.resync_complete
                && s.peers
                    .iter()
                    .all(|p| p.bulk_received && p.state == PeerState::Up)
        })
        .await;
    }
    for (i, n) in nodes.iter().enumerate() {
        let records: Vec<_> = (0..100)
            .map(|k| record(i as u8, k, RecordKind::Open))
            .collect();
        n.publish(&records);
    }
    for n in &nodes {
        until(n, Duration::from_secs(2), "300 connections", |s| {
            s.connections == 300
                && s.peers
                    .iter()
                    .all(|p| p.received == 100 && p.lag_records == 0)
        })
        .await;
    }
    let got = drain(&mut nodes[1]);
    assert_eq!(got.len(), 200, "node 1 installs the 200 of the others");
    assert!(got.contains(&Change::Upsert(record(0, 7, RecordKind::Open))));

    // A close (a reset) keeps the replica, closed, for the closed state's reuse time
    // (2 nat seconds and the expiry margin), then it expires.
    let close = Record {
        state: record(0, 7, RecordKind::Close).state | lb_common::maps::NAT_S_RST,
        ..record(0, 7, RecordKind::Close)
    };
    nodes[0].publish(&[close]);
    until(&nodes[1], Duration::from_secs(2), "the close", |s| {
        s.peers.iter().any(|p| p.received == 101)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(drain(&mut nodes[1]), vec![Change::Upsert(close)]);
    until(
        &nodes[1],
        Duration::from_secs(12),
        "the closed replica's expiry",
        |s| s.connections == 299,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(drain(&mut nodes[1]), vec![Change::Remove(close)]);
    for n in &nodes {
        let s = n.status();
        assert_eq!(
            s.refused.replayed + s.refused.malformed + s.refused.wrong_key,
            0,
            "{s:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_node_gets_a_bulk_resync_of_many_records_and_then_announces() {
    const RECORDS: u32 = 50_000;
    let mut seats = seats(2);
    let a = start(&mut seats, 0);
    let records: Vec<_> = (0..RECORDS)
        .map(|k| record(0, k, RecordKind::Open))
        .collect();
    a.publish(&records);
    let started = Instant::now();
    let patient = ClusterConfig {
        resync_timeout: Duration::from_secs(30),
        ..config(&seats, 1)
    };
    let mut b = start_with(&mut seats, 1, &patient, &KEY);
    let mut resynced = b.resync_complete();
    resynced.wait_for(|done| *done).await.unwrap();
    let took = started.elapsed();
    let s = b.status();
    assert_eq!(s.connections, RECORDS as usize, "{s:#?}");
    assert!(s.peers[0].bulk_received);
    assert!(
        took < Duration::from_secs(30),
        "the resync took {took:?}, not the timeout"
    );
    assert_eq!(drain(&mut b).len(), RECORDS as usize);
    eprintln!("bulk resync of {RECORDS} records: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_catches_up_with_a_bulk_resync() {
    let mut seats = seats(2);
    let a = start(&mut seats, 0);
    let b = start(&mut seats, 1);
    until(&a, Duration::from_secs(5), "up", |s| {
        s.peers[0].state == PeerState::Up
    })
    .await;
    a.publish(&[record(0, 1, RecordKind::Open)]);
    until(&b, Duration::from_secs(2), "first record", |s| {
        s.connections == 1
    })
    .await;

    // B restarts (a new incarnation, empty): while it is away A publishes more.
    drop(b);
    a.publish(
        &(2..50)
            .map(|k| record(0, k, RecordKind::Open))
            .collect::<Vec<_>>(),
    );
    let b = start(&mut seats, 1);
    until(
        &b,
        Duration::from_secs(5),
        "49 connections after the restart",
        |s| s.connections == 49 && s.resync_complete,
    )
    .await;
    a.publish(&[record(0, 99, RecordKind::Open)]);
    until(&b, Duration::from_secs(2), "live again", |s| {
        s.connections == 50
    })
    .await;
    until(&a, Duration::from_secs(2), "acknowledged", |s| {
        s.peers[0].lag_records == 0
    })
    .await;
}
