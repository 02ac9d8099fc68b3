//! A restart that changes `agent.max_backends` (root, netns): the backend maps of the
//! new size cannot take over the old ones, so `LB_BACKENDS` and `LB_BACKEND_STATS` are
//! created fresh (said in the log, as any layout change) and the other thirteen maps are
//! adopted; the service is served after it, and a restart at the same size adopts all
//! fifteen maps again.

use std::{path::Path, time::Duration};

use lb_tests::{
    agent::{
        daemon::{Agent, AgentConfig, locate_binary},
        operator,
    },
    net::topology::Forwarding,
    scenario::{
        balance::{self, WEIGHTS},
        restart::assert_served,
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const START: Duration = Duration::from_secs(30);

/// Lines of `agent`'s log containing `needle`.
fn lines_with(agent: &Agent, needle: &str) -> Vec<String> {
    let lines = agent.process().lines();
    lines.into_iter().filter(|l| l.contains(needle)).collect()
}

fn stop(agent: Agent, what: &str) {
    agent
        .process()
        .signal(libc::SIGTERM)
        .expect("signalling the agent");
    let status = agent.stop(Duration::from_secs(10)).expect("stopping");
    assert!(status.success(), "{what}: SIGTERM should exit 0: {status}");
}

#[test]
fn a_new_backend_capacity_recreates_the_backend_maps_and_keeps_the_rest() {
    let bed = balance::Testbed::start(Forwarding::Dsr, 91, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let start = |extra: &[&str], what: &str| {
        let mut config = AgentConfig::new(vec![service.clone()]);
        config.agent_extra = extra.iter().map(|s| s.to_string()).collect();
        Agent::start(topo, &binary, &config, Some("native"), START)
            .unwrap_or_else(|e| panic!("{what}: starting lb-agent: {e}"))
    };

    let agent = start(&[], "default size");
    assert_served(topo, vip, 42_000, "served at the default size");
    stop(agent, "default size");

    let agent = start(&["max_backends = 131071"], "grown");
    let line = operator::line_with(agent.process(), operator::ADOPTED, "grown");
    assert!(
        line.contains("maps_kept=13") && line.contains("maps_fresh=2"),
        "the two backend maps fresh, the other thirteen kept: {line}"
    );
    let fresh = lines_with(&agent, "map not adopted, created fresh");
    for map in ["LB_BACKENDS", "LB_BACKEND_STATS"] {
        assert!(
            fresh
                .iter()
                .any(|l| l.contains(map) && l.contains("layout changed")),
            "{map} named as created fresh, with the reason: {fresh:?}"
        );
    }
    assert_eq!(fresh.len(), 2, "only those two: {fresh:?}");
    assert_served(topo, vip, 43_000, "served after growing the backend maps");
    stop(agent, "grown");

    let agent = start(&["max_backends = 131071"], "same size again");
    let line = operator::line_with(agent.process(), operator::ADOPTED, "same size again");
    assert!(
        line.contains("maps_kept=15")
            && line.contains("maps_fresh=0")
            && line.contains("backends=3"),
        "the grown maps are adopted as they are, with the three backends: {line}"
    );
    assert_served(topo, vip, 44_000, "served after the second restart");
    stop(agent, "same size again");
}
