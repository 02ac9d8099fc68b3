//! DESIGN.md §6 spare servers through the whole agent: idle spares keep no slot but stay
//! LIVE (sticky); when primaries fail the fewest spares covering the missing weight run,
//! largest weight first; they retire when the primaries return.

use std::net::SocketAddr;

use crate::util::{Harness, Verdict, sa, secs, servers, web};
use lb_agent::api::{AdminChange, ServerPatch};

/// Primaries .1 and .2 (weight 1), spares .3 (weight 1) and .4 (weight 2).
fn config() -> String {
    web(
        "",
        &(servers(&[
            ("10.0.1.1:80", ""),
            ("10.0.1.2:80", ""),
            ("10.0.1.3:80", "spare = true"),
            ("10.0.1.4:80", "spare = true\nweight = 2"),
        ]) + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n"),
    )
}

struct Four {
    p1: SocketAddr,
    p2: SocketAddr,
    s1: SocketAddr,
    s2: SocketAddr,
}

fn four() -> Four {
    Four {
        p1: sa("10.0.1.1:80"),
        p2: sa("10.0.1.2:80"),
        s1: sa("10.0.1.3:80"),
        s2: sa("10.0.1.4:80"),
    }
}

fn spare_status(h: &Harness, addr: SocketAddr) -> String {
    h.server_status("web", addr)
        .spare
        .unwrap_or_else(|| panic!("{addr} is a spare: status must say idle or running"))
}

fn assert_idle_sticky(h: &Harness, addr: SocketAddr, why: &str) {
    assert_eq!(spare_status(h, addr), "idle", "{addr}: {why}");
    assert_eq!(h.slots("web", addr), 0, "an idle spare has no slot ({why})");
    assert!(
        h.live("web", addr),
        "an idle healthy spare stays LIVE so pinned flows stay ({why})"
    );
}

async fn running() -> Harness {
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(2)).await;
    h
}

#[tokio::test(start_paused = true)]
async fn spares_are_idle_while_primaries_cover_main_weight() {
    let h = running().await;
    let f = four();
    for s in [f.s1, f.s2] {
        assert_idle_sticky(&h, s, "primaries cover main_weight");
    }
    assert_eq!(h.server_status("web", f.p1).spare, None, "not a spare");
    let svc = h.service_status("web");
    assert_eq!(
        (svc.main_weight, svc.active_weight, svc.spare_num),
        (2, 2, 0)
    );
    let half = |a| (h.share("web", a) - 0.5).abs() < 0.01;
    assert!(
        half(f.p1) && half(f.p2),
        "the two primaries share the table evenly: {} / {}",
        h.share("web", f.p1),
        h.share("web", f.p2)
    );
}

#[tokio::test(start_paused = true)]
async fn one_primary_failing_runs_the_largest_spare_alone() {
    let mut h = running().await;
    let f = four();
    // The spares' own checking -> up at start are transitions too.
    let before = h.snapshot().transitions;
    h.set(f.p1, Verdict::Refuse);
    h.run_until(secs(5), |h| h.slots("web", f.p1) == 0)
        .await
        .expect("a refusing primary leaves the table");
    // Same recompute: the spare is in before the primary's slots are gone.
    assert!(
        h.slots("web", f.s2) > 0,
        "the weight-2 spare must take slots as the primary leaves"
    );
    assert_eq!(
        h.snapshot().transitions - before,
        1,
        "one server changed state (p1 up -> unhealthy); the spare starting to run is a \
         membership note in the event log, not a server transition"
    );
    assert_eq!(
        spare_status(&h, f.s2),
        "running",
        "missing weight 1: one spare covers it, and the largest (weight 2) joins first"
    );
    assert_idle_sticky(&h, f.s1, "the fewest spares run: one is enough");
    let svc = h.service_status("web");
    assert_eq!(
        (svc.main_weight, svc.active_weight, svc.spare_num),
        (2, 1, 1),
        "main_weight 2, active_weight 1, one spare running"
    );
    // Active: p2 (weight 1) and s2 (weight 2).
    let (p2, s2) = (h.share("web", f.p2), h.share("web", f.s2));
    assert!(
        (p2 - 1.0 / 3.0).abs() < 0.01 && (s2 - 2.0 / 3.0).abs() < 0.01,
        "slots follow weights 1:2, got {p2:.4} / {s2:.4}"
    );
    assert_eq!(h.empty_slots("web"), 0);
}

