//! DESIGN.md §5 passive checks through the whole agent: `max_fails` data-plane failure
//! events within `fail_timeout` make a server `unavailable` and take it out of the table
//! until `fail_timeout` has elapsed; `max_fails = 0` turns them off.

use std::net::SocketAddr;

use crate::util::{Harness, Verdict, sa, secs, servers, web};
use lb_common::events::{EVENT_RST_ON_SYN, EVENT_SYN_RETRANSMIT, PassiveEvent};
use lb_common::maps::BackendStats;
use tokio::time::Instant;

/// Two servers, no active probe; `extra` service lines.
fn config(extra: &str) -> String {
    web(extra, &servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")]))
}

fn a() -> SocketAddr {
    sa("10.0.1.1:80")
}

/// One event of `kind` about `addr`, as the data plane reports it.
fn event(h: &Harness, kind: u32, addr: SocketAddr) -> PassiveEvent {
    let ids = h.backend_ids("web", addr);
    assert_eq!(ids.len(), 1, "setup: {addr} has one backend id");
    PassiveEvent {
        kind,
        backend_id: ids[0],
        service_id: h.service_id("web").expect("service published"),
        ..Default::default()
    }
}

async fn send(h: &mut Harness, events: &[PassiveEvent]) {
    h.send_passive_events(events).await;
    h.agent_mut().publish_snapshot();
}

#[tokio::test(start_paused = true)]
async fn max_fails_within_fail_timeout_make_a_server_unavailable_until_it_elapses() {
    let mut h = Harness::start(&config("max_fails = 3\nfail_timeout = \"10s\"")).await;
    h.run_for(secs(1)).await;
    let e = event(&h, EVENT_SYN_RETRANSMIT, a());
    send(&mut h, &[e]).await;
    h.run_for(secs(3)).await;
    send(&mut h, &[e]).await;
    h.run_for(secs(3)).await;
    assert_eq!(h.state("web", a()), "up", "2 of 3 failures: still up");
    assert!(h.slots("web", a()) > 0);

    send(&mut h, &[e]).await;
    let third = Instant::now();
    assert_eq!(
        h.state("web", a()),
        "unavailable",
        "the 3rd failure within 10s makes it unavailable"
    );
    assert_eq!(
        h.slots("web", a()),
        0,
        "an unavailable server leaves the table"
    );
    assert!(h.live("web", a()) && !h.serving("web", a()));
    assert_eq!(h.snapshot().passive_events["syn_retransmit"], 3);

    let took = h
        .run_until(secs(30), |h| h.slots("web", a()) > 0)
        .await
        .expect("the server returns once fail_timeout has elapsed (on_tick)");
    assert_eq!(
        Instant::now() - third,
        secs(10),
        "back exactly fail_timeout after the failure that removed it, took {took:?}"
    );
    assert_eq!(h.state("web", a()), "up");
    assert!(h.live("web", a()));
}

#[tokio::test(start_paused = true)]
async fn failures_spread_wider_than_fail_timeout_do_not_count_together() {
    let mut h = Harness::start(&config("max_fails = 3\nfail_timeout = \"10s\"")).await;
    let e = event(&h, EVENT_RST_ON_SYN, a());
    for _ in 0..4 {
        send(&mut h, &[e]).await;
        h.run_for(secs(6)).await;
    }
    assert_eq!(
        h.state("web", a()),
        "up",
        "never 3 failures within 10s: the server stays up"
    );
    assert!(h.slots("web", a()) > 0);
}

#[tokio::test(start_paused = true)]
async fn one_batch_of_events_counts_every_event() {
    let mut h = Harness::start(&config("max_fails = 2\nfail_timeout = \"10s\"")).await;
    let e = event(&h, EVENT_SYN_RETRANSMIT, a());
    send(&mut h, &[e, e]).await;
    assert_eq!(h.state("web", a()), "unavailable");
    assert_eq!(h.slots("web", a()), 0);
}

#[tokio::test(start_paused = true)]
async fn max_fails_zero_ignores_passive_events() {
    let mut h = Harness::start(&config("max_fails = 0")).await;
    let e = event(&h, EVENT_SYN_RETRANSMIT, a());
    for _ in 0..5 {
        send(&mut h, &[e]).await;
    }
    h.run_for(secs(1)).await;
    assert_eq!(
        h.state("web", a()),
        "up",
        "max_fails = 0: passive checks are off"
    );
    assert!(h.slots("web", a()) > 0);
    assert_eq!(
        h.snapshot().passive_events["syn_retransmit"],
        5,
        "events are still counted"
    );
}

#[tokio::test(start_paused = true)]
async fn events_for_unknown_backends_are_counted_and_ignored() {
    let mut h = Harness::start(&config("max_fails = 1")).await;
    let mut e = event(&h, EVENT_SYN_RETRANSMIT, a());
    e.backend_id = 999;
    send(&mut h, &[e]).await;
    assert_eq!(h.state("web", a()), "up");
    assert_eq!(h.state("web", sa("10.0.1.2:80")), "up");
    // Counters reach the snapshot with the periodic refresh (every 500ms).
    h.run_for(secs(1)).await;
    assert_eq!(h.snapshot().passive_events["syn_retransmit"], 1);
}

#[tokio::test(start_paused = true)]
async fn a_successful_connection_resets_the_failure_count() {
    let mut h = Harness::start(&config("max_fails = 3\nfail_timeout = \"10s\"")).await;
    let e = event(&h, EVENT_SYN_RETRANSMIT, a());
    send(&mut h, &[e, e]).await;
    // The data plane counts a completed handshake; the agent polls counters every 500ms.
    h.agent_mut().dataplane_mut().backend_stats.insert(
        e.backend_id,
        BackendStats {
            conn_ok: 1,
            packets: 3,
            ..Default::default()
        },
    );
    h.run_for(secs(1)).await;
    send(&mut h, &[e]).await;
    assert_eq!(
        h.state("web", a()),
        "up",
        "one success resets the count: 1 failure after it, not 3"
    );
    send(&mut h, &[e, e]).await;
    assert_eq!(
        h.state("web", a()),
        "unavailable",
        "3 failures after the success"
    );
}

#[tokio::test(start_paused = true)]
async fn after_unavailable_one_spurious_failure_does_not_eject_it_again() {
    let mut h = Harness::start(&config("max_fails = 3\nfail_timeout = \"10s\"")).await;
    let e = event(&h, EVENT_SYN_RETRANSMIT, a());
    send(&mut h, &[e, e, e]).await;
    h.run_until(secs(11), |h| h.state("web", a()) == "up")
        .await
        .expect("setup: back after fail_timeout");
    send(&mut h, &[e]).await;
    assert_eq!(
        h.state("web", a()),
        "up",
        "back with the full max_fails tolerance: one signal does not flap it"
    );
    send(&mut h, &[e, e]).await;
    assert_eq!(h.state("web", a()), "unavailable", "3 fresh failures do");
}

#[tokio::test(start_paused = true)]
async fn the_default_max_fails_tolerates_one_spurious_signal() {
    let mut h = Harness::start(&config("")).await;
    let e = event(&h, EVENT_RST_ON_SYN, a());
    send(&mut h, &[e]).await;
    h.run_for(secs(1)).await;
    assert_eq!(h.state("web", a()), "up", "defaults: max_fails = 3");
    assert!(h.serving("web", a()));
}

/// `config` with an `onfail` tcp probe (every 6s, 2 passes) confirming passive removals.
fn with_onfail_probe(extra: &str) -> String {
    config(extra)
        + "[[service.probe]]\nname = \"confirm\"\ntype = \"tcp\"\nmode = \"onfail\"\n\
           interval = \"6s\"\ntimeout = \"500ms\"\nfails = 2\npasses = 2\n"
}

#[tokio::test(start_paused = true)]
async fn passive_removal_ends_only_when_the_onfail_probe_confirms() {
    let mut h = Harness::start(&with_onfail_probe("max_fails = 1\nfail_timeout = \"5s\"")).await;
    h.run_for(secs(9)).await;
    let removed = Instant::now();
    assert!(
        h.prober.calls_to(a(), removed - secs(9)).is_empty(),
        "setup: an onfail probe does not run while the server is up"
    );
    let e = event(&h, EVENT_RST_ON_SYN, a());
    send(&mut h, &[e]).await;
    assert_eq!(h.state("web", a()), "unavailable");
    // Two passes 6s apart cannot both come within fail_timeout (5s).
    h.run_for(secs(5) + crate::util::ms(500)).await;
    assert_eq!(
        h.state("web", a()),
        "unavailable",
        "fail_timeout is over but the probe has not confirmed yet"
    );
    assert!(!h.serving("web", a()));
    h.run_until(secs(13), |h| h.state("web", a()) == "up")
        .await
        .expect("the second pass of the onfail probe brings it back");
    let calls = h.prober.calls_to(a(), removed);
    assert_eq!(
        calls.len(),
        2,
        "exactly the two confirming probes: {calls:?}"
    );
    assert!(h.serving("web", a()));
    let cause = h.events.lock().await.back().unwrap().cause.clone();
    assert_eq!(cause, "passive: all probes passed after fail_timeout");
}

#[tokio::test(start_paused = true)]
async fn passive_removal_does_not_end_on_fail_timeout_while_the_probe_fails() {
    let mut h = Harness::start(&with_onfail_probe("max_fails = 1\nfail_timeout = \"5s\"")).await;
    h.run_for(secs(2)).await;
    h.set(a(), Verdict::Refuse);
    let e = event(&h, EVENT_RST_ON_SYN, a());
    send(&mut h, &[e]).await;
    h.run_for(secs(20)).await;
    assert_eq!(
        h.state("web", a()),
        "unhealthy",
        "the confirming probe failed: passive detected, probe confirmed the failure"
    );
    assert!(!h.serving("web", a()));
    assert!(h.live("web", a()), "established flows stay");
}
