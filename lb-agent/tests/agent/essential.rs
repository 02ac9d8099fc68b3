//! DESIGN.md §5 `essential` probes through the whole agent: a new server gets no slot and
//! stays `checking` until it passes; without an essential probe it is up at once.

use crate::util::{Harness, Verdict, sa, secs, servers, web};

const ESSENTIAL: &str =
    "[[service.probe]]\nname = \"ready\"\ntype = \"http\"\ninterval = \"5s\"\nessential = true\n";

/// `web` with `extra` service lines, servers .1 and .2, and the essential probe.
fn config(extra: &str) -> String {
    web(
        extra,
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")]) + ESSENTIAL),
    )
}

/// Servers .1 and .2 up after their first passes.
async fn running(extra: &str) -> Harness {
    let mut h = Harness::start(&config(extra)).await;
    h.run_for(secs(6)).await;
    for a in [sa("10.0.1.1:80"), sa("10.0.1.2:80")] {
        assert_eq!(
            h.state("web", a),
            "up",
            "setup: {a} passed its essential probe"
        );
        assert!(h.slots("web", a) > 0, "setup: {a} is in the table");
    }
    h
}

async fn add(h: &mut Harness, addr: &str) {
    h.add_server("web", sa(addr))
        .await
        .unwrap_or_else(|e| panic!("adding {addr} must be accepted: {e}"));
}

#[tokio::test(start_paused = true)]
async fn new_server_with_essential_probe_is_checking_without_slots_until_first_pass() {
    let mut h = running("").await;
    let c = sa("10.0.1.3:80");
    add(&mut h, "10.0.1.3:80").await;
    let added = tokio::time::Instant::now();
    assert_eq!(
        h.state("web", c),
        "checking",
        "a new server starts checking"
    );
    assert_eq!(h.slots("web", c), 0, "a checking server gets no slot");
    assert!(
        !h.live("web", c),
        "a checking server takes no flow at all (not LIVE)"
    );
    assert!(
        !h.server_status("web", c).active,
        "status must not show a checking server as active"
    );

    let took = h
        .run_until(secs(10), |h| h.slots("web", c) > 0)
        .await
        .expect("the server must get slots once it passes");
    let probes = h.prober.calls_to(c, added);
    assert_eq!(
        probes.len(),
        1,
        "slots must come with the first passing probe, not before: {probes:?}"
    );
    assert!(
        took <= secs(5),
        "the first probe runs within the first interval (5s), slots came after {took:?}"
    );
    assert_eq!(h.state("web", c), "up");
    assert!(h.live("web", c));
}

#[tokio::test(start_paused = true)]
async fn failing_new_server_with_essential_probe_never_gets_slots() {
    let mut h = running("").await;
    let c = sa("10.0.1.3:80");
    h.set(c, Verdict::Refuse);
    add(&mut h, "10.0.1.3:80").await;
    let ever = h.run_until(secs(30), |h| h.slots("web", c) > 0).await;
    assert_eq!(
        ever, None,
        "a server failing its essential probe must never get a slot"
    );
    assert_ne!(h.state("web", c), "up");
}

#[tokio::test(start_paused = true)]
async fn server_without_essential_probe_is_up_at_once() {
    let text = web(
        "",
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")])
            + "[[service.probe]]\ntype = \"http\"\ninterval = \"5s\"\n"),
    );
    let h = Harness::start(&text).await;
    assert!(
        h.prober.calls().is_empty(),
        "setup: no probe may have run yet"
    );
    for a in [sa("10.0.1.1:80"), sa("10.0.1.2:80")] {
        assert_eq!(
            h.state("web", a),
            "up",
            "without an essential probe a server starts up"
        );
        assert!(
            h.slots("web", a) > 0,
            "{a} must have slots before any probe"
        );
        assert!(h.live("web", a));
    }
}

#[tokio::test(start_paused = true)]
async fn new_service_with_essential_probe_sends_no_traffic_before_first_pass() {
    // DESIGN.md §5: a new server with an essential probe "gets no client traffic until it
    // passes". At start-up every server is new, so fail-open (§6, about servers health
    // took out) must not hand them traffic before their first pass.
    let h = Harness::start(&config("")).await;
    for a in [sa("10.0.1.1:80"), sa("10.0.1.2:80")] {
        assert_eq!(h.state("web", a), "checking");
        assert_eq!(
            h.slots("web", a),
            0,
            "{a} has not passed its essential probe: it must get no slot"
        );
    }
    assert!(
        !h.service_status("web").fail_open,
        "servers still checking are not a failure to fail open from"
    );
}

#[tokio::test(start_paused = true)]
async fn removal_cap_does_not_hold_a_checking_server_in_traffic() {
    // The cap limits how many servers *health removes*; a server that never passed its
    // essential probe was never in traffic, so the cap must not put it there.
    // 2 servers at 50%: health may remove 1. .2 fails and is removed; adding .3 makes 3
    // servers (still 1 removable) with 2 not up, .3 the most recent.
    let mut h = running("max_unhealthy_percent = 50").await;
    let b = sa("10.0.1.2:80");
    h.set(b, Verdict::Refuse);
    h.run_until(secs(30), |h| h.slots("web", b) == 0)
        .await
        .expect("setup: a failing server within the cap is removed");
    let c = sa("10.0.1.3:80");
    h.set(c, Verdict::Silent);
    add(&mut h, "10.0.1.3:80").await;
    assert_eq!(h.state("web", c), "checking");
    assert_eq!(
        h.slots("web", c),
        0,
        "a checking server must get no slot, whatever max_unhealthy_percent says"
    );
}

/// `web` with servers .1 and .2 and one plain (not essential) probe.
const PLAIN: &str = "[[service.probe]]\nname = \"plain\"\ntype = \"http\"\ninterval = \"5s\"\n";

#[tokio::test(start_paused = true)]
async fn server_added_at_runtime_is_held_back_until_a_plain_probe_passes() {
    let text = web(
        "",
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")]) + PLAIN),
    );
    let mut h = Harness::start(&text).await;
    assert_eq!(
        h.state("web", sa("10.0.1.1:80")),
        "up",
        "at start a plain probe does not gate (Angie)"
    );
    let c = sa("10.0.1.3:80");
    h.set(c, Verdict::Refuse);
    add(&mut h, "10.0.1.3:80").await;
    let added = tokio::time::Instant::now();
    assert_eq!(h.state("web", c), "checking", "added at runtime: held back");
    assert_eq!(h.slots("web", c), 0);
    assert!(!h.live("web", c), "no flow at all before a pass");
    let ever = h.run_until(secs(12), |h| h.slots("web", c) > 0).await;
    assert_eq!(ever, None, "a failing added server never gets a slot");
    let first = h.prober.calls().into_iter().find(|call| call.target == c);
    assert!(
        first
            .as_ref()
            .is_some_and(|call| call.started - added < lb_agent::probe::PROMPT_SPREAD),
        "its first probe ran (and failed) promptly: {first:?}"
    );

    h.set(c, Verdict::Pass);
    h.run_until(secs(6), |h| h.slots("web", c) > 0)
        .await
        .expect("slots come with its first pass");
    assert_eq!(h.state("web", c), "up");
}
