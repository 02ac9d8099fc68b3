//! A working keep-alive connection survives its server failing a probe: four
//! backends, the clients of `netns_traffic_ordinary` running, one keep-alive connection
//! held on b2. b2's health endpoint starts answering 500 (its web service still works):
//! once b2 is out of the table, the held connection keeps answering from b2 (no reset),
//! new connections avoid b2, and no request fails. In nat and in dsr.

use std::{path::Path, thread, time::Duration};

use lb_tests::{
    agent::api::ServiceView,
    net::topology::Forwarding,
    scenario::{
        health::MARGIN,
        realistic::{Bed, Role, SERVICE},
    },
    traffic::ordinary::{self, Ordinary, OrdinaryConfig, PinnedConn},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Traffic before b2 fails.
const WARM_UP: Duration = Duration::from_secs(5);
/// Requests on the held connection after b2 is out, one every 200 ms (the server closes
/// a keep-alive connection after 100 requests; this stays well under).
const HELD_REQUESTS: usize = 30;

fn keepalive_survives(forwarding: Forwarding, subnet: u8) {
    let label = forwarding.as_str();
    let bed = Bed::start(
        forwarding,
        subnet,
        &Role::primaries(4),
        Path::new(TESTSERVER),
    );
    let b2 = bed.addr("b2");
    let start = bed.start_readings();
    let traffic = Ordinary::start(
        &bed.topo.client().ns,
        &OrdinaryConfig::new(bed.vip, Duration::from_secs(60)),
    );
    let mut held = PinnedConn::open_on(&bed.topo.client().ns, bed.vip, "b2", 64)
        .unwrap_or_else(|e| panic!("{label}: a keep-alive connection on b2: {e}"));
    thread::sleep(WARM_UP);
    // Checked at the end, after the figures are printed.
    let before: Vec<_> = (0..3).map(|_| held.request()).collect();

    let failing = bed.servers.control("b2", "http 500\n");
    let wait = bed.bounds.detect_fast + MARGIN * 2;
    // A wait that fails is reported after the traffic's figures, at the end.
    let went_out = bed
        .api
        .wait_service(SERVICE, "b2 out of the table", wait, |s: &ServiceView| {
            s.server(b2).is_some_and(|v| !v.active)
        })
        .map_err(|e| format!("{label}: b2 answering 500 should take it out: {e}"));
    let out_at = failing + went_out.as_ref().map_or(f64::NAN, |(_, t)| t.as_secs_f64());
    let mut answers = Vec::new();
    for _ in 0..HELD_REQUESTS {
        answers.push(held.request());
        thread::sleep(Duration::from_millis(200));
    }
    let report = traffic.finish(true);
    let events = bed.events_since(bed.baseline).expect("reading the events");
    let readings = bed.finish_readings(&start, &events);
    let ok = answers.iter().filter(|a| a.as_deref() == Ok("b2")).count();
    println!(
        "keepalive {label}: b2 out {:.2} s after its 500s; the held connection answered \
         {ok} of {HELD_REQUESTS} requests afterwards (first failure: {:?})\n  {}  {}\n  events:\n{}",
        out_at - failing,
        answers.iter().find(|a| a.is_err()),
        report.summary(),
        readings.line(),
        bed.describe_events(&events, failing)
    );

    assert!(
        before.iter().all(|a| a.as_deref() == Ok("b2")),
        "{label}: the held connection must work before b2 fails (nothing has happened yet): {}",
        ordinary::held_summary(&before, "b2")
    );
    if let Err(e) = went_out {
        panic!("{e}");
    }
    assert_eq!(
        ok,
        HELD_REQUESTS,
        "{label}: a working keep-alive connection to b2 must keep answering after b2's probe \
         fails; {ok} of {HELD_REQUESTS} answered, first failure: {:?}",
        answers.iter().find(|a| a.is_err())
    );
    let late = report.new_conns_to_since("b2", out_at + 0.05);
    assert!(
        late.is_empty(),
        "{label}: {} new connections reached b2 after it left the table",
        late.len()
    );
    assert_eq!(
        report.failures().count(),
        0,
        "{label}: every web service answered throughout; no request may fail:\n{}",
        report.summary()
    );
    let others: Vec<_> = events
        .iter()
        .filter(|e| e.server != "-" && e.server != b2.to_string())
        .collect();
    assert!(
        others.is_empty(),
        "{label}: only b2 may change state:\n{}",
        bed.describe_events(&events, failing)
    );
}

#[test]
fn keepalive_connection_survives_failed_probe_nat() {
    keepalive_survives(Forwarding::Nat, 169);
}

#[test]
fn keepalive_connection_survives_failed_probe_dsr() {
    keepalive_survives(Forwarding::Dsr, 170);
}
