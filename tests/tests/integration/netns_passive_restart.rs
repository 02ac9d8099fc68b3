//! A restart of the agent keeps a passive ejection (docs/restarts.md, "Passive
//! ejections"): nat, passive checks only (`max_fails = 3`, `fail_timeout = 15s`, no
//! probe). b2's port refuses, its RSTs make it `unavailable`; its server is started
//! again, then the agent is restarted (SIGTERM, a new agent adopting the data plane)
//! 2 s into the ejection. The new agent logs "restored: server b2 unavailable (passive)
//! for another N s", shows b2 `unavailable`, sends it no new connection, and brings it
//! back at the end of the original `fail_timeout`, not at the restart.

use std::{
    net::SocketAddr,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{
        api::Api,
        daemon::{Agent, AgentConfig, locate_binary},
    },
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{HealthServers, MARGIN, event_time, secs, wait_event, wait_state, with_health},
    },
    traffic::pacer::{Attempt, PaceConfig, Pacer, summary, wall_now},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const PACE: Duration = Duration::from_millis(20);
const FAIL_TIMEOUT: f64 = 15.0;
const START: Duration = Duration::from_secs(30);
/// A connection that started this long after the agent published can no longer have
/// been balanced by the previous maps.
const IN_FLIGHT: f64 = 0.1;

fn pacer(topo: &Topology, vip: SocketAddr, first_port: u16, limit: Duration) -> Pacer {
    let client = topo.client();
    Pacer::start(
        &client.ns,
        PaceConfig {
            src: client.ipv4.into(),
            first_port,
            dst: vip,
            every: PACE,
            count: (limit.as_millis() / PACE.as_millis()) as usize,
            limit,
            connect_timeout: Duration::from_secs(1),
        },
    )
}

#[test]
fn passive_unavailable_survives_an_agent_restart() {
    let topo = Topology::builder()
        .backends(3)
        .forwarding(Forwarding::Nat)
        .subnet(223)
        .build()
        .expect("building the topology");
    let mut servers = HealthServers::start(&topo, Path::new(TESTSERVER), &["b1", "b3"])
        .expect("starting lb-testserver on b1 and b3");
    let backends = balance::weighted(&topo, &[1, 1, 1]);
    let svc = with_health(
        balance::tcp_service(&topo, &backends),
        &[
            "max_fails = 3",
            &format!("fail_timeout = \"{FAIL_TIMEOUT}s\""),
        ],
        &[],
    );
    let vip = svc.vip;
    let config = AgentConfig::new(vec![svc]);
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let agent =
        Agent::start(&topo, &binary, &config, Some("native"), START).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let b2 = SocketAddr::new(topo.backends()[1].ipv4.into(), BACKEND_TCP_PORT);
    wait_state(&api, "web", b2, "up", Duration::from_secs(5)).expect("b2 up at the start");

    // b2 refuses until it is ejected.
    let broken_at = wall_now();
    let traffic = pacer(&topo, vip, 10_000, Duration::from_secs(10));
    let ejected = wait_event(&api, b2, "unavailable", broken_at, Duration::from_secs(10))
        .expect("b2 should become unavailable (rst_on_syn)");
    drop(traffic);
    let t_ejected = event_time(&ejected);
    servers.restart("b2").expect("starting b2's server");

    // 2 s into the ejection: a restart.
    thread::sleep(Duration::from_secs(2));
    agent
        .stop(Duration::from_secs(10))
        .expect("stopping the agent");
    let agent =
        Agent::start(&topo, &binary, &config, Some("native"), START).expect("restarting lb-agent");
    let restarted_at = wall_now();
    let restored = agent
        .process()
        .lines()
        .into_iter()
        .find(|l| l.contains("restored: server") && l.contains(&b2.to_string()));
    let state_after = wait_state(&api, "web", b2, "unavailable", Duration::from_secs(1));

    let traffic = pacer(&topo, vip, 12_000, Duration::from_secs(20));
    let back = wait_event(
        &api,
        b2,
        "up",
        restarted_at - 1.0,
        Duration::from_secs_f64(FAIL_TIMEOUT) + 2 * MARGIN,
    );
    // A few connections after the return.
    let t_back = back.as_ref().map_or(f64::MAX, event_time);
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(1) {
        thread::sleep(Duration::from_millis(50));
    }
    let attempts = traffic.finish();
    let out_early: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| a.start < t_back - IN_FLIGHT && a.answered_by("b2"))
        .collect();
    let failed = attempts
        .iter()
        .filter(|a| {
            a.start >= restarted_at
                && !a.answered_by("b1")
                && !a.answered_by("b2")
                && !a.answered_by("b3")
        })
        .count();
    println!(
        "restart {} into b2's ejection ({}); after it: {}; b2 up {} after the ejection \
         ({:?}); traffic since the restart: {}",
        secs(restarted_at - t_ejected),
        ejected.cause,
        restored.as_deref().unwrap_or("no restored line"),
        secs(t_back - t_ejected),
        back.as_ref().map(|e| e.cause.clone()),
        summary(&attempts)
    );
    let restored = restored.expect("the restarted agent should log the restored ejection");
    assert!(
        restored.contains("unavailable (passive) for another"),
        "the log line names the state and the time left: {restored}"
    );
    state_after.expect("b2 should still be unavailable right after the restart");
    let back = back.expect("b2 should come back at the end of its fail_timeout");
    assert!(
        back.cause.contains("fail_timeout"),
        "b2 returns by its fail_timeout: {back:?}"
    );
    let out_for = t_back - t_ejected;
    assert!(
        (FAIL_TIMEOUT - 0.1..=FAIL_TIMEOUT + MARGIN.as_secs_f64()).contains(&out_for),
        "b2 should be out for its whole fail_timeout ({FAIL_TIMEOUT} s) across the restart, \
         was out for {}",
        secs(out_for)
    );
    assert!(
        out_early.is_empty(),
        "no new connection should reach b2 before its fail_timeout ended: {out_early:?}"
    );
    assert!(
        attempts.iter().any(|a| a.answered_by("b2")),
        "b2 takes connections again once back"
    );
    assert_eq!(failed, 0, "no connection fails across the restart");
}
