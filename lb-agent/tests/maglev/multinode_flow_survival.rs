//! Flow survival across lb nodes behind ECMP routers (docs/multi-node.md), by simulation
//! over the real table builder: N nodes with identical Maglev tables (same config on
//! every node) and a per-node flow table as the data plane keeps it in dsr (a packet
//! without an entry — a SYN, or a mid-connection packet at a node that never saw the
//! SYN — opens one through the Maglev table; an entry whose backend still exists is
//! kept). Routers pick a node by hash-threshold ECMP over the announcing nodes, as
//! Linux does. Counted: established flows whose backend changes when a node is added or
//! removed, a backend is added or removed, and both at once.
//!
//! Run with `--nocapture` to see the figures the docs quote.

use std::collections::HashMap;
use std::net::SocketAddr;

use lb_agent::maglev::{MaglevBackend, build_table, failover_table, stable_key};
use lb_common::{MAGLEV_RING_SIZE, NO_BACKEND};

/// Established flows simulated per scenario.
const FLOWS: usize = 200_000;

fn addr(i: u32) -> SocketAddr {
    format!("10.0.1.{}:80", i + 1).parse().unwrap()
}

/// The live table every node builds from `backends` (all healthy, weight 1), mapped to
/// addresses: ids are per node and do not matter (each node numbers its own).
fn table(backends: &[u32]) -> Vec<Option<SocketAddr>> {
    let input: Vec<MaglevBackend> = backends
        .iter()
        .map(|&b| MaglevBackend {
            id: b + 1,
            key: stable_key(&addr(b)),
            weight: 1,
        })
        .collect();
    let home = build_table(&input, MAGLEV_RING_SIZE);
    let live = failover_table(&home, |_| true);
    live.iter()
        .map(|&id| (id != NO_BACKEND).then(|| addr(id - 1)))
        .collect()
}

/// splitmix64: the flows' 5-tuple hashes, reproducible.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash-threshold ECMP (Linux `fib_select_multipath`): the hash space is cut into equal
/// ranges, one per next hop in order.
fn ecmp(hash: u64, nodes: &[u32]) -> u32 {
    let h = hash >> 32; // 32-bit hash like the kernel's
    nodes[((h * nodes.len() as u64) >> 32) as usize]
}

#[derive(Debug, Default, Clone, Copy)]
struct Outcome {
    /// Flows whose node changed.
    moved_node: usize,
    /// Flows whose backend was removed (they break whatever the balancer does).
    backend_gone: usize,
    /// Flows on a surviving backend that now reach another one (broken by us).
    changed_backend: usize,
}

/// Establishes `FLOWS` flows on `nodes0`/`backends0`, then sends one more packet of each
/// after the change to `nodes1`/`backends1`.
fn simulate(nodes0: &[u32], backends0: &[u32], nodes1: &[u32], backends1: &[u32]) -> Outcome {
    let t0 = table(backends0);
    let t1 = table(backends1);
    let size = t0.len() as u64;
    let mut flow_tables: HashMap<u32, HashMap<usize, SocketAddr>> = HashMap::new();
    let mut first = Vec::with_capacity(FLOWS);
    for f in 0..FLOWS {
        let h = mix(f as u64);
        let node = ecmp(h, nodes0);
        let b = t0[(h % size) as usize].expect("a full table");
        flow_tables.entry(node).or_default().insert(f, b);
        first.push((node, b));
    }
    let mut out = Outcome::default();
    for (f, &(node0, b0)) in first.iter().enumerate() {
        let h = mix(f as u64);
        let node = ecmp(h, nodes1);
        if node != node0 {
            out.moved_node += 1;
        }
        let alive = |b: &SocketAddr| backends1.iter().any(|&i| addr(i) == *b);
        let pinned = flow_tables
            .get(&node)
            .and_then(|t| t.get(&f))
            .filter(|b| alive(b))
            .copied();
        let b1 = pinned.unwrap_or_else(|| t1[(h % size) as usize].expect("a full table"));
        if !alive(&b0) {
            out.backend_gone += 1;
        } else if b1 != b0 {
            out.changed_backend += 1;
        }
    }
    out
}

