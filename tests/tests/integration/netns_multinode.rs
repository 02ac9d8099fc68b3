//! Several lb nodes behind a BIRD router with ECMP (docs/multi-node.md), end to end:
//! two nodes in dsr each announce the VIP through BIRD (contrib/bird configs); new
//! connections spread over both nodes and both backends; killing one node's BIRD
//! withdraws it at the router within the bound while long-lived connections that went
//! through it keep working through the other node (mid-connection packets at a node that
//! never saw the SYN reach the same backend); a drained node is withdrawn and its
//! connections survive; a service losing its servers on one node only is withdrawn from
//! that node only; an agent restart withdraws nothing and fails no request.
//!
//! Needs root and `bird` (`cargo xtask setup` installs bird2). Without bird the test
//! fails when `CI` is set and is skipped (with a message) otherwise.

use std::time::{Duration, Instant};

use lb_tests::net::multinode::{self, MultiNode};
use lb_tests::traffic::clients::{EchoConn, tcp_names};

/// BIRD killed: its TCP session closes; the router drops the path in milliseconds (the
/// issue measured 3–9 ms). Bound with margin for a loaded machine.
const WITHDRAW_BOUND: Duration = Duration::from_secs(1);
/// First convergence: BGP sessions come up (connect retry) and exchange routes.
const CONVERGE: Duration = Duration::from_secs(30);
/// Connections per batch (source ports from the batch's first port, below the client's
/// ephemeral range 40000-60999).
const BATCH: usize = 120;
/// The agent reads data-plane counters every 500 ms: wait this long before reading them.
const STATS_SETTLE: Duration = Duration::from_millis(1200);

fn batch(topo: &MultiNode, first_port: u16) -> lb_tests::traffic::clients::Tally {
    topo.batch(first_port, BATCH)
}

/// Connections made in batches of 10 every few milliseconds (source ports from 35000)
/// until finished, at most 200 batches and 60 s.
struct Background {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>)>,
}

impl Background {
    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("traffic thread")
    }
}

fn traffic_during(topo: &MultiNode) -> Background {
    let client = topo.client.clone();
    let vip = topo.vip();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let start = Instant::now();
        let (mut made, mut failed) = (0, Vec::new());
        for round in 0..200u16 {
            if flag.load(std::sync::atomic::Ordering::Relaxed)
                || start.elapsed() > Duration::from_secs(60)
            {
                break;
            }
            let t = tcp_names(
                &client,
                multinode::CLIENT.into(),
                35000 + round * 10,
                vip,
                10,
                Duration::from_secs(30),
            )
            .expect("client namespace");
            made += t.attempted;
            failed.extend(t.failures);
            std::thread::sleep(Duration::from_millis(5));
        }
        (made, failed)
    });
    Background { stop, thread }
}

/// The `quiet X s` figure of `lb-agent node status`.
fn quiet_seconds(status: &str) -> f64 {
    status
        .split("quiet ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no quiet time in {status:?}"))
}

fn open_long_lived(topo: &MultiNode, n: usize) -> Vec<EchoConn> {
    (0..n)
        .map(|_| {
            EchoConn::connect(&topo.client, multinode::CLIENT.into(), topo.vip())
                .expect("client namespace")
                .expect("a long-lived connection opens")
        })
        .collect()
}

fn check_all(conns: &mut [EchoConn], what: &str) {
    for (i, c) in conns.iter_mut().enumerate() {
        if let Err(e) = c.check_echo(&format!("{what}-{i}")) {
            panic!("long-lived connection {i} ({}) {what}: {e}", c.backend());
        }
    }
}

