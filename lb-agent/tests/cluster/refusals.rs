//! What the cluster component refuses, and counts: another key, a node that is not a
//! member, another member list, replayed and forged datagrams. None of it changes the
//! replicas. A connection cut for longer than QUIC's idle timeout resumes from the
//! peer's acknowledgement, resending what was lost; with 1 % loss and reordering every
//! record arrives within a second.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lb_agent::cluster::{Cluster, PeerState, RecordKind};
use lb_agent::config::ClusterPeer;

use crate::util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_is_refused_both_ways_and_changes_nothing() {
    let mut seats = seats(2);
    let mut a = start(&mut seats, 0);
    let other = config(&seats, 1);
    let x = start_with(&mut seats, 1, &other, &[0x77; 32]);
    x.publish(&[record(1, 1, RecordKind::Open)]);
    until(
        &a,
        Duration::from_secs(5),
        "wrong_key on the acceptor",
        |s| s.refused.wrong_key >= 1,
    )
    .await;
    until(&x, Duration::from_secs(5), "wrong_key on the dialer", |s| {
        s.refused.wrong_key >= 1
    })
    .await;
    let s = a.status();
    assert_eq!((s.connections, s.peers[0].received), (0, 0), "{s:#?}");
    assert!(drain(&mut a).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_node_and_another_member_list_are_refused() {
    let mut seats = seats(3);
    let mut a = start(&mut seats, 0);
    // lb-9 is no member of lb-0's cluster, though it holds the key.
    let mut foreign = config(&seats, 2);
    foreign.node = "lb-9".into();
    let x = start_with(&mut seats, 2, &foreign, &KEY);
    // lb-1 is a member, but its list has one more peer.
    let mut wider = config(&seats, 1);
    wider.peers.push(ClusterPeer {
        name: "lb-5".into(),
        address: "127.0.0.1:9".parse().unwrap(),
    });
    let y = start_with(&mut seats, 1, &wider, &KEY);
    x.publish(&[record(9, 1, RecordKind::Open)]);
    y.publish(&[record(1, 1, RecordKind::Open)]);
    until(&a, Duration::from_secs(5), "both refusals", |s| {
        s.refused.foreign_node >= 1 && s.refused.fingerprint >= 1
    })
    .await;
    until(&x, Duration::from_secs(5), "x told", |s| {
        s.peers
            .iter()
            .any(|p| p.name == "lb-0" && p.state == PeerState::Refused)
    })
    .await;
    until(&y, Duration::from_secs(5), "y told", |s| {
        s.peers
            .iter()
            .any(|p| p.name == "lb-0" && p.state == PeerState::Refused)
    })
    .await;
    assert_eq!(a.status().connections, 0);
    assert!(drain(&mut a).is_empty());
}

/// A UDP relay between a dialer and the acceptor behind it, which can hold every
/// datagram back, or lose and reorder some, and keeps a copy of what the dialer sent.
pub struct Relay {
    address: SocketAddr,
    socket: Arc<tokio::net::UdpSocket>,
    target: SocketAddr,
    pub blocked: Arc<AtomicBool>,
    /// Lose 1 % of the datagrams either way and hold 5 % back until the next one.
    pub lossy: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Relay {
    async fn new(target: SocketAddr) -> Relay {
        let socket = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let relay = Relay {
            address: socket.local_addr().unwrap(),
            socket: socket.clone(),
            target,
            blocked: Arc::default(),
            lossy: Arc::default(),
            sent: Arc::default(),
        };
        let (blocked, lossy, sent) = (
            relay.blocked.clone(),
            relay.lossy.clone(),
            relay.sent.clone(),
        );
        tokio::spawn(async move {
            let mut dialer = None;
            let mut buf = vec![0u8; 65536];
            let mut held: Option<(Vec<u8>, SocketAddr)> = None;
            let mut x = 0x2545_f491_4f6c_dd1du64;
            loop {
                let (n, from) = socket.recv_from(&mut buf).await.unwrap();
                if blocked.load(Relaxed) {
                    continue;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let lossy = lossy.load(Relaxed);
                if lossy && x.is_multiple_of(100) {
                    continue;
                }
                let to = if from == target {
                    dialer
                } else {
                    dialer = Some(from);
                    sent.lock().unwrap().push(buf[..n].to_vec());
                    Some(target)
                };
                let Some(to) = to else { continue };
                if lossy && held.is_none() && x % 100 < 6 {
                    held = Some((buf[..n].to_vec(), to));
                    continue;
                }
                let _ = socket.send_to(&buf[..n], to).await;
                if let Some((late, to)) = held.take() {
                    let _ = socket.send_to(&late, to).await;
                }
            }
        });
        relay
    }

    /// Sends `datagrams` to the acceptor as if the dialer had.
    async fn inject(&self, datagrams: &[Vec<u8>]) {
        for d in datagrams {
            self.socket.send_to(d, self.target).await.unwrap();
        }
    }
}

/// Two nodes where lb-0 reaches lb-1 through a relay (lb-1's address in both configs is
/// the relay's; lb-1's socket is behind it).
async fn relayed() -> (Vec<Seat>, Relay, Cluster, Cluster) {
    let mut seats = seats(2);
    let behind = UdpSocket::bind("127.0.0.1:0").unwrap();
    let relay = Relay::new(behind.local_addr().unwrap()).await;
    seats[1] = Seat::new("lb-1", relay.address, behind);
    let a = start(&mut seats, 0);
    let b = start(&mut seats, 1);
    until(&a, Duration::from_secs(5), "up", |s| {
        s.peers[0].state == PeerState::Up
    })
    .await;
    (seats, relay, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_and_forged_datagrams_change_nothing_and_stray_ones_are_counted() {
    let (_seats, relay, a, mut b) = relayed().await;
    a.publish(
        &(0..10)
            .map(|k| record(0, k, RecordKind::Open))
            .collect::<Vec<_>>(),
    );
    until(&b, Duration::from_secs(2), "10 connections", |s| {
        s.connections == 10
    })
    .await;
    drain(&mut b);
    let captured = relay.sent.lock().unwrap().clone();
    let before = b.status();

    // Replayed into the live connection (QUIC drops them as duplicates), flipped
    // (authentication fails), and random (no connection has their id).
    relay.inject(&captured).await;
    let flipped: Vec<Vec<u8>> = captured
        .iter()
        .map(|d| {
            let mut d = d.clone();
            let last = d.len() - 1;
            d[last] ^= 0x55;
            d
        })
        .collect();
    relay.inject(&flipped).await;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<Vec<u8>> = (0..100)
        .map(|_| {
            (0..64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x as u8) & 0x7f
                })
                .collect()
        })
        .collect();
    relay.inject(&random).await;
    until(&b, Duration::from_secs(2), "the random ones counted", |s| {
        s.stray_datagrams >= before.stray_datagrams + 100
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = b.status();
    assert_eq!(s.connections, 10);
    assert_eq!(s.peers[0].received, before.peers[0].received);
    assert_eq!(
        s.refused.replayed, 0,
        "QUIC dropped the replays before the application"
    );
    assert!(drain(&mut b).is_empty());

    // Once the connection is gone, its replayed datagrams belong to no connection.
    drop(a);
    until(&b, Duration::from_secs(3), "the connection gone", |s| {
        !s.peers[0].receiving
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = b.status().stray_datagrams;
    relay.inject(&captured).await;
    until(
        &b,
        Duration::from_secs(2),
        "the late replays counted",
        |s| s.stray_datagrams >= before + captured.len() as u64,
    )
    .await;
    assert_eq!(b.status().connections, 10);
    assert!(drain(&mut b).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_longer_than_the_idle_timeout_resumes_and_resends() {
    let (_seats, relay, a, b) = relayed().await;
    a.publish(&[record(0, 0, RecordKind::Open)]);
    until(&b, Duration::from_secs(2), "first", |s| s.connections == 1).await;
    relay.blocked.store(true, Relaxed);
    a.publish(
        &(1..20)
            .map(|k| record(0, k, RecordKind::Open))
            .collect::<Vec<_>>(),
    );
    until(&a, Duration::from_secs(10), "the connection dropped", |s| {
        s.peers[0].state == PeerState::Connecting
    })
    .await;
    relay.blocked.store(false, Relaxed);
    until(&b, Duration::from_secs(5), "20 connections", |s| {
        s.connections == 20
    })
    .await;
    let s = a.status();
    assert_eq!(s.peers[0].resent, 19, "{s:#?}");
    assert_eq!(s.peers[0].sent, 20);
    assert_eq!(b.status().refused.replayed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_tells_whether_a_peer_answers_with_the_same_key() {
    use lb_agent::cluster::{Identity, Reach, reach};
    let mut seats = seats(2);
    let _a = start(&mut seats, 0);
    let peer = seats[0].address;
    let within = Duration::from_secs(2);
    let same = Identity::derive(&KEY).unwrap();
    assert!(matches!(reach(&same, peer, within).await, Reach::Up(_)));
    let other = Identity::derive(&[0x77; 32]).unwrap();
    assert_eq!(reach(&other, peer, within).await, Reach::WrongKey);
    let nobody = UdpSocket::bind("127.0.0.1:0").unwrap();
    let silent = nobody.local_addr().unwrap();
    let got = reach(&same, silent, Duration::from_millis(300)).await;
    assert!(matches!(got, Reach::NoAnswer(_)), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_loss_and_reordering_every_record_arrives_within_a_second() {
    let (_seats, relay, a, mut b) = relayed().await;
    relay.lossy.store(true, Relaxed);
    let mut published = std::collections::HashMap::new();
    let mut worst = Duration::ZERO;
    let mut seen = 0;
    for batch in 0..100u32 {
        let records: Vec<_> = (0..20)
            .map(|k| record(0, batch * 20 + k, RecordKind::Open))
            .collect();
        let at = std::time::Instant::now();
        for r in &records {
            published.insert(r.client, at);
        }
        a.publish(&records);
        let until = at + Duration::from_millis(10);
        while std::time::Instant::now() < until {
            seen += arrivals(&mut b, &published, &mut worst);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let start = std::time::Instant::now();
    while seen < 2000 && start.elapsed() < Duration::from_secs(5) {
        seen += arrivals(&mut b, &published, &mut worst);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(seen, 2000);
    eprintln!("with 1 % loss and reordering: the slowest of 2000 records took {worst:?}");
    assert!(worst < Duration::from_secs(1), "{worst:?}");
}

/// Counts the records `b` installed since the last call, raising `worst` to the longest
/// time one took since it was published.
fn arrivals(
    b: &mut Cluster,
    published: &std::collections::HashMap<lb_agent::cluster::Endpoint, std::time::Instant>,
    worst: &mut Duration,
) -> usize {
    let mut n = 0;
    for change in drain(b) {
        if let lb_agent::cluster::Change::Upsert(r) = change {
            *worst = (*worst).max(published[&r.client].elapsed());
            n += 1;
        }
    }
    n
}
