//! A nat service on three lb nodes behind a BIRD ECMP router (docs/multi-node.md), the
//! backends on their own segment behind the same router: keep-alive connections must
//! survive every move the router makes (a node's BIRD killed, a node's link down, a node
//! back, a node drained), because every node forwards every packet of an established
//! connection, in either direction, exactly as the node that made it.
//!
//! Needs root and `bird` (`cargo xtask setup` installs bird2). Without bird the test
//! fails when `CI` is set and is skipped (with a message) otherwise.

use std::time::Duration;

use lb_tests::net::multinode::{self, MultiNode};
use lb_tests::traffic::clients::EchoConn;

/// First convergence: BGP sessions come up (connect retry) and exchange routes.
const CONVERGE: Duration = Duration::from_secs(30);
/// BIRD killed: the router drops the path within milliseconds; margin for a loaded host.
const WITHDRAW_BOUND: Duration = Duration::from_secs(2);
/// Keep-alive connections held through every event.
const KEEPALIVE: usize = 48;

fn open_long_lived(topo: &MultiNode, n: usize) -> Vec<EchoConn> {
    (0..n)
        .map(|_| {
            EchoConn::connect(&topo.client, multinode::CLIENT.into(), topo.vip())
                .expect("client namespace")
                .expect("a long-lived connection opens")
        })
        .collect()
}

/// Every connection that no longer echoes, with what it got instead.
fn broken(conns: &mut [EchoConn], what: &str) -> Vec<String> {
    conns
        .iter_mut()
        .enumerate()
        .filter_map(|(i, c)| {
            c.check_echo(&format!("{what}-{i}"))
                .err()
                .map(|e| format!("connection {i} ({}): {e}", c.backend()))
        })
        .collect()
}

#[test]
fn three_nat_nodes_keep_connections_when_the_router_moves_them() {
    if !multinode::bird_present() {
        return;
    }
    let mut topo = MultiNode::build_routed(3, 3).expect("building the multi-node topology");
    let backends: Vec<_> = topo.backend_addrs().into_iter().map(|b| (b, 1)).collect();
    for n in &mut topo.nodes {
        n.forwarding = "nat";
        n.service_keys = format!("snat_ip = \"{}\"\n", n.addr);
        n.start_bird().expect("node BIRD");
        n.start_agent(&backends).expect("node agent");
    }
    let all: Vec<_> = topo.nodes.iter().map(|n| n.addr).collect();
    topo.wait_next_hops(&all, CONVERGE)
        .expect("the router learns the VIP from every node");

    let mut conns = open_long_lived(&topo, KEEPALIVE);
    let before = broken(&mut conns, "before");
    assert!(before.is_empty(), "before any event: {before:#?}");

    // n2's BIRD killed: the router moves n2's client flows to n1 and n3.
    let bird = topo.nodes[1].bird.take().expect("n2 BIRD");
    bird.signal(libc::SIGKILL).unwrap();
    topo.wait_next_hops(&[all[0], all[2]], WITHDRAW_BOUND)
        .expect("n2 withdrawn when its BIRD dies");
    drop(bird);
    let after_kill = broken(&mut conns, "after-bird-kill");

    topo.nodes[1].start_bird().unwrap();
    topo.wait_next_hops(&all, CONVERGE).expect("n2 back");
    let after_back = broken(&mut conns, "after-n2-back");
    assert!(
        after_kill.is_empty() && after_back.is_empty(),
        "{} of {KEEPALIVE} broken when n2 left, {} more when it came back:\n{after_kill:#?}\n{after_back:#?}",
        after_kill.len(),
        after_back.len()
    );
}
