//! The two nodes of the bench: their records, configs and sockets, and node B, the
//! receiver, on its own thread with a single-threaded runtime (one core at most), which
//! takes the changes and installs them into the kernel's peer tables, a batch at a time, when given them.

use std::net::{SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use lb_agent::cluster::{Change, Cluster, Record, RecordKind};
use lb_agent::config::{ClusterConfig, ClusterPeer};
use lb_agent::dataplane::{BpfDataplane, MapSizes};

use crate::kernel;

pub const KEY: [u8; 32] = [0x42; 32];

/// Source ports per SNAT address in [`record`].
const PORTS_PER_SNAT: u32 = 60_000;

/// Connection `n`: its client address encodes `n` ([`index`]), and its reply's 5-tuple
/// (backend, SNAT address and port) is distinct too, so that each takes its own entry in
/// both peer tables.
pub fn record(n: u32) -> Record {
    let [a, b, c, d] = n.to_be_bytes();
    let [_, _, s1, s2] = (n / PORTS_PER_SNAT).to_be_bytes();
    Record {
        kind: RecordKind::Open,
        protocol: lb_common::IPPROTO_TCP,
        state: lb_common::maps::NAT_S_ESTABLISHED | lb_common::maps::NAT_S_ACKED,
        age_ms: 0,
        vip: "10.0.0.100:80".parse().expect("literal"),
        client: SocketAddr::from(([100 + a, b, c, d], 40000)).into(),
        backend: "10.0.1.11:8080".parse().expect("literal"),
        snat: SocketAddr::from(([10, 2 + s1, s2, 2], 1024 + (n % PORTS_PER_SNAT) as u16)).into(),
    }
}

/// The `n` of a [`record`].
pub fn index(record: &Record) -> u32 {
    match record.client.ip() {
        std::net::IpAddr::V4(a) => {
            let [a, b, c, d] = a.octets();
            u32::from_be_bytes([a - 100, b, c, d])
        }
        std::net::IpAddr::V6(_) => unreachable!("the bench's records are IPv4"),
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

/// Sockets for A and B, bound now, and their configs.
pub fn sockets() -> anyhow::Result<(UdpSocket, UdpSocket, [ClusterConfig; 2])> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    let configs = configs(a.local_addr()?, b.local_addr()?);
    Ok((a, b, configs))
}

/// A runtime on the calling thread only: one core at most.
pub fn single_thread() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Nanoseconds thread `tid` of this process has run.
pub fn thread_ns(tid: i32) -> anyhow::Result<u64> {
    let path = format!("/proc/self/task/{tid}/schedstat");
    let text = std::fs::read_to_string(&path).with_context(|| path.clone())?;
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("{path}: {text:?}"))
}

/// This process's resident memory in bytes.
pub fn resident_bytes() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("/proc/self/statm: {text:?}"))?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Ok(pages * u64::try_from(page)?)
}

/// What B is asked to do.
pub struct Plan {
    /// How many records it waits for.
    pub expect: usize,
    /// The peer tables to install each record into: an object loaded in cluster mode
    /// with these sizes; none: the cluster component alone.
    pub tables: Option<MapSizes>,
    /// Whether to note when each record's install was done.
    pub track: bool,
}

/// What B reports once it applied the records it expected.
pub struct Applied {
    /// From its start to its last install, its resync complete.
    pub took: Duration,
    /// Per record when tracked: its index and when its install was done.
    pub installs: Vec<(u32, Instant)>,
    /// The process's resident memory growth from B's start (its tables loaded) to then.
    pub resident_growth: i64,
}

/// B's thread; dropping it once B reported waits for the thread to end (and its
/// tables to be closed).
pub struct Receiver {
    pub tid: i32,
    /// Once B's cluster component serves its socket.
    started: mpsc::Receiver<()>,
    done: mpsc::Receiver<anyhow::Result<Applied>>,
    /// Until B reported.
    thread: Option<std::thread::JoinHandle<()>>,
    reported: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(thread) = self.reported.take() {
            let _ = thread.join();
        }
    }
}