#[test]
fn two_nodes_behind_ecmp_survive_bird_loss_drain_and_restart() {
    if !multinode::bird_present() {
        return;
    }
    let mut topo = MultiNode::build(2, 2).expect("building the multi-node topology");
    let backends = topo.backend_addrs();
    // b1 weight 1, b2 weight 2.
    let weighted: Vec<_> = backends.iter().copied().zip([1, 2]).collect();
    for n in &mut topo.nodes {
        n.start_bird().expect("node BIRD");
        n.start_agent(&weighted).expect("node agent");
    }
    let (n1, n2) = (topo.nodes[0].addr, topo.nodes[1].addr);
    topo.wait_next_hops(&[n1, n2], CONVERGE)
        .expect("the router learns the VIP from both nodes");

    // Same config, same health: the same table on both nodes.
    let fp = topo.nodes[0].fingerprint().unwrap();
    assert_eq!(fp.len(), 16, "a fingerprint in status: {fp:?}");
    assert_eq!(fp, topo.nodes[1].fingerprint().unwrap(), "tables differ");

    // Spread: both nodes and both backends carry a share.
    let flows_before = [
        topo.nodes[0].flows().unwrap(),
        topo.nodes[1].flows().unwrap(),
    ];
    let spread = 2 * BATCH;
    let t = tcp_names(
        &topo.client,
        multinode::CLIENT.into(),
        30000,
        topo.vip(),
        spread,
        Duration::from_secs(60),
    )
    .expect("client namespace");
    // Shares by weight (1:2), within 35 % of the expected share (b1: 33 % ± 12 points,
    // about four standard deviations at 240 connections).
    if let Err(e) = t.check_shares(&[("b1", 1), ("b2", 2)], 0.35) {
        panic!("{e}\n{}", t.table(&[("b1", 1), ("b2", 2)]));
    }
    std::thread::sleep(STATS_SETTLE);
    for (i, node) in topo.nodes.iter().enumerate() {
        let got = node.flows().unwrap() - flows_before[i];
        assert!(
            got as f64 > 0.15 * spread as f64,
            "{} carried {got} of {spread} new connections (ECMP must spread them)",
            node.name
        );
    }
    // BIRD is read every 2 s: the session state shows within a few reads.
    let start = Instant::now();
    let status = loop {
        let status = topo.nodes[0].cli(&["node", "status"]).unwrap();
        if status.contains("Established") || start.elapsed() > Duration::from_secs(10) {
            break status;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.contains("announced  serving"), "{status}");
    assert!(
        status.contains("Established"),
        "BGP state from birdc: {status}"
    );

    // BIRD of n1 killed: withdrawn within the bound; every long-lived connection
    // (about half went through n1) keeps its backend through n2.
    let n1_flows = topo.nodes[0].flows().unwrap();
    let mut conns = open_long_lived(&topo, 16);
    check_all(&mut conns, "before");
    std::thread::sleep(STATS_SETTLE);
    assert!(
        topo.nodes[0].flows().unwrap() > n1_flows,
        "setup: some long-lived connections must go through n1, the node that goes away"
    );
    let bird = topo.nodes[0].bird.take().expect("n1 BIRD");
    bird.signal(libc::SIGKILL).unwrap();
    let took = topo
        .wait_next_hops(&[n2], WITHDRAW_BOUND)
        .expect("n1 withdrawn when its BIRD dies");
    eprintln!("withdrawal at the router after SIGKILL of BIRD: {took:?}");
    drop(bird);
    check_all(&mut conns, "after-bird-kill");
    let t = batch(&topo, 31000);
    assert!(t.failures.is_empty(), "after the bound: {:?}", t.failures);

    topo.nodes[0].start_bird().unwrap();
    topo.wait_next_hops(&[n1, n2], CONVERGE).expect("n1 back");

    // Drain n2: withdrawn, its connections keep working, new ones avoid it. Traffic
    // first, so that n2 has just seen packets when it is drained.
    let warm = Instant::now();
    let t = batch(&topo, 31500);
    assert!(t.failures.is_empty(), "with n1 back: {:?}", t.failures);
    check_all(&mut conns, "before-drain");
    topo.nodes[1].cli(&["node", "drain"]).unwrap();
    let took = topo
        .wait_next_hops(&[n1], WITHDRAW_BOUND)
        .expect("a drained node is withdrawn");
    eprintln!("withdrawal at the router after node drain: {took:?}");
    check_all(&mut conns, "after-drain");
    std::thread::sleep(STATS_SETTLE);
    let drained_flows = topo.nodes[1].flows().unwrap();
    let t = batch(&topo, 32000);
    assert!(
        t.failures.is_empty(),
        "while n2 is drained: {:?}",
        t.failures
    );
    std::thread::sleep(STATS_SETTLE);
    assert_eq!(
        topo.nodes[1].flows().unwrap(),
        drained_flows,
        "no new connection may reach a drained node"
    );
    let status = topo.nodes[1].cli(&["node", "status"]).unwrap();
    assert!(status.contains("withdrawn  node drained"), "{status}");
    // n1 carries the traffic (its quiet time is short), nothing reaches n2 any more:
    // `--wait-quiet` there reports that traffic has stopped.
    let busy = quiet_seconds(&topo.nodes[0].cli(&["node", "status"]).unwrap());
    assert!(
        busy < 2.5,
        "n1 just carried a batch, yet quiet for {busy} s"
    );
    let out = topo.nodes[1]
        .cli(&["node", "drain", "--wait-quiet", "5", "--timeout", "20"])
        .expect("traffic stops at a drained node");
    assert!(out.contains("traffic has stopped"), "{out}");
    eprintln!(
        "drained node quiet for 5 s, {:?} after its last traffic began",
        warm.elapsed()
    );
    topo.nodes[1].cli(&["node", "undrain"]).unwrap();
    topo.wait_next_hops(&[n1, n2], CONVERGE).expect("n2 back");

    // The service loses its servers on n1 only (admin down there): n1 withdraws, n2
    // keeps announcing, nothing fails.
    for b in &backends {
        topo.nodes[0]
            .cli(&["server", "down", "web", &format!("{b}:{}", multinode::PORT)])
            .unwrap();
    }
    topo.wait_next_hops(&[n2], WITHDRAW_BOUND)
        .expect("withdrawn from the node whose servers are gone");
    let status = topo.nodes[0].cli(&["node", "status"]).unwrap();
    assert!(status.contains("withdrawn  no usable server"), "{status}");
    assert_ne!(
        topo.nodes[0].fingerprint().unwrap(),
        topo.nodes[1].fingerprint().unwrap(),
        "n1's table lost its servers: the fingerprints must say so"
    );
    let t = batch(&topo, 33000);
    assert!(
        t.failures.is_empty(),
        "served by n2 alone: {:?}",
        t.failures
    );
    for b in &backends {
        topo.nodes[0]
            .cli(&["server", "up", "web", &format!("{b}:{}", multinode::PORT)])
            .unwrap();
    }
    topo.wait_next_hops(&[n1, n2], CONVERGE).expect("n1 back");

    // Agent restart on n2: the route never loses n2, no request fails.
    let watch = topo.watch_next_hops();
    let during = traffic_during(&topo);
    let agent = topo.nodes[1].agent.take().expect("n2 agent");
    agent.stop(Duration::from_secs(10)).expect("agent stops");
    let restart = Instant::now();
    topo.nodes[1]
        .start_agent(&weighted)
        .expect("agent restarts");
    eprintln!("agent restart took {:?}", restart.elapsed());
    let (made, failed) = during.finish();
    eprintln!(
        "connections during the restart: {made}, failed: {}",
        failed.len()
    );
    assert!(
        made >= 20,
        "setup: traffic must run during the restart ({made})"
    );
    assert!(failed.is_empty(), "during the restart: {failed:?}");
    let t = batch(&topo, 34000);
    let seen = watch.finish();
    assert_eq!(
        seen,
        vec![vec![n1, n2]],
        "a restart must not withdraw: the router's next hops during it"
    );
    assert!(t.failures.is_empty(), "after the restart: {:?}", t.failures);
    check_all(&mut conns, "after-restart");
}
