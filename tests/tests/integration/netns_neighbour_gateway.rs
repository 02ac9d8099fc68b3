//! A routed nat backend whose gateway changes under client traffic (one new connection
//! every 20 ms): `far` sits behind router r1; the lb's route is replaced to go through
//! r2 and r1 stops forwarding at once. lb must write r2's MAC for `far` from then on:
//! no connection fails that starts later than [`BOUND`] after the route change, and
//! `far` keeps answering.

use std::{collections::BTreeMap, net::SocketAddr, path::Path, time::Duration};

use lb_tests::{
    agent::daemon::{Proto, Service},
    net::{
        routed_segment::{FAR, RoutedSegment},
        topology::{Forwarding, Topology},
    },
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{HealthServers, with_health},
        neighbour_moves::{
            CONNECT, FOLLOW, FOLLOWS_LINE, PACE, failed_after, last_failure, logged_after, probe,
            start_agent, wait_answered,
        },
    },
    traffic::pacer::{PaceConfig, Pacer, summary, wall_now},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Traffic before the change.
const WARM_UP: Duration = Duration::from_secs(3);
/// Upper bound on the client traffic.
const TRAFFIC_LIMIT: Duration = Duration::from_secs(15);
/// A route change is followed by one route lookup and one ARP exchange with the new
/// gateway (its MAC is not known before): well within a second.
const BOUND: Duration = Duration::from_secs(1);
/// How long `far` gets to answer after the bound.
const ANSWER_AGAIN: Duration = Duration::from_secs(5);
/// Traffic kept running after `far` answered again.
const SETTLE: Duration = Duration::from_secs(2);

#[test]
fn a_routed_nat_backend_follows_its_new_gateway() {
    let topo = Topology::builder()
        .backends(2)
        .forwarding(Forwarding::Nat)
        .subnet(249)
        .static_neighbours(false)
        .build()
        .expect("building the topology");
    let seg = RoutedSegment::build(&topo).expect("building the routed segment");
    let mut hosts: BTreeMap<String, _> = topo
        .backends()
        .iter()
        .map(|b| (b.role.clone(), b.ns.clone()))
        .collect();
    hosts.insert(FAR.to_owned(), seg.far.clone());
    let _servers = HealthServers::start_on(
        topo.dir(),
        Path::new(TESTSERVER),
        hosts,
        vec!["--tcp".into(), BACKEND_TCP_PORT.to_string()],
        &["b1", "b2", FAR],
    )
    .expect("starting lb-testserver on b1, b2 and far");
    let backends = balance::weighted(&topo, &[1, 1]);
    let mut svc = Service::on(
        &topo,
        "web",
        Proto::Tcp,
        false,
        80,
        &backends,
        BACKEND_TCP_PORT,
    );
    let far = SocketAddr::new(seg.far_ip(), BACKEND_TCP_PORT);
    svc.servers.push((far, 1));
    let svc = with_health(svc, &["max_fails = 0"], &[probe()]);
    let vip = svc.vip;
    let (agent, _) = start_agent(&topo, svc);

    let client = topo.client();
    let pacer = Pacer::start(
        &client.ns,
        PaceConfig {
            src: client.ipv4.into(),
            first_port: 33_000,
            dst: vip,
            every: PACE,
            count: (TRAFFIC_LIMIT.as_millis() / PACE.as_millis()) as usize,
            limit: TRAFFIC_LIMIT,
            connect_timeout: CONNECT,
        },
    );
    std::thread::sleep(WARM_UP);
    let lb = &topo.lb().ns;
    let log_from = agent.process().cursor();
    let t0 = wall_now();
    seg.route_via(lb, seg.gw2).expect("replacing the route");
    seg.stop_forwarding(&seg.r1)
        .expect("stopping r1's forwarding");
    // The agent logs far's new next-hop MAC (r2's) once the maps hold it: one route
    // lookup and one ARP exchange with r2 after the change.
    let followed = agent
        .process()
        .wait_for_line(log_from, FOLLOWS_LINE, BOUND)
        .ok()
        .map(|line| (logged_after(&line, t0), line));
    let deadline = t0 + BOUND.as_secs_f64();
    let back = wait_answered(&pacer, FAR, deadline, BOUND + ANSWER_AGAIN);
    if back {
        std::thread::sleep(SETTLE);
    }
    let neigh = lb.ip(&["neigh", "show"]).unwrap_or_default();
    let attempts = pacer.finish();
    assert!(
        back,
        "far never answered after the route moved to r2 ({}); lb's neighbours:\n{neigh}\n{}",
        seg.gw2,
        summary(&attempts)
    );
    let late = failed_after(&attempts, deadline);
    assert!(
        late.is_empty(),
        "{} connections failed later than {BOUND:?} after the route moved to r2 (first at \
         +{:.3} s: {})\n{}",
        late.len(),
        late[0].start - t0,
        late[0].outcome,
        summary(&attempts)
    );
    let (took, line) = followed.clone().unwrap_or_else(|| {
        panic!(
            "the agent never logged far's new next hop within {BOUND:?}\n{}",
            agent.process().tail(20)
        )
    });
    assert!(
        line.contains(&seg.far_addr.to_string()) && line.contains(&seg.gw2_mac.to_string()),
        "the agent followed something else: {line}"
    );
    let took = took.unwrap_or_else(|| panic!("no timestamp in {line:?}"));
    assert!(
        took <= FOLLOW,
        "far's MAC in the maps {took:?} after the route change (bound {FOLLOW:?}, with r2's \
         resolution; from before the route command started to the agent's log line)"
    );
    let far_before = attempts
        .iter()
        .filter(|a| a.start < t0 && a.answered_by(FAR))
        .count();
    assert!(
        far_before > 0,
        "far answered nothing before the change: the scenario did not route through r1\n{}",
        summary(&attempts)
    );
    eprintln!(
        "gateway change: bound {BOUND:?}; far's new next hop in the maps {:.1} ms after the \
         route change; last failure at {}; {}",
        took.as_secs_f64() * 1e3,
        last_failure(&attempts, t0).map_or("none".into(), |s| format!("+{s:.3} s")),
        summary(&attempts)
    );
}
