//! VIP announcement through the whole agent under paused time (docs/multi-node.md):
//! announced once a server passes its probes, withdrawn when no server can serve
//! (fail-closed), kept in fail-open, withdrawn on node drain; the table fingerprint is
//! the same whatever order servers arrived in.

use crate::util::{Harness, Verdict, sa, secs, servers, web};
use lb_agent::announce::MemoryRoutes;
use lb_agent::api::{AdminChange, render_metrics};

fn config(extra: &str) -> String {
    web(
        extra,
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")])
            + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\nessential = true\n"),
    )
}

async fn announcing(extra: &str) -> (Harness, MemoryRoutes) {
    let mut h = Harness::start(&config(extra)).await;
    let routes = MemoryRoutes::default();
    h.agent_mut()
        .start_announcing(Box::new(routes.clone()), None);
    h.agent_mut().publish_snapshot();
    (h, routes)
}

fn vip_reason(h: &Harness) -> (bool, String) {
    let snap = h.snapshot();
    let v = &snap.announce.vips[0];
    (v.announced, v.reason.clone())
}

#[tokio::test(start_paused = true)]
async fn announced_once_serving_and_withdrawn_when_nothing_can_serve() {
    let (mut h, routes) = announcing("fail_open = false").await;
    assert!(
        routes.installed().is_empty(),
        "servers still checking: a fresh node must not attract traffic"
    );
    h.run_until(secs(5), |_| !routes.installed().is_empty())
        .await
        .expect("announced once the probes pass");
    assert_eq!(vip_reason(&h), (true, "serving".into()));

    h.set(sa("10.0.1.1:80"), Verdict::Refuse);
    h.run_for(secs(3)).await;
    assert_ne!(
        h.state("web", sa("10.0.1.1:80")),
        "up",
        "setup: the first server failed"
    );
    assert_eq!(
        routes.installed().len(),
        1,
        "one server left: still serving"
    );

    h.set(sa("10.0.1.2:80"), Verdict::Refuse);
    h.run_until(secs(5), |_| routes.installed().is_empty())
        .await
        .expect("withdrawn when no server can serve (fail-closed)");
    assert_eq!(vip_reason(&h), (false, "no usable server".into()));
    let metrics = render_metrics(&h.snapshot());
    assert!(
        metrics.contains("lb_vip_announced{vip=\"10.0.0.100\",reason=\"no usable server\"} 0"),
        "{metrics}"
    );
    let events = h.events.lock().await;
    let withdrawn: Vec<_> = events.iter().filter(|e| e.to == "withdrawn").collect();
    assert_eq!(withdrawn.len(), 1, "one transition logged: {events:?}");
    assert_eq!(withdrawn[0].server, "10.0.0.100");
    assert_eq!(withdrawn[0].cause, "no usable server");
    drop(events);

    h.set(sa("10.0.1.2:80"), Verdict::Pass);
    h.run_until(secs(5), |_| !routes.installed().is_empty())
        .await
        .expect("announced again when a server recovers");
}

#[tokio::test(start_paused = true)]
async fn fail_open_keeps_the_vip_announced() {
    let (mut h, routes) = announcing("").await;
    h.run_for(secs(2)).await;
    h.set(sa("10.0.1.1:80"), Verdict::Refuse);
    h.set(sa("10.0.1.2:80"), Verdict::Refuse);
    h.run_until(secs(5), |h| h.service_status("web").fail_open)
        .await
        .expect("setup: every server down, fail-open");
    assert_eq!(vip_reason(&h), (true, "fail-open".into()));
    assert_eq!(
        routes.installed(),
        vec!["10.0.0.100".parse::<std::net::IpAddr>().unwrap()]
    );
}

#[tokio::test(start_paused = true)]
async fn node_drain_withdraws_and_undrain_announces_again() {
    let (mut h, routes) = announcing("").await;
    h.run_for(secs(2)).await;
    assert_eq!(routes.installed().len(), 1);
    h.admin("", "", AdminChange::NodeDrain(true))
        .await
        .expect("drain accepted");
    assert!(routes.installed().is_empty());
    assert_eq!(vip_reason(&h), (false, "node drained".into()));
    assert!(h.snapshot().announce.drained);
    // Forwarding goes on: the table still has both backends.
    assert!(h.slots("web", sa("10.0.1.1:80")) > 0);
    // Health changes while drained announce nothing.
    h.set(sa("10.0.1.1:80"), Verdict::Refuse);
    h.run_for(secs(3)).await;
    h.set(sa("10.0.1.1:80"), Verdict::Pass);
    h.run_for(secs(3)).await;
    assert!(routes.installed().is_empty());
    h.admin("", "", AdminChange::NodeDrain(false))
        .await
        .expect("undrain accepted");
    assert_eq!(routes.installed().len(), 1);
    assert_eq!(vip_reason(&h), (true, "serving".into()));
}

#[tokio::test(start_paused = true)]
async fn drain_is_refused_while_announcing_is_off() {
    let mut h = Harness::start(&config("")).await;
    let err = h
        .admin("", "", AdminChange::NodeDrain(true))
        .await
        .expect_err("no announce interface");
    assert!(err.to_string().contains("announce_interface"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn fingerprint_is_equal_whatever_order_servers_arrived_in() {
    // Node A: both servers from the file. Node B: the second added at runtime, after
    // the first got its id, so the two nodes number their backends differently.
    let mut a = Harness::start(&config("")).await;
    let only_second = web(
        "",
        &(servers(&[("10.0.1.2:80", "")])
            + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n"),
    );
    let mut b = Harness::start(&only_second).await;
    b.add_server("web", sa("10.0.1.1:80")).await.expect("added");
    a.run_for(secs(3)).await;
    b.run_for(secs(3)).await;
    assert_ne!(
        a.backend_ids("web", sa("10.0.1.1:80")),
        b.backend_ids("web", sa("10.0.1.1:80")),
        "setup: the nodes must number the backends differently"
    );
    let fa = a.service_status("web").table_fingerprint;
    let fb = b.service_status("web").table_fingerprint;
    assert_eq!(fa.len(), 16);
    assert_eq!(
        fa, fb,
        "same servers, same health: same table on both nodes"
    );

    // A health difference shows.
    b.set(sa("10.0.1.1:80"), Verdict::Refuse);
    b.run_for(secs(3)).await;
    assert_ne!(b.service_status("web").table_fingerprint, fa);
}
