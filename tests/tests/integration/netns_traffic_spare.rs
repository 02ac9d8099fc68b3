//! A primary answers 500, a spare takes over, the primary recovers — under ordinary
//! traffic. Primaries p1, p2, p3 and spare s1 (all weight 1), the clients of
//! `netns_traffic_ordinary` running. p1's health endpoint answers 500 (its web service
//! keeps answering): within the `check-config` bound p1 leaves and s1 runs; then p1's
//! endpoint heals: p1 returns and s1 retires. Meanwhile no other server changes state,
//! not one request fails (every web service answers throughout), and a keep-alive
//! connection held on p1 keeps answering while p1 is out.

use std::{path::Path, time::Duration};

use lb_tests::{
    agent::api::ServiceView,
    net::topology::Forwarding,
    scenario::{
        health,
        realistic::{Bed, Expect, Role, Takeover, TakeoverRun},
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Traffic before p1 fails, while s1 runs, and after p1 is back.
const PHASE: Duration = Duration::from_secs(6);

fn spare_takes_over(forwarding: Forwarding, subnet: u8) {
    let label = forwarding.as_str();
    let roles = [
        Role::primary("p1", 0),
        Role::primary("p2", 1),
        Role::primary("p3", 2),
        Role::spare("s1", 3),
    ];
    let bed = Bed::start(forwarding, subnet, &roles, Path::new(TESTSERVER));
    let (p1, s1) = (bed.addr("p1"), bed.addr("s1"));
    let run = bed.takeover(&Takeover {
        label,
        phase: PHASE,
        failing: &["p1"],
        out: Expect {
            what: "p1 out, s1 running",
            cond: &|s: &ServiceView| {
                s.server(p1).is_some_and(|v| !v.active)
                    && s.server(s1)
                        .is_some_and(|v| v.active && v.spare.as_deref() == Some("running"))
            },
            failed: format!("{label}: p1 answering 500 should make s1 run"),
        },
        back: Expect {
            what: "p1 back, s1 idle",
            cond: &|s: &ServiceView| {
                s.server(p1).is_some_and(|v| v.active && v.state == "up")
                    && s.server(s1)
                        .is_some_and(|v| !v.active && v.spare.as_deref() == Some("idle"))
            },
            failed: format!("{label}: p1 healed should retire s1"),
        },
        changing: &[p1],
        others_changed: format!("{label}: only p1 may change state (no healthy server ejected)"),
        headline: &|out, back| {
            format!(
                "spare {label}: p1 out {out:.2} s after its 500s, back {back:.2} s after healing"
            )
        },
    });
    let TakeoverRun {
        report,
        events,
        out_at,
        healed,
        back_at,
        ..
    } = run;
    // The window in which p1 was out: from when the API showed it out (after the flip)
    // to p1's transition back to `up` (the API's snapshot lags the flip by up to its
    // refresh period, so the end is taken from the event, which is written first).
    let up_again =
        health::find_event(&events, p1, "up", healed).map_or(back_at, |e| health::event_time(&e));
    let to_s1 = report
        .new_conns_to_since("s1", out_at + 0.05)
        .len()
        .saturating_sub(report.new_conns_to_since("s1", up_again).len());
    assert!(to_s1 > 0, "{label}: s1 took no new connection while it ran");
    let to_p1 = report
        .new_conns_to_since("p1", out_at + 0.05)
        .len()
        .saturating_sub(report.new_conns_to_since("p1", up_again - 0.05).len());
    assert_eq!(
        to_p1, 0,
        "{label}: new connections reached p1 while it was out"
    );
}

#[test]
fn spare_covers_a_primary_answering_500_nat() {
    spare_takes_over(Forwarding::Nat, 165);
}

#[test]
fn spare_covers_a_primary_answering_500_dsr() {
    spare_takes_over(Forwarding::Dsr, 166);
}