/// Share of slots whose backend differs between the two tables.
fn slots_changed(backends0: &[u32], backends1: &[u32]) -> f64 {
    let (a, b) = (table(backends0), table(backends1));
    a.iter().zip(&b).filter(|(x, y)| x != y).count() as f64 / a.len() as f64
}

fn pct(n: usize) -> f64 {
    100.0 * n as f64 / FLOWS as f64
}

fn report(what: &str, o: Outcome) {
    println!(
        "{what:<44} moved node {:>6.2}%  backend removed {:>6.2}%  changed backend {:>6.3}%",
        pct(o.moved_node),
        pct(o.backend_gone),
        pct(o.changed_backend)
    );
}

const M: u32 = 10;

fn all(n: u32) -> Vec<u32> {
    (0..n).collect()
}

#[test]
fn a_node_lost_or_added_changes_no_backend() {
    let backends = all(M);
    let removed = simulate(&all(4), &backends, &[0, 1, 3], &backends);
    report("4 nodes -> 3 (node 2 lost), 10 backends", removed);
    let added = simulate(&all(3), &backends, &all(4), &backends);
    report("3 nodes -> 4, 10 backends", added);
    for o in [removed, added] {
        assert!(
            o.moved_node > FLOWS / 10,
            "setup: flows must move node: {o:?}"
        );
        assert_eq!(
            o.changed_backend, 0,
            "identical tables keep every flow: {o:?}"
        );
        assert_eq!(o.backend_gone, 0);
    }
}

#[test]
fn a_backend_removed_breaks_only_its_own_flows() {
    let nodes = all(4);
    let o = simulate(&nodes, &all(M), &nodes, &all(M - 1));
    report("10 backends -> 9, 4 nodes", o);
    assert_eq!(o.moved_node, 0);
    assert_eq!(o.changed_backend, 0, "the others keep theirs: {o:?}");
    let share = o.backend_gone as f64 / FLOWS as f64;
    assert!(
        (share - 1.0 / M as f64).abs() < 0.01,
        "about 1/M of the flows were on it: {share}"
    );
}

#[test]
fn a_backend_added_changes_nothing_established() {
    let nodes = all(4);
    let o = simulate(&nodes, &all(M), &nodes, &all(M + 1));
    report("10 backends -> 11, 4 nodes", o);
    assert_eq!(o.changed_backend, 0, "flow entries pin them: {o:?}");
    // Without flow entries (every packet through the table) the new backend's share
    // would move: Maglev's promise is close to the ideal 1/(M+1).
    let moved = slots_changed(&all(M), &all(M + 1));
    println!(
        "table slots changed by 10 -> 11 backends: {:.2}% (ideal 1/11 = {:.2}%)",
        100.0 * moved,
        100.0 / 11.0
    );
    assert!(moved >= 1.0 / (M + 1) as f64 - 0.005 && moved < 1.5 / (M + 1) as f64);
}

#[test]
fn a_backend_added_while_a_node_is_lost_breaks_the_moved_flows_on_changed_slots() {
    let o = simulate(&all(4), &all(M), &[0, 1, 3], &all(M + 1));
    report("4 -> 3 nodes and 10 -> 11 backends at once", o);
    let slots = slots_changed(&all(M), &all(M + 1));
    // Only flows that moved node look the table up again; of those, the ones whose slot
    // changed owner break.
    let expected = o.moved_node as f64 * slots;
    assert!(
        o.changed_backend > 0,
        "this is the case that breaks flows: {o:?}"
    );
    assert!(
        (o.changed_backend as f64 - expected).abs() < 0.1 * expected,
        "changed {} vs moved x slot share {expected:.0}",
        o.changed_backend
    );
    assert!(o.changed_backend < o.moved_node);
}
