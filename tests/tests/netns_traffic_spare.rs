//! A primary answers 500, a spare takes over, the primary recovers — under ordinary
//! traffic (issue 8). Primaries p1, p2, p3 and spare s1 (all weight 1), the clients of
//! `netns_traffic_ordinary` running. p1's health endpoint answers 500 (its web service
//! keeps answering): within the `check-config` bound p1 leaves and s1 runs; then p1's
//! endpoint heals: p1 returns and s1 retires. Meanwhile no other server changes state,
//! not one request fails (every web service answers throughout), and a keep-alive
//! connection held on p1 keeps answering while p1 is out.

use std::{path::Path, thread, time::Duration};

use lb_tests::{
    api::ServiceView,
    health::{self, MARGIN},
    ordinary::{self, Ordinary, OrdinaryConfig, PinnedConn},
    realistic::{Bed, Role, SERVICE},
    topology::Forwarding,
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
    let start = bed.start_readings();
    // Long enough for three phases and both verdicts; stopped at the end.
    let traffic = Ordinary::start(
        &bed.topo.client().ns,
        &OrdinaryConfig::new(bed.vip, PHASE * 3 + Duration::from_secs(40)),
    );
    let mut held = PinnedConn::open_on(&bed.topo.client().ns, bed.vip, "p1", 64)
        .unwrap_or_else(|e| panic!("{label}: a keep-alive connection on p1: {e}"));
    thread::sleep(PHASE);

    let failing = bed.servers.control("p1", "http 500\n");
    let wait = bed.bounds.detect_fast + MARGIN * 2;
    // A wait that fails is reported after the traffic's figures, at the end.
    let went_out = bed
        .api
        .wait_service(SERVICE, "p1 out, s1 running", wait, |s: &ServiceView| {
            s.server(p1).is_some_and(|v| !v.active)
                && s.server(s1)
                    .is_some_and(|v| v.active && v.spare.as_deref() == Some("running"))
        })
        .map_err(|e| format!("{label}: p1 answering 500 should make s1 run: {e}"));
    let out_at = failing + went_out.as_ref().map_or(f64::NAN, |(_, t)| t.as_secs_f64());
    // The connection held on p1 keeps working while p1 is out (30 requests, under the
    // server's keep-alive cap of 100).
    let held_answers = held.requests_for(PHASE, PHASE / 30);

    let healed = bed.servers.control("p1", "");
    let wait = bed.bounds.recover_max + MARGIN * 2;
    let came_back = bed
        .api
        .wait_service(SERVICE, "p1 back, s1 idle", wait, |s: &ServiceView| {
            s.server(p1).is_some_and(|v| v.active && v.state == "up")
                && s.server(s1)
                    .is_some_and(|v| !v.active && v.spare.as_deref() == Some("idle"))
        })
        .map_err(|e| format!("{label}: p1 healed should retire s1: {e}"));
    let back_at = healed
        + came_back
            .as_ref()
            .map_or(f64::NAN, |(_, t)| t.as_secs_f64());
    thread::sleep(PHASE);
    let report = traffic.finish(true);
    let events = bed.events_since(bed.baseline).expect("reading the events");
    let readings = bed.finish_readings(&start, &events);
    println!(
        "spare {label}: p1 out {:.2} s after its 500s, back {:.2} s after healing\n  {}  {}\n  events since the baseline:\n{}",
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
        .filter(|e| e.server != "-" && e.server != p1.to_string())
        .collect();
    assert!(
        others.is_empty(),
        "{label}: only p1 may change state (no healthy server ejected):\n{}",
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
