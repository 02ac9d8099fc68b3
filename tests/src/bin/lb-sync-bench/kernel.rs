//! The kernel's side of a replica: the peer-table entries of a record (as the agent's
//! glue builds them), the tables' sizes, and what the kernel spends per replicated
//! connection.

use std::time::Duration;

use anyhow::Context;
use lb_agent::cluster::{Record, client_key, reply_key};
use lb_agent::dataplane::MapSizes;
use lb_agent::dataplane::peers::PeerConnection;
use lb_common::map_names;
use lb_tests::bpf::object::Lb;

use crate::node::record;

/// The backend id every replica is pinned to (this node's id of `10.0.1.11:8080`).
const BACKEND_ID: u32 = 1;

/// Time for the kernel to free a closed object's maps (a work item does, after the
/// last descriptor is closed).
const MAPS_FREED: Duration = Duration::from_secs(2);

/// Record's entries in `LB_PEER_FLOWS` and `LB_PEER_NAT`, as the agent's glue makes
/// them, with SNAT address index 0.
pub fn peer_connection(record: &Record) -> PeerConnection {
    PeerConnection::new(
        client_key(record),
        reply_key(record),
        record.state,
        BACKEND_ID,
        0,
        [0; 6],
    )
}

/// Tables for `connections` flows (`agent.max_flows`), in cluster mode or not.
pub fn sizes(connections: usize, cluster: bool) -> anyhow::Result<MapSizes> {
    let flows = u32::try_from(connections)?.max(lb_agent::dataplane::sizing::MIN_MAX_FLOWS);
    let sizes = MapSizes::default()
        .with_flows(flows)
        .with_context(|| format!("{connections} flows: out of agent.max_flows' range"))?;
    Ok(if cluster { sizes.with_cluster() } else { sizes })
}

/// `VmallocUsed` of /proc/meminfo, in bytes (where the kernel allocates a large hash
/// map's preallocated elements and buckets).
fn vmalloc_used() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("VmallocUsed:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .context("VmallocUsed in /proc/meminfo")?;
    Ok(kib * 1024)
}

/// `VmallocUsed` growth while `f` runs, and what it returns.
fn vmalloc_growth<T>(f: impl FnOnce() -> T) -> anyhow::Result<(i64, T)> {
    let before = vmalloc_used()?;
    let value = f();
    Ok((vmalloc_used()? as i64 - before as i64, value))
}

/// Kernel memory per replicated connection, with tables for `n` flows: the peer tables'
/// charge (`memlock`) per connection they hold (`agent.max_flows`); the object's
/// `VmallocUsed` growth in cluster mode less the same sizes without it, per connection; the growth while `n` connections are
/// installed (nothing if the elements were allocated when the maps were created).
pub fn memory(n: usize) -> anyhow::Result<()> {
    // The objects of the modes before are being freed by the kernel's work items.
    std::thread::sleep(MAPS_FREED);
    let (plain, lb) = vmalloc_growth(|| Lb::load_sized(sizes(n, false).expect("checked")))?;
    drop(lb);
    std::thread::sleep(MAPS_FREED);
    let (cluster, mut lb) = vmalloc_growth(|| Lb::load_sized(sizes(n, true).expect("checked")))?;
    let buckets = lb.sizes().peer_buckets();
    let held = lb.sizes().max_flows();
    let (flows_entries, flows_bytes) = lb.map_footprint(map_names::PEER_FLOWS);
    let (nat_entries, nat_bytes) = lb.map_footprint(map_names::PEER_NAT);
    anyhow::ensure!(flows_entries == buckets && nat_entries == buckets);
    let (installs, ()) = vmalloc_growth(|| {
        for i in 0..n as u32 {
            lb.install_peer(&peer_connection(&record(i)));
        }
    })?;
    let per = |bytes: i64| bytes as f64 / f64::from(held);
    println!(
        "memory: peer tables of {buckets} buckets each, holding {held} connections: memlock \
         LB_PEER_FLOWS {flows_bytes} B ({:.1} B/connection) + LB_PEER_NAT {nat_bytes} B \
         ({:.1} B/connection) = {:.1} B per connection \
         (MapSizes::peer_connection_bytes {}); VmallocUsed cluster-mode load {cluster} B - \
         without {plain} B = {:.1} B per connection; while installing {n}: {installs} B \
         ({:.1} B per connection)",
        per(flows_bytes as i64),
        per(nat_bytes as i64),
        per((flows_bytes + nat_bytes) as i64),
        MapSizes::peer_connection_bytes(),
        per(cluster - plain),
        installs as f64 / n as f64,
    );
    Ok(())
}

/// Connections installed at a time by [`writes`], as the agent installs a batch of
/// changes.
const WRITE_BATCH: usize = 1_000;

/// The peer tables' writes alone: `n` connections installed into tables sized for `n`
/// (`agent.max_flows`) through the agent's own writer, a batch of [`WRITE_BATCH`] at a
/// time, then removed; this thread's CPU time per connection.
pub fn writes(n: usize) -> anyhow::Result<()> {
    let mut dp = lb_agent::dataplane::BpfDataplane::load_sized(None, None, sizes(n, true)?)
        .context("loading the object in cluster mode (root?)")?;
    let mut peers = dp.take_peer_tables()?;
    let conns: Vec<PeerConnection> = (0..n as u32).map(|i| peer_connection(&record(i))).collect();
    let cpu = || -> anyhow::Result<u64> {
        // SAFETY: gettid has no preconditions.
        crate::node::thread_ns(unsafe { libc::gettid() })
    };
    let start = cpu()?;
    for batch in conns.chunks(WRITE_BATCH) {
        peers.install(batch)?;
    }
    let installed = cpu()? - start;
    anyhow::ensure!(peers.len() == n, "{} of {n} installed", peers.len());
    let keys: Vec<_> = conns.iter().map(|c| (c.client, c.reply)).collect();
    let start = cpu()?;
    for batch in keys.chunks(WRITE_BATCH) {
        peers.remove(batch);
    }
    let removed = cpu()? - start;
    anyhow::ensure!(peers.is_empty(), "{} left", peers.len());
    let rate = |ns: u64| n as f64 / (ns as f64 / 1e9);
    println!(
        "peer-table writes alone: {n} connections installed in {:.2?} of CPU ({:.0} per \
         CPU-second), removed in {:.2?} ({:.0} per CPU-second)",
        Duration::from_nanos(installed),
        rate(installed),
        Duration::from_nanos(removed),
        rate(removed),
    );
    Ok(())
}