#[tokio::test(start_paused = true)]
async fn running_spare_retires_when_primaries_return() {
    let mut h = running().await;
    let f = four();
    h.set(f.p1, Verdict::Refuse);
    h.run_until(secs(5), |h| spare_status(h, f.s2) == "running")
        .await
        .expect("setup: the spare runs");
    h.set(f.p1, Verdict::Pass);
    h.run_until(secs(5), |h| h.slots("web", f.p1) > 0)
        .await
        .expect("the primary returns");
    for s in [f.s1, f.s2] {
        assert_idle_sticky(&h, s, "primaries are back");
    }
    assert_eq!(h.service_status("web").spare_num, 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_running_spare_is_replaced_by_a_healthy_one() {
    let mut h = running().await;
    let f = four();
    h.set(f.p1, Verdict::Refuse);
    h.run_until(secs(5), |h| spare_status(h, f.s2) == "running")
        .await
        .expect("setup: the spare runs");
    h.set(f.s2, Verdict::Refuse);
    h.run_until(secs(5), |h| h.state("web", f.s2) == "unhealthy")
        .await
        .expect("the running spare fails");
    assert_eq!(h.slots("web", f.s2), 0, "a failed spare leaves the table");
    assert!(
        h.live("web", f.s2) && !h.serving("web", f.s2),
        "a failed spare keeps its established flows"
    );
    assert_eq!(
        spare_status(&h, f.s1),
        "running",
        "the other spare covers the missing weight"
    );
    assert!(h.slots("web", f.s1) > 0);
}

#[tokio::test(start_paused = true)]
async fn both_primaries_failing_still_needs_only_the_weight_two_spare() {
    let mut h = running().await;
    let f = four();
    h.set(f.p1, Verdict::Refuse);
    h.set(f.p2, Verdict::Refuse);
    h.run_until(secs(5), |h| {
        h.slots("web", f.p1) == 0 && h.slots("web", f.p2) == 0
    })
    .await
    .expect("both primaries leave");
    assert_eq!(spare_status(&h, f.s2), "running", "weight 2 covers 2");
    assert_idle_sticky(&h, f.s1, "weight 2 alone covers the missing 2");
    assert_eq!(
        h.slots("web", f.s2),
        h.table("web").len(),
        "the running spare takes every slot"
    );
}

/// Angie: a spare with active probes is not used until they pass, also at start (only
/// `essential` probes hold a primary back there). The primary is downed before any probe
/// has run: the spare covers it only once its own (non-essential) probe has passed, and a
/// spare whose probe fails never runs.
#[tokio::test(start_paused = true)]
async fn a_spare_at_start_runs_only_after_its_probes_pass() {
    let config = web(
        "",
        &(servers(&[
            ("10.0.1.1:80", ""),
            ("10.0.1.3:80", "spare = true"),
            ("10.0.1.4:80", "spare = true"),
        ]) + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"10s\"\n"),
    );
    let (p1, good, dead) = (sa("10.0.1.1:80"), sa("10.0.1.3:80"), sa("10.0.1.4:80"));
    let mut h = Harness::start(&config).await;
    h.set(dead, Verdict::Refuse);
    for s in [good, dead] {
        assert_eq!(
            h.state("web", s),
            "checking",
            "{s}: a spare waits for its probe"
        );
    }
    assert_eq!(
        h.state("web", p1),
        "up",
        "a primary without essential probes is up at once"
    );
    let down = ServerPatch {
        down: Some(true),
        ..Default::default()
    };
    h.admin("web", &p1.to_string(), AdminChange::Patch(down))
        .await
        .expect("down is accepted");
    for s in [good, dead] {
        assert_eq!(
            h.slots("web", s),
            0,
            "{s}: no slot before its first probe passed, although the primary is down"
        );
    }
    h.run_until(secs(11), |h| h.state("web", good) == "up")
        .await
        .expect("the good spare's first probe passes within an interval");
    assert_eq!(spare_status(&h, good), "running");
    assert!(
        h.slots("web", good) > 0,
        "then it covers the downed primary"
    );
    h.run_for(secs(11)).await;
    assert_ne!(h.state("web", dead), "up");
    assert_eq!(
        h.slots("web", dead),
        0,
        "a spare failing its probe never runs"
    );
    assert!(!h.live("web", dead), "it never had traffic to keep");
}
