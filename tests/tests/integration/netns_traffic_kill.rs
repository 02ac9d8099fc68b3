//! One backend dies under ordinary traffic: four backends, the clients of
//! `netns_traffic_ordinary` running, b2's server SIGKILLed after a warm-up. In nat and in
//! dsr: requests fail only on connections to the dead backend (refused new connections,
//! connections in flight when it died, keep-alive connections that were on b2) and only
//! until the probe's
//! `check-config` bound; no other server leaves, nothing fails open, and after the bound
//! no new connection goes to b2.

use std::{path::Path, thread, time::Duration};

use lb_tests::{
    net::topology::Forwarding,
    scenario::{
        health::MARGIN,
        realistic::{Bed, Role},
    },
    traffic::ordinary::{Cause, Client, Ordinary, OrdinaryConfig},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Traffic before the kill (the flows and the health state settle).
const WARM_UP: Duration = Duration::from_secs(8);
/// Traffic after the kill: the bound (6 s) two and a half times over.
const AFTER: Duration = Duration::from_secs(15);

fn kill_one(forwarding: Forwarding, subnet: u8) {
    let label = forwarding.as_str();
    let mut bed = Bed::start(
        forwarding,
        subnet,
        &Role::primaries(4),
        Path::new(TESTSERVER),
    );
    let dead = bed.addr("b2").to_string();
    let bound = bed.bounds.detect_worst;
    let start = bed.start_readings();
    let traffic = Ordinary::start(
        &bed.topo.client().ns,
        &OrdinaryConfig::new(bed.vip, WARM_UP + AFTER),
    );
    thread::sleep(WARM_UP);
    let killed = bed.servers.kill("b2").expect("killing b2's server");
    let reaped = lb_tests::traffic::pacer::wall_now();
    let report = traffic.finish(false);
    let events = bed.events_since(bed.baseline).expect("reading the events");
    let readings = bed.finish_readings(&start, &events);
    let last_failure = report
        .failures()
        .map(|(r, _)| r.at)
        .fold(f64::NAN, f64::max);
    println!(
        "kill {label}: b2 killed at +{:.2} s; check-config bound {bound:?}; failures until \
         +{:.2} s after the kill\n  {}  {}\n  events since the baseline:\n{}",
        killed - report.started,
        last_failure - killed,
        report.summary(),
        readings.line(),
        bed.describe_events(&events, killed)
    );

    let others: Vec<_> = events
        .iter()
        .filter(|e| e.server != dead && health_event(e))
        .collect();
    assert!(
        others.is_empty(),
        "{label}: only b2 may leave; other events:\n{}",
        bed.describe_events(&events, killed)
    );
    let deadline = killed + (bound + MARGIN).as_secs_f64();
    for (r, f) in report.failures() {
        // A connection is known to be b2's when it was on b2 (keep-alive), when its SYN
        // was refused (only b2's port is closed), or when it was in flight while b2's
        // server died (reset or cut short between the signal and the reaping).
        let in_flight = r.at <= reaped && matches!(f.cause, Cause::Reset | Cause::Closed);
        let on_dead = match (&r.client, &f.expected) {
            (Client::KeepAlive(_), Some(b)) => b == "b2",
            (_, _) => f.cause == Cause::Refused || in_flight,
        };
        assert!(
            r.at >= killed - 0.01 && r.at <= deadline && on_dead,
            "{label}: a request failed at +{:.2} s after the kill ({:?}: {}, expected {:?}); \
             only connections to b2 may fail, and only within the bound {bound:?} (+{MARGIN:?}):\n{}",
            r.at - killed,
            r.client,
            f.cause,
            f.expected,
            report.summary()
        );
    }
    let late = report.new_conns_to_since("b2", deadline);
    assert!(
        late.is_empty(),
        "{label}: {} new connections reached b2 after the bound",
        late.len()
    );
}

/// A state change of a server, or a membership note such as fail-open.
fn health_event(e: &lb_tests::agent::api::EventView) -> bool {
    e.server != "-" || e.cause.contains("fail-open")
}

#[test]
fn killed_backend_fails_only_its_requests_within_bound_nat() {
    kill_one(Forwarding::Nat, 163);
}

#[test]
fn killed_backend_fails_only_its_requests_within_bound_dsr() {
    kill_one(Forwarding::Dsr, 164);
}
