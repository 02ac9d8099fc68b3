//! The announcement's dead-man switch (docs/multi-node.md): the announced VIP addresses
//! carry a lifetime (`agent.announce_lifetime`) that the running agent restarts every
//! third of it. Two lb nodes behind the BIRD router with ECMP, as in `netns_multinode`:
//! - an agent SIGKILLed and started again within the lifetime: the router never loses
//!   the node, no request fails;
//! - an agent SIGKILLed and not restarted: the kernel removes the address when its
//!   lifetime ends, BIRD withdraws the route, and the router drops the node, no earlier
//!   than the switch allows and soon after; long-lived connections that went through it
//!   keep their backend through the other node.
//!
//! Needs root and `bird` (`cargo xtask setup` installs bird2). Without bird the test
//! fails when `CI` is set and is skipped (with a message) otherwise.

use std::time::{Duration, Instant};

use lb_tests::net::multinode::{self, MultiNode};
use lb_tests::traffic::clients::EchoConn;

/// The lifetime under test: long enough that a SIGKILL + restart (a few seconds on a
/// loaded machine) never lets it end, short enough to keep the test short.
const LIFETIME: Duration = Duration::from_secs(8);
/// The agent's refresh period for [`LIFETIME`] (a third).
const REFRESH: Duration = Duration::from_millis(2666);
/// After the lifetime ends: the kernel's address-expiry timer (whole seconds, rounded
/// up), BIRD's `direct` protocol and the BGP update to the router.
const EXPIRY_SLACK: Duration = Duration::from_secs(4);
const CONVERGE: Duration = Duration::from_secs(30);
const BATCH: usize = 60;

fn batch(topo: &MultiNode, first_port: u16) -> lb_tests::traffic::clients::Tally {
    topo.batch(first_port, BATCH)
}

#[test]
fn a_dead_agent_is_withdrawn_after_the_lifetime_and_a_quick_restart_withdraws_nothing() {
    if !multinode::bird_present() {
        return;
    }
    assert_eq!(
        lb_agent::config::announce_refresh_every(LIFETIME),
        REFRESH,
        "the test's refresh period is the agent's"
    );
    let mut topo = MultiNode::build(2, 2).expect("building the multi-node topology");
    let weighted: Vec<_> = topo.backend_addrs().into_iter().zip([1, 1]).collect();
    for n in &mut topo.nodes {
        n.agent_keys = format!("announce_lifetime = \"{}s\"\n", LIFETIME.as_secs());
        n.start_bird().expect("node BIRD");
        n.start_agent(&weighted).expect("node agent");
    }
    let (n1, n2) = (topo.nodes[0].addr, topo.nodes[1].addr);
    topo.wait_next_hops(&[n1, n2], CONVERGE)
        .expect("the router learns the VIP from both nodes");

    // The address carries the lifetime, and the running agent keeps restarting it.
    let watch = topo.watch_next_hops();
    let start = Instant::now();
    let mut lowest = u32::MAX;
    while start.elapsed() < LIFETIME + REFRESH {
        let lft = topo.nodes[0]
            .vip_valid_lft()
            .unwrap()
            .expect("the VIP stays on n1's announce interface while its agent runs");
        lowest = lowest.min(lft);
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "lowest valid_lft seen over {:?} of a running agent: {lowest} s",
        LIFETIME + REFRESH
    );
    assert!(
        u64::from(lowest) <= LIFETIME.as_secs(),
        "the address must carry the lifetime ({lowest} s)"
    );
    assert!(
        Duration::from_secs(u64::from(lowest) + 1) >= LIFETIME - REFRESH,
        "the running agent refreshes every {REFRESH:?}: valid_lft fell to {lowest} s"
    );

    // 1. SIGKILL n2's agent and start it again at once: it refreshes before the end.
    let agent = topo.nodes[1].agent.take().expect("n2 agent");
    agent.signal(libc::SIGKILL).unwrap();
    agent.stop(Duration::from_secs(5)).unwrap();
    let restart = Instant::now();
    topo.nodes[1]
        .start_agent(&weighted)
        .expect("agent restarts");
    eprintln!("SIGKILL + restart took {:?}", restart.elapsed());
    // Past the end of the lifetime the killed agent had left.
    std::thread::sleep(LIFETIME + EXPIRY_SLACK - restart.elapsed().min(LIFETIME));
    let t = batch(&topo, 30000);
    assert!(t.failures.is_empty(), "after the restart: {:?}", t.failures);
    assert_eq!(
        watch.finish(),
        vec![vec![n1, n2]],
        "a restart within the lifetime must not withdraw: the router's next hops"
    );

    // 2. SIGKILL n1's agent and leave it dead: withdrawn when the lifetime ends.
    let mut conns: Vec<EchoConn> = (0..16)
        .map(|_| {
            EchoConn::connect(&topo.client, multinode::CLIENT.into(), topo.vip())
                .expect("client namespace")
                .expect("a long-lived connection opens")
        })
        .collect();
    for (i, c) in conns.iter_mut().enumerate() {
        c.check_echo(&format!("before-{i}"))
            .unwrap_or_else(|e| panic!("long-lived connection {i} before the kill: {e}"));
    }
    let agent = topo.nodes[0].agent.take().expect("n1 agent");
    agent.signal(libc::SIGKILL).unwrap();
    let killed = Instant::now();
    agent.stop(Duration::from_secs(5)).unwrap();
    let took = topo
        .wait_next_hops(&[n2], LIFETIME + EXPIRY_SLACK)
        .map(|_| killed.elapsed())
        .expect("a node whose agent stays dead is withdrawn after the lifetime");
    eprintln!("withdrawn {took:?} after the agent's SIGKILL (lifetime {LIFETIME:?})");
    // The last refresh was at most one period before the kill.
    assert!(
        took + Duration::from_millis(500) >= LIFETIME - REFRESH,
        "withdrawn after {took:?}: earlier than the lifetime allows"
    );
    assert_eq!(
        topo.nodes[0].vip_valid_lft().unwrap(),
        None,
        "the kernel removed the expired address"
    );
    for (i, c) in conns.iter_mut().enumerate() {
        c.check_echo(&format!("after-{i}")).unwrap_or_else(|e| {
            panic!(
                "long-lived connection {i} ({}) after n1 was withdrawn: {e}",
                c.backend()
            )
        });
    }
    let t = batch(&topo, 31000);
    assert!(
        t.failures.is_empty(),
        "served by n2 alone: {:?}",
        t.failures
    );
}
