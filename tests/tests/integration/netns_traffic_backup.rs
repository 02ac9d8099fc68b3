//! A backup level takes over under ordinary traffic: primaries p1, p2 and
//! backup k1 (level 1), the clients of `netns_traffic_ordinary` running. Both primaries'
//! health endpoints answer 500 (their web services keep answering): within the
//! `check-config` bound the service moves to level 1 and new connections go to k1 only;
//! the endpoints heal: the primaries return and k1 takes no new connection. k1 never
//! changes state, nothing fails open, not one request fails, and a keep-alive connection
//! held on p1 keeps answering while level 1 serves.

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
/// Traffic before the primaries fail, while k1 serves, and after they are back.
const PHASE: Duration = Duration::from_secs(6);

fn backup_takes_over(forwarding: Forwarding, subnet: u8) {
    let label = forwarding.as_str();
    let roles = [
        Role::primary("p1", 0),
        Role::primary("p2", 1),
        Role::backup("k1", 2, 1),
    ];
    let bed = Bed::start(forwarding, subnet, &roles, Path::new(TESTSERVER));
    let (p1, p2, k1) = (bed.addr("p1"), bed.addr("p2"), bed.addr("k1"));
    let run = bed.takeover(&Takeover {
        label,
        phase: PHASE,
        failing: &["p1", "p2"],
        out: Expect {
            what: "level 1 active",
            cond: &|s: &ServiceView| {
                s.active_backup_level == 1 && s.server(k1).is_some_and(|v| v.active)
            },
            failed: format!("{label}: both primaries out should activate k1"),
        },
        back: Expect {
            what: "primaries back",
            cond: &|s: &ServiceView| {
                s.active_backup_level == 0
                    && [p1, p2]
                        .iter()
                        .all(|a| s.server(*a).is_some_and(|v| v.active && v.state == "up"))
            },
            failed: format!("{label}: healed primaries should take over again"),
        },
        changing: &[p1, p2],
        others_changed: format!("{label}: the backup must not change state"),
        headline: &|out, back| {
            format!(
                "backup {label}: level 1 {out:.2} s after the 500s, primaries back {back:.2} s after healing"
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
    // Level 1 served from when the API showed it (after the flip) to the first primary's
    // transition back to `up` (the API's snapshot lags the flip by up to its refresh
    // period, so the end is taken from the event, which is written first).
    let up_again = [p1, p2]
        .iter()
        .filter_map(|a| health::find_event(&events, *a, "up", healed))
        .map(|e| health::event_time(&e))
        .fold(back_at, f64::min);
    let during = |name: &str| {
        report
            .new_conns_to_since(name, out_at + 0.05)
            .len()
            .saturating_sub(report.new_conns_to_since(name, up_again - 0.05).len())
    };
    assert!(during("k1") > 0, "{label}: k1 took no new connection");
    assert_eq!(
        (during("p1"), during("p2")),
        (0, 0),
        "{label}: new connections reached a primary while level 1 served"
    );
    let after = report.new_conns_to_since("k1", back_at + 0.05).len();
    assert_eq!(
        after, 0,
        "{label}: new connections reached k1 after the primaries were back"
    );
}

#[test]
fn backup_level_covers_failed_primaries_nat() {
    backup_takes_over(Forwarding::Nat, 167);
}

#[test]
fn backup_level_covers_failed_primaries_dsr() {
    backup_takes_over(Forwarding::Dsr, 168);
}
