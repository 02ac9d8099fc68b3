//! Two lb nodes in ipip behind a BIRD router with ECMP (docs/multi-node.md,
//! docs/tunnel.md): the multi-node bed of `netns_multinode` with the service in `ipip`
//! and each backend decapsulating with `lb-agent decap attach`. Both nodes build the same
//! table; new connections spread over both nodes and, by weight, over both backends;
//! when one node's BIRD dies, long-lived connections that went through it keep working
//! through the other node, which never saw their SYN and encapsulates their packets to
//! the same backend.
//!
//! Needs root and `bird` (`cargo xtask setup` installs bird2). Without bird the test
//! fails when `CI` is set and is skipped (with a message) otherwise.

use std::time::Duration;

use lb_tests::net::multinode::{self, MultiNode};
use lb_tests::traffic::clients::{EchoConn, tcp_names};

/// BIRD killed: its TCP session closes; the router drops the path in milliseconds.
const WITHDRAW_BOUND: Duration = Duration::from_secs(1);
/// First convergence: BGP sessions come up (connect retry) and exchange routes.
const CONVERGE: Duration = Duration::from_secs(30);
/// New connections for the spread.
const SPREAD: usize = 240;
/// The agent reads data-plane counters every 500 ms: wait this long before reading them.
const STATS_SETTLE: Duration = Duration::from_millis(1200);

fn decap_attach(ns: &lb_tests::net::netns::NetNs) {
    let bin = lb_tests::agent::daemon::locate_binary("lb-agent").expect("lb-agent");
    let out = ns
        .run(|| {
            std::process::Command::new(&bin)
                .args(["decap", "attach", "--interface", "eth0"])
                .output()
        })
        .expect("entering the backend's namespace")
        .expect("running lb-agent decap attach");
    assert!(out.status.success(), "lb-agent decap attach: {out:?}");
}

fn check_all(conns: &mut [EchoConn], what: &str) {
    for (i, c) in conns.iter_mut().enumerate() {
        if let Err(e) = c.check_echo(&format!("{what}-{i}")) {
            panic!("long-lived connection {i} ({}) {what}: {e}", c.backend());
        }
    }
}

#[test]
fn two_ipip_nodes_behind_ecmp_agree_on_the_backend() {
    if !multinode::bird_present() {
        return;
    }
    let mut topo = MultiNode::build(2, 2).expect("building the multi-node topology");
    for (_, ns) in &topo.backends {
        decap_attach(ns);
    }
    let backends = topo.backend_addrs();
    let weighted: Vec<_> = backends.iter().copied().zip([1, 2]).collect();
    for n in &mut topo.nodes {
        n.forwarding = "ipip";
        n.start_bird().expect("node BIRD");
        n.start_agent(&weighted).expect("node agent");
    }
    let (n1, n2) = (topo.nodes[0].addr, topo.nodes[1].addr);
    topo.wait_next_hops(&[n1, n2], CONVERGE)
        .expect("the router learns the VIP from both nodes");
    let fp = topo.nodes[0].fingerprint().unwrap();
    assert_eq!(fp, topo.nodes[1].fingerprint().unwrap(), "tables differ");

    let flows_before = [
        topo.nodes[0].flows().unwrap(),
        topo.nodes[1].flows().unwrap(),
    ];
    let t = tcp_names(
        &topo.client,
        multinode::CLIENT.into(),
        30000,
        topo.vip(),
        SPREAD,
        Duration::from_secs(60),
    )
    .expect("client namespace");
    if let Err(e) = t.check_shares(&[("b1", 1), ("b2", 2)], 0.35) {
        panic!("{e}");
    }
    std::thread::sleep(STATS_SETTLE);
    for (i, node) in topo.nodes.iter().enumerate() {
        let got = node.flows().unwrap() - flows_before[i];
        assert!(
            got as f64 > 0.15 * SPREAD as f64,
            "{} carried {got} of {SPREAD} new connections (ECMP must spread them)",
            node.name
        );
    }

    // n1's BIRD dies: the connections that went through it continue through n2.
    let n1_flows = topo.nodes[0].flows().unwrap();
    let mut conns: Vec<EchoConn> = (0..16)
        .map(|_| {
            EchoConn::connect(&topo.client, multinode::CLIENT.into(), topo.vip())
                .expect("client namespace")
                .expect("a long-lived connection opens")
        })
        .collect();
    check_all(&mut conns, "before");
    std::thread::sleep(STATS_SETTLE);
    assert!(
        topo.nodes[0].flows().unwrap() > n1_flows,
        "setup: some long-lived connections must go through n1, the node that goes away"
    );
    let bird = topo.nodes[0].bird.take().expect("n1 BIRD");
    bird.signal(libc::SIGKILL).unwrap();
    topo.wait_next_hops(&[n2], WITHDRAW_BOUND)
        .expect("n1 withdrawn when its BIRD dies");
    drop(bird);
    check_all(&mut conns, "after-bird-kill");
}
