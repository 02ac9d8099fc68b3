//! What the operator sees (DESIGN.md §9) after a failure: the snapshot's states, weights,
//! per-probe statistics, transition count, event log, and `/metrics`.

use crate::util::{Harness, Verdict, sa, secs, servers, web};
use lb_agent::api::render_metrics;
use tokio::time::Instant;

fn config() -> String {
    web(
        "",
        &(servers(&[
            ("10.0.1.1:80", "weight = 1"),
            ("10.0.1.2:80", "weight = 2"),
            ("10.0.1.3:80", "weight = 3"),
        ]) + "[[service.probe]]\nname = \"health\"\ntype = \"http\"\n\
               interval = \"1s\"\ntimeout = \"500ms\"\nfails = 2\n"),
    )
}

#[tokio::test(start_paused = true)]
async fn snapshot_shows_failed_server_states_weights_probes_and_metrics() {
    let start = Instant::now();
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(3)).await;
    let (a, b, c) = (sa("10.0.1.1:80"), sa("10.0.1.2:80"), sa("10.0.1.3:80"));
    let svc = h.service_status("web");
    assert_eq!(
        (svc.main_weight, svc.active_weight),
        (6, 6),
        "all up: main and active weight are the sum of weights"
    );
    assert_eq!(h.snapshot().transitions, 0, "setup: nothing happened yet");

    let t0 = Instant::now();
    h.set(b, Verdict::Refuse);
    h.run_until(secs(10), |h| h.state("web", b) == "unhealthy")
        .await
        .expect("a refusing server turns unhealthy");
    // One more failed probe after the verdict.
    h.run_for(secs(1) + crate::util::ms(500)).await;

    let snap = h.snapshot();
    let svc = h.service_status("web");
    assert_eq!(svc.main_weight, 6, "main_weight counts every primary");
    assert_eq!(
        svc.active_weight, 4,
        "active_weight drops by the failed server's weight 2"
    );
    assert!(!svc.fail_open);

    let sb = h.server_status("web", b);
    assert_eq!(sb.state, "unhealthy");
    assert!(!sb.active, "a failed server is not active");
    assert_eq!(sb.weight, 2);
    assert!(
        sb.health.downstart.is_some(),
        "a down server has a downstart"
    );
    let pb = &sb.health.probes["health"];
    let all_b = h.prober.calls_to(b, start);
    let failed_b = h.prober.calls_to(b, t0);
    assert!(
        failed_b.len() >= 3,
        "setup: at least 3 failed probes, got {failed_b:?}"
    );
    assert_eq!(
        pb.count,
        all_b.len() as u64,
        "count must be every probe run against the server"
    );
    assert_eq!(
        pb.fails,
        failed_b.len() as u64,
        "fails must be the current run of consecutive failures"
    );
    assert_eq!(pb.failures, failed_b.len() as u64);
    assert_eq!(pb.last_result, "failed: connection refused");
    assert!(pb.last.is_some(), "the last probe's time is shown");

    for (addr, weight) in [(a, 1), (c, 3)] {
        let s = h.server_status("web", addr);
        assert_eq!(s.state, "up", "{addr} did not fail");
        assert!(s.active, "{addr} is in the table");
        assert_eq!(s.weight, weight);
        assert!(s.health.downstart.is_none());
        let p = &s.health.probes["health"];
        assert_eq!(p.last_result, "passed");
        assert_eq!(p.fails, 0);
        assert_eq!(p.count, h.prober.calls_to(addr, start).len() as u64);
    }

    assert_eq!(
        snap.transitions, 1,
        "exactly one transition: {b} up -> unhealthy"
    );
    let events = h.events.lock().await.clone();
    assert_eq!(events.len(), 1, "one event logged: {events:?}");
    let e = &events[0];
    assert_eq!(
        (e.server.as_str(), e.from.as_str(), e.to.as_str()),
        ("10.0.1.2:80", "up", "unhealthy")
    );
    assert!(
        e.cause.contains("health") && e.cause.contains("connection refused"),
        "the cause names the probe and why: {}",
        e.cause
    );

    let metrics = render_metrics(&snap);
    for line in [
        "lb_server_state{service=\"web\",server=\"10.0.1.2:80\",state=\"unhealthy\"} 1",
        "lb_server_state{service=\"web\",server=\"10.0.1.2:80\",state=\"up\"} 0",
        "lb_server_state{service=\"web\",server=\"10.0.1.1:80\",state=\"up\"} 1",
        "lb_server_active{service=\"web\",server=\"10.0.1.2:80\"} 0",
        "lb_service_main_weight{service=\"web\"} 6",
        "lb_service_active_weight{service=\"web\"} 4",
        "lb_transitions_total 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "/metrics must contain `{line}`:\n{metrics}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn snapshot_follows_recovery() {
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(3)).await;
    let b = sa("10.0.1.2:80");
    h.set(b, Verdict::Refuse);
    h.run_until(secs(10), |h| h.state("web", b) == "unhealthy")
        .await
        .expect("a refusing server turns unhealthy");
    h.set(b, Verdict::Pass);
    h.run_until(secs(10), |h| h.state("web", b) == "up")
        .await
        .expect("a passing server returns");
    let sb = h.server_status("web", b);
    assert!(sb.active);
    assert!(sb.health.downstart.is_none(), "no downstart once up again");
    assert!(sb.health.downtime > 0, "the down period counts in downtime");
    assert_eq!(sb.health.probes["health"].last_result, "passed");
    assert_eq!(sb.health.probes["health"].fails, 0);
    assert_eq!(h.service_status("web").active_weight, 6);
    assert_eq!(h.snapshot().transitions, 2, "up -> unhealthy -> up");
}

#[tokio::test(start_paused = true)]
async fn transition_while_the_event_log_is_being_read_is_not_lost() {
    // `GET /api/v1/events` holds the log's lock while it serialises; a transition at
    // that moment must still reach the log.
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(2)).await;
    let b = sa("10.0.1.2:80");
    h.set(b, Verdict::Refuse);
    let log = h.events.clone();
    let reader = log.lock().await;
    h.run_until(secs(10), |h| h.state("web", b) == "unhealthy")
        .await
        .expect("a refusing server turns unhealthy");
    drop(reader);
    h.run_for(secs(1)).await;
    let events = log.lock().await.clone();
    assert!(
        events
            .iter()
            .any(|e| e.server == "10.0.1.2:80" && e.to == "unhealthy"),
        "the transition of {b} must be in /api/v1/events: {events:?}"
    );
    assert_eq!(
        events.len() as u64,
        h.snapshot().transitions,
        "every counted transition is logged"
    );
}
