//! DESIGN.md §6 fail-open through the whole agent: when every server is unusable, traffic
//! spreads over all of them (and status says so); with `fail_open = false` it is dropped.

use std::net::SocketAddr;

use crate::util::{Harness, Verdict, sa, secs, servers, web};
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

#[tokio::test(start_paused = true)]
async fn a_server_the_cap_holds_does_not_keep_a_healthy_backup_level_out() {
    // 2 primaries at 50% — one may be removed, the later failure is held.
    let mut h = Harness::start(&config("max_unhealthy_percent = 50")).await;
    h.run_for(secs(2)).await;
    let [p1, p2, b1] = all();
    h.set(p1, Verdict::Refuse);
    h.run_until(secs(5), |h| h.state("web", p1) == "unhealthy")
        .await
        .expect("setup: p1 unhealthy");
    h.set(p2, Verdict::Refuse);
    h.run_until(secs(5), |h| h.state("web", p2) == "unhealthy")
        .await
        .expect("setup: p2 unhealthy");
    let st = h.service_status("web");
    assert_eq!(
        st.active_backup_level, 1,
        "held p2 is not healthy: the backup level takes over"
    );
    assert_eq!(h.slots("web", b1), h.table("web").len());
    assert!(!st.fail_open);
    for p in [p1, p2] {
        assert!(h.live("web", p) && !h.serving("web", p), "{p}");
    }
}

#[tokio::test(start_paused = true)]
async fn fail_open_spreads_first_over_servers_out_only_for_passive_checks() {
    // p1 and p2 fail their probes (provably dead); b1 is only suspected by
    // a passive signal.
    let mut h = Harness::start(&config("max_fails = 1")).await;
    h.run_for(secs(2)).await;
    let [p1, p2, b1] = all();
    h.set(p1, Verdict::Refuse);
    h.set(p2, Verdict::Refuse);
    h.run_until(secs(5), |h| {
        h.state("web", p1) == "unhealthy" && h.state("web", p2) == "unhealthy"
    })
    .await
    .expect("setup: primaries unhealthy");
    let ids = h.backend_ids("web", b1);
    let rst = lb_common::events::PassiveEvent {
        kind: lb_common::events::EVENT_RST_ON_SYN,
        backend_id: ids[0],
        service_id: h.service_id("web").expect("published"),
        ..Default::default()
    };
    h.send_passive_events(&[rst]).await;
    h.agent_mut().publish_snapshot();
    assert_eq!(h.state("web", b1), "unavailable");
    let st = h.service_status("web");
    assert_eq!((st.fail_open, st.fail_open_tier), (true, 1));
    assert_eq!(
        h.slots("web", b1),
        h.table("web").len(),
        "tier 1: only the passive suspect takes new flows"
    );
    for p in [p1, p2] {
        assert!(!h.serving("web", p), "{p} fails its probe: not in tier 1");
    }
    assert!(
        render_metrics(&h.snapshot())
            .lines()
            .any(|l| l == "lb_service_fail_open_tier{service=\"web\"} 1"),
        "/metrics says the tier"
    );
}