/// Starts B on its own thread and runtime (its tables, when asked for, loaded before it
/// starts); it reports once it applied `plan.expect` records, then serves two seconds
/// more for A's figures to be read, and stops.
pub fn receiver(config: ClusterConfig, socket: UdpSocket, plan: Plan) -> Receiver {
    let (tid_tx, tid_rx) = mpsc::channel();
    let (started_tx, started) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    // Named, so that a profile (`perf report --comm lb-sync-b`) tells B's work apart.
    let thread = std::thread::Builder::new()
        .name("lb-sync-b".into())
        .spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).expect("main waits");
            // The agent's own write path: its peer tables, written through `mmap` a batch
            // of changes at a time.
            let mut tables = plan.tables.map(|sizes| {
                BpfDataplane::load_sized(None, None, sizes)
                    .and_then(|mut dp| dp.take_peer_tables().map(|t| (dp, t)))
                    .expect("the object loads in cluster mode (root?)")
            });
            let report = done_tx.clone();
            let run = || -> anyhow::Result<()> {
                single_thread()?.block_on(async move {
                    let resident = resident_bytes()?;
                    let start = Instant::now();
                    let mut b = Cluster::start_on(&config, &KEY, socket)?;
                    let _ = started_tx.send(());
                    let mut changes = b.take_changes().context("the changes, taken once")?;
                    let mut installs = Vec::with_capacity(if plan.track { plan.expect } else { 0 });
                    let mut applied = 0usize;
                    while applied < plan.expect {
                        let Some(batch) = changes.recv().await else {
                            break;
                        };
                        applied += batch.len();
                        let records = batch.iter().filter_map(|change| match change {
                            Change::Upsert(record) => Some(record),
                            Change::Remove(_) => None,
                        });
                        if let Some((_, peers)) = &mut tables {
                            // Sized at once, as the agent's glue sizes it.
                            let mut conns = Vec::with_capacity(batch.len());
                            conns.extend(records.clone().map(kernel::peer_connection));
                            peers
                                .install(&conns)
                                .context("installing into the peer tables")?;
                        }
                        if plan.track {
                            let done = Instant::now();
                            installs.extend(records.map(|record| (index(record), done)));
                        }
                    }
                    let mut resynced = b.resync_complete();
                    let _ = resynced.wait_for(|d| *d).await;
                    let took = start.elapsed();
                    let resident_growth = resident_bytes()? as i64 - resident as i64;
                    let _ = report.send(Ok(Applied {
                        took,
                        installs,
                        resident_growth,
                    }));
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    Ok(())
                })
            };
            if let Err(e) = run() {
                let _ = done_tx.send(Err(e));
            }
        })
        .expect("a thread starts");
    Receiver {
        tid: tid_rx.recv().expect("the thread starts"),
        started,
        done,
        thread: Some(thread),
        reported: None,
    }
}

impl Receiver {
    /// Blocks until B serves its socket (its tables loaded). A node started before
    /// dials a socket nobody reads yet: its handshake then takes as long as B's load,
    /// and QUIC's round-trip estimate, with the pacing it sets, starts that far off.
    pub fn wait_started(&self) -> anyhow::Result<()> {
        self.started
            .recv_timeout(Duration::from_secs(120))
            .context("B did not start in 120 s")
    }
}

/// Waits (polling, on A's runtime) up to `limit` for B's report.
pub async fn wait_done(b: &mut Receiver, limit: Duration, what: &str) -> anyhow::Result<Applied> {
    let start = Instant::now();
    loop {
        match b.done.try_recv() {
            Ok(applied) => {
                b.reported = b.thread.take();
                return applied;
            }
            Err(mpsc::TryRecvError::Disconnected) => anyhow::bail!("B stopped before {what}"),
            Err(mpsc::TryRecvError::Empty) => {}
        }
        if start.elapsed() > limit {
            anyhow::bail!("no {what} in {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until A is connected to B and their (empty) bulk resync is done, so that only
/// live records are timed.
pub async fn wait_up(a: &Cluster) -> anyhow::Result<()> {
    let start = Instant::now();
    while !a.status().peers[0].bulk_received
        || a.status().peers[0].state != lb_agent::cluster::PeerState::Up
    {
        if start.elapsed() > Duration::from_secs(60) {
            anyhow::bail!("the nodes did not connect: {:#?}", a.status());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
