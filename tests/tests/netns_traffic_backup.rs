//! A backup level takes over under ordinary traffic (issue 8): primaries p1, p2 and
//! backup k1 (level 1), the clients of `netns_traffic_ordinary` running. Both primaries'
//! health endpoints answer 500 (their web services keep answering): within the
//! `check-config` bound the service moves to level 1 and new connections go to k1 only;
//! the endpoints heal: the primaries return and k1 takes no new connection. k1 never
//! changes state, nothing fails open, not one request fails, and a keep-alive connection
//! held on p1 keeps answering while level 1 serves.

use std::{path::Path, thread, time::Duration};

use lb_tests::{
    api::ServiceView,
    health::{self, MARGIN},
    ordinary::{self, Ordinary, OrdinaryConfig, PinnedConn},
    realistic::{Bed, Role, SERVICE},
    topology::Forwarding,
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
    let start = bed.start_readings();
    let traffic = Ordinary::start(
        &bed.topo.client().ns,
        &OrdinaryConfig::new(bed.vip, PHASE * 3 + Duration::from_secs(40)),
    );
    let mut held = PinnedConn::open_on(&bed.topo.client().ns, bed.vip, "p1", 64)
        .unwrap_or_else(|e| panic!("{label}: a keep-alive connection on p1: {e}"));
    thread::sleep(PHASE);

    let failing = bed.servers.control("p1", "http 500\n");
    bed.servers.control("p2", "http 500\n");
    let wait = bed.bounds.detect_fast + MARGIN * 2;
    // A wait that fails is reported after the traffic's figures, at the end.
    let went_out = bed
        .api
        .wait_service(SERVICE, "level 1 active", wait, |s: &ServiceView| {
            s.active_backup_level == 1 && s.server(k1).is_some_and(|v| v.active)
        })
        .map_err(|e| format!("{label}: both primaries out should activate k1: {e}"));
    let out_at = failing + went_out.as_ref().map_or(f64::NAN, |(_, t)| t.as_secs_f64());
    // The connection held on p1 keeps working while p1 is out (30 requests, under the
    // server's keep-alive cap of 100).
    let held_answers = held.requests_for(PHASE, PHASE / 30);

    let healed = bed.servers.control("p1", "");
    bed.servers.control("p2", "");
    let wait = bed.bounds.recover_max + MARGIN * 2;
    let came_back = bed
        .api
        .wait_service(SERVICE, "primaries back", wait, |s: &ServiceView| {
            s.active_backup_level == 0
                && [p1, p2]
                    .iter()
                    .all(|a| s.server(*a).is_some_and(|v| v.active && v.state == "up"))
        })
        .map_err(|e| format!("{label}: healed primaries should take over again: {e}"));
    let back_at = healed
        + came_back
            .as_ref()
            .map_or(f64::NAN, |(_, t)| t.as_secs_f64());
    thread::sleep(PHASE);
    let report = traffic.finish(true);
    let events = bed.events_since(bed.baseline).expect("reading the events");
    let readings = bed.finish_readings(&start, &events);
    println!(
        "backup {label}: level 1 {:.2} s after the 500s, primaries back {:.2} s after healing\n  {}  {}\n  events since the baseline:\n{}",
        out_at - failing,
        back_at - healed,
        report.summary(),
        readings.line(),
        bed.describe_events(&events, failing)
    );

    println!(
        "{label}: the connection held on p1 while it was out: {}",
        ordinary::held_summary(&held_answers, "p1")
    );
    if let Err(e) = went_out.and(came_back) {
        panic!("{e}");
    }
    assert!(
        held_answers.iter().all(|a| a.as_deref() == Ok("p1")),
        "{label}: a working keep-alive connection to p1 must keep answering while p1 is \
         out of the table: {}",
        ordinary::held_summary(&held_answers, "p1")
    );
    let others: Vec<_> = events
        .iter()
        .filter(|e| e.server != "-" && e.server != p1.to_string() && e.server != p2.to_string())
        .collect();
    assert!(
        others.is_empty(),
        "{label}: the backup must not change state:\n{}",
        bed.describe_events(&events, failing)
    );
    assert!(
        !events.iter().any(|e| e.cause.contains("fail-open")),
        "{label}: nothing may fail open:\n{}",
        bed.describe_events(&events, failing)
    );
    assert_eq!(
        report.failures().count(),
        0,
        "{label}: every backend's web service answered throughout; no request may fail:\n{}",
        report.summary()
    );
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
