//! `lb-sync-bench [--records N] [--bulk N]`: the cluster component over QUIC on
//! loopback, two nodes in one process, each on its own thread with a single-threaded
//! runtime (one core each at most):
//!
//! - **live records per second one core receives and applies**: node A publishes N
//!   records in batches of 1,000; node B's thread time (its runtime: QUIC, decoding,
//!   the replica table, the changes handed out) per record gives records per
//!   CPU-second, and the wall time from the first publish to B's last apply;
//! - **bulk resync**: A holds N connections; B starts empty and the time until its
//!   resync completes (every record installed) is measured.

use std::net::{SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lb_agent::cluster::{Cluster, Record, RecordKind};
use lb_agent::config::{ClusterConfig, ClusterPeer};

const KEY: [u8; 32] = [0x42; 32];

fn record(n: u32) -> Record {
    let [a, b, c, d] = n.to_be_bytes();
    Record {
        kind: RecordKind::Open,
        protocol: lb_common::IPPROTO_TCP,
        state: lb_common::maps::NAT_S_ESTABLISHED | lb_common::maps::NAT_S_ACKED,
        age_ms: 0,
        vip: "10.0.0.100:80".parse().expect("literal"),
        client: SocketAddr::from(([100 + a, b, c, d], 40000)),
        backend: "10.0.1.11:8080".parse().expect("literal"),
        snat: SocketAddr::from(([10, 0, 0, 2], 1024 + (n % 30000) as u16)),
    }
}

fn configs(a: SocketAddr, b: SocketAddr) -> [ClusterConfig; 2] {
    let one = |node: &str, listen, peer: &str, address| ClusterConfig {
        node: node.into(),
        listen,
        key_file: "/unused".into(),
        resync_timeout: Duration::from_secs(600),
        peers: vec![ClusterPeer {
            name: peer.into(),
            address,
        }],
    };
    [one("lb-a", a, "lb-b", b), one("lb-b", b, "lb-a", a)]
}

/// Nanoseconds thread `tid` of this process has run.
fn thread_ns(tid: i32) -> anyhow::Result<u64> {
    let path = format!("/proc/self/task/{tid}/schedstat");
    let text = std::fs::read_to_string(&path).with_context(|| path.clone())?;
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("{path}: {text:?}"))
}

/// What B's thread reports.
struct Receiver {
    tid: i32,
    done: mpsc::Receiver<Duration>,
}

/// Starts B on its own thread and runtime; it reports the time until it applied
/// `expect` records (counting from its start) and then stops.
fn receiver(config: ClusterConfig, socket: UdpSocket, expect: usize) -> Receiver {
    let (tid_tx, tid_rx) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tid_tx.send(unsafe { libc::gettid() }).expect("main waits");
        let rt = single_thread().expect("runtime");
        rt.block_on(async move {
            let start = Instant::now();
            let mut b = Cluster::start_on(&config, &KEY, socket).expect("start B");
            let mut changes = b.take_changes().expect("the changes, taken once");
            let mut applied = 0usize;
            while applied < expect {
                match changes.recv().await {
                    Some(batch) => applied += batch.len(),
                    None => break,
                }
            }
            let mut resynced = b.resync_complete();
            let _ = resynced.wait_for(|d| *d).await;
            done_tx.send(start.elapsed()).expect("main waits");
            // Keep serving until the main thread has read the figures.
            tokio::time::sleep(Duration::from_secs(2)).await;
        });
    });
    Receiver {
        tid: tid_rx.recv().expect("the thread starts"),
        done,
    }
}

fn main() -> anyhow::Result<()> {
    let mut records = 1_000_000usize;
    let mut bulk = 1_000_000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value =
            || -> anyhow::Result<usize> { Ok(args.next().context("a value")?.parse()?) };
        match a.as_str() {
            "--records" => records = value()?,
            "--bulk" => bulk = value()?,
            other => {
                bail!("unknown argument {other}; usage: lb-sync-bench [--records N] [--bulk N]")
            }
        }
    }
    live(records)?;
    resync(bulk)?;
    Ok(())
}

/// A runtime on the calling thread only: one core at most.
fn single_thread() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Sockets for A and B, bound now.
fn sockets() -> anyhow::Result<(UdpSocket, UdpSocket, [ClusterConfig; 2])> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    let configs = configs(a.local_addr()?, b.local_addr()?);
    Ok((a, b, configs))
}

fn live(records: usize) -> anyhow::Result<()> {
    let (sa, sb, [ca, cb]) = sockets()?;
    let rt = single_thread()?;
    rt.block_on(async move {
        let a = Cluster::start_on(&ca, &KEY, sa)?;
        let b = receiver(cb, sb, records);
        // Wait for the (empty) bulk resync, so that only live records are timed.
        let up = Instant::now();
        while !a.status().peers[0].bulk_received
            || a.status().peers[0].state != lb_agent::cluster::PeerState::Up
        {
            if up.elapsed() > Duration::from_secs(10) {
                bail!("the nodes did not connect: {:#?}", a.status());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let cpu0 = thread_ns(b.tid)?;
        let start = Instant::now();
        let all: Vec<Record> = (0..records as u32).map(record).collect();
        // Paced to stay within the resend window: the live path, not a bulk.
        for chunk in all.chunks(1000) {
            a.publish(chunk);
            tokio::task::yield_now().await;
            while a.status().peers[0].lag_records > 100_000 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let wall = loop {
            if let Ok(d) = b.done.try_recv() {
                let _ = d;
                break start.elapsed();
            }
            if start.elapsed() > Duration::from_secs(300) {
                bail!("B did not apply {records} records: {:#?}", a.status());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let cpu = Duration::from_nanos(thread_ns(b.tid)? - cpu0);
        println!(
            "live: {records} records applied by B in {wall:.2?} wall ({:.0} records/s); \
             B's thread ran {cpu:.2?}: {:.0} records per CPU-second",
            records as f64 / wall.as_secs_f64(),
            records as f64 / cpu.as_secs_f64()
        );
        Ok(())
    })
}

fn resync(n: usize) -> anyhow::Result<()> {
    let (sa, sb, [ca, cb]) = sockets()?;
    let rt = single_thread()?;
    rt.block_on(async move {
        let a = Cluster::start_on(&ca, &KEY, sa)?;
        let all: Vec<Record> = (0..n as u32).map(record).collect();
        a.publish(&all);
        drop(all);
        let b = receiver(cb, sb, n);
        let start = Instant::now();
        let took = loop {
            if let Ok(d) = b.done.try_recv() {
                break d;
            }
            if start.elapsed() > Duration::from_secs(300) {
                bail!("no resync of {n} in 300 s: {:#?}", a.status());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        println!("bulk resync: {n} connections in {took:.2?} (B's start to its last install)");
        Ok(())
    })
}
