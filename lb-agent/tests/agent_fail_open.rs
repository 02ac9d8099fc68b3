//! DESIGN.md §6 fail-open through the whole agent: when every server is unusable, traffic
//! spreads over all of them (and status says so); with `fail_open = false` it is dropped.

mod agent_util;

use std::net::SocketAddr;

use agent_util::{Harness, Verdict, sa, secs, servers, web};
use lb_agent::api::render_metrics;

fn config(extra: &str) -> String {
    web(
        extra,
        &(servers(&[
            ("10.0.1.1:80", ""),
            ("10.0.1.2:80", ""),
            ("10.0.1.11:80", "backup = 1"),
        ]) + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n"),
    )
}

fn all() -> [SocketAddr; 3] {
    [sa("10.0.1.1:80"), sa("10.0.1.2:80"), sa("10.0.1.11:80")]
}

/// Every server, backup level included, refusing and unhealthy.
async fn all_failed(extra: &str) -> Harness {
    let mut h = Harness::start(&config(extra)).await;
    h.run_for(secs(2)).await;
    for a in all() {
        h.set(a, Verdict::Refuse);
    }
    h.run_until(secs(5), |h| {
        all().iter().all(|&a| h.state("web", a) == "unhealthy")
    })
    .await
    .expect("setup: every server turns unhealthy");
    h
}

#[tokio::test(start_paused = true)]
async fn every_server_failing_fails_open_over_all_of_them() {
    let h = all_failed("").await;
    for a in all() {
        assert!(
            h.slots("web", a) > 0,
            "fail-open: {a} must be in the table although unhealthy"
        );
        assert!(h.live("web", a));
        assert_eq!(h.state("web", a), "unhealthy", "status keeps the truth");
    }
    assert_eq!(h.empty_slots("web"), 0, "no slot may drop traffic");
    let snap = h.snapshot();
    assert!(
        h.service_status("web").fail_open,
        "the snapshot must say the service fails open"
    );
    assert!(
        render_metrics(&snap)
            .lines()
            .any(|l| l == "lb_service_fail_open{service=\"web\"} 1"),
        "/metrics must say the service fails open"
    );
}

#[tokio::test(start_paused = true)]
async fn fail_open_ends_when_a_server_recovers() {
    let mut h = all_failed("").await;
    let [p1, p2, b1] = all();
    h.set(p1, Verdict::Pass);
    h.run_until(secs(5), |h| h.state("web", p1) == "up")
        .await
        .expect("the primary recovers");
    assert!(!h.service_status("web").fail_open);
    assert_eq!(h.slots("web", p1), h.table("web").len());
    for a in [p2, b1] {
        assert_eq!(h.slots("web", a), 0, "{a} is unhealthy: out again");
        assert!(h.live("web", a) && !h.serving("web", a));
    }
}

#[tokio::test(start_paused = true)]
async fn every_server_failing_without_fail_open_empties_the_table() {
    let h = all_failed("fail_open = false").await;
    assert_eq!(
        h.empty_slots("web"),
        h.table("web").len(),
        "fail_open = false: every slot must be empty (the data plane drops, counted)"
    );
    for a in all() {
        assert!(
            h.live("web", a) && !h.serving("web", a),
            "{a} is unhealthy: no new flow, established ones stay"
        );
    }
    assert!(!h.service_status("web").fail_open);
}
