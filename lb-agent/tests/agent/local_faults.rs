//! Local faults through the whole agent under paused time: probes that cannot run on
//! this host (EMFILE, ENOBUFS, no route, a starved runtime) change no server's state, keep
//! every verdict, and are reported in the status snapshot and `/metrics`.

use crate::util::{Harness, Verdict, sa, secs, servers, web};
use lb_agent::api::render_metrics;

fn config() -> String {
    web(
        "",
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")])
            + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\nfails = 1\npasses = 1\n"),
    )
}

#[tokio::test(start_paused = true)]
async fn local_faults_keep_every_verdict_and_are_reported() {
    let (a, b) = (sa("10.0.1.1:80"), sa("10.0.1.2:80"));
    let mut h = Harness::start(&config()).await;
    h.set(b, Verdict::Refuse);
    h.run_until(secs(3), |h| h.state("web", b) == "unhealthy")
        .await
        .expect("setup: b unhealthy");
    h.run_for(secs(2)).await;
    let transitions = h.snapshot().transitions;

    // The whole host runs out of descriptors for 20 probe intervals.
    h.set(a, Verdict::LocalFault);
    h.set(b, Verdict::LocalFault);
    h.run_for(secs(20)).await;
    assert_eq!(h.state("web", a), "up", "a local fault is no failure of a");
    assert_eq!(h.state("web", b), "unhealthy", "nor a pass of b");
    assert!(h.serving("web", a) && !h.serving("web", b));
    let snap = h.snapshot();
    assert_eq!(snap.transitions, transitions, "no transition at all");
    assert!(!h.service_status("web").fail_open);
    assert!(snap.local_faults.active, "{:?}", snap.local_faults);
    assert!(
        snap.local_faults.total >= 38,
        "about 20 runs per server: {:?}",
        snap.local_faults
    );
    assert!(
        snap.local_faults
            .last_detail
            .as_deref()
            .is_some_and(|d| d.contains("EMFILE")),
        "{:?}",
        snap.local_faults
    );
    let svc = h.service_status("web");
    assert!(
        svc.local_faults.active && svc.local_faults.total == snap.local_faults.total,
        "GET /api/v1/services shows it per service: {:?}",
        svc.local_faults
    );
    let probe = &h.server_status("web", a).health.probes["tcp"];
    assert_eq!(probe.fails, 0, "not counted as failures: {probe:?}");
    assert!(probe.local_faults >= 19, "{probe:?}");
    let metrics = render_metrics(&snap);
    assert!(
        metrics.lines().any(|l| l == "lb_agent_local_fault 1"),
        "the gauge says verdicts are frozen"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lb_agent_local_faults_total ") && !l.ends_with(" 0")),
        "the counter counts them"
    );

    // The host recovers: verdicts move again; after 30 s the gauge clears.
    h.set(a, Verdict::Pass);
    h.set(b, Verdict::Pass);
    h.run_until(secs(3), |h| h.state("web", b) == "up")
        .await
        .expect("b passes again once probes can run");
    h.run_for(secs(31)).await;
    assert!(!h.snapshot().local_faults.active);
}
