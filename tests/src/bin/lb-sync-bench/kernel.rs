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
/// charge (`memlock`) per entry; the object's `VmallocUsed` growth in cluster mode
/// less the same sizes without it, per entry; the growth while `n` connections are
/// installed (nothing if the elements were allocated when the maps were created).
pub fn memory(n: usize) -> anyhow::Result<()> {
    // The objects of the modes before are being freed by the kernel's work items.
    std::thread::sleep(MAPS_FREED);
    let (plain, lb) = vmalloc_growth(|| Lb::load_sized(sizes(n, false).expect("checked")))?;
    drop(lb);
    std::thread::sleep(MAPS_FREED);
    let (cluster, mut lb) = vmalloc_growth(|| Lb::load_sized(sizes(n, true).expect("checked")))?;
    let entries = lb.sizes().peer_entries();
    let (flows_entries, flows_bytes) = lb.map_footprint(map_names::PEER_FLOWS);
    let (nat_entries, nat_bytes) = lb.map_footprint(map_names::PEER_NAT);
    anyhow::ensure!(flows_entries == entries && nat_entries == entries);
    let (installs, ()) = vmalloc_growth(|| {
        for i in 0..n as u32 {
            lb.install_peer(&peer_connection(&record(i)));
        }
    })?;
    let per = |bytes: i64| bytes as f64 / f64::from(entries);
    println!(
        "memory: peer tables of {entries} entries each: memlock LB_PEER_FLOWS {flows_bytes} B \
         ({:.1} B/entry) + LB_PEER_NAT {nat_bytes} B ({:.1} B/entry) = {:.1} B per connection \
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
