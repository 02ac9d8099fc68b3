//! Ordinary traffic must not move health: four healthy backends serving HTTP
//! that close the connection first, three loops opening new connections one after the
//! other (25 ms apart, about 115 a second) from ephemeral ports, two keep-alive clients at 100 ms, the agent started as
//! operators start it with the default passive settings and one http probe. For 60 s,
//! in nat and in dsr: zero transitions, zero failed requests, every backend answering.
//!
//! The suite runs the nat soak for the whole 60 s (the mode with source ports and
//! `TIME_WAIT` at stake) and the dsr one for 20 s with the same checks; `cargo xtask
//! bench` runs the dsr soak for 60 s ([`DSR_SOAK_ENV`]).

use std::time::Duration;

use lb_tests::{
    net::topology::Forwarding,
    scenario::realistic::{Bed, Role},
    traffic::ordinary::{Ordinary, OrdinaryConfig},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// The soak's length: a minute of ordinary traffic.
const DURATION: Duration = Duration::from_secs(60);
/// The dsr soak's length in the suite: about 2,700 requests, as many checks.
const DSR_IN_SUITE: Duration = Duration::from_secs(20);
/// Whole seconds the dsr soak runs instead (`cargo xtask bench` sets 60).
const DSR_SOAK_ENV: &str = "LB_DSR_SOAK_SECS";

/// The dsr soak's length: [`DSR_SOAK_ENV`] if set, else [`DSR_IN_SUITE`].
fn dsr_soak() -> Duration {
    match std::env::var(DSR_SOAK_ENV) {
        Ok(secs) => Duration::from_secs(
            secs.parse()
                .unwrap_or_else(|_| panic!("{DSR_SOAK_ENV}={secs:?}: whole seconds")),
        ),
        Err(_) => DSR_IN_SUITE,
    }
}

fn ordinary_traffic(forwarding: Forwarding, subnet: u8, duration: Duration) {
    let label = forwarding.as_str();
    let bed = Bed::start(
        forwarding,
        subnet,
        &Role::primaries(4),
        std::path::Path::new(TESTSERVER),
    );
    let start = bed.start_readings();
    let cfg = OrdinaryConfig::new(bed.vip, duration);
    let report = Ordinary::start(&bed.topo.client().ns, &cfg).finish(false);
    let events = bed.events_since(bed.baseline).expect("reading the events");
    let readings = bed.finish_readings(&start, &events);
    println!(
        "ordinary {label}, {duration:?}: {}  {}\n  events since the baseline:\n{}",
        report.summary(),
        readings.line(),
        bed.describe_events(&events, bed.baseline)
    );

    assert!(
        events.is_empty(),
        "{label}: ordinary traffic to healthy backends must not change any state; events:\n{}",
        bed.describe_events(&events, bed.baseline)
    );
    assert_eq!(
        report.failures().count(),
        0,
        "{label}: no request to a healthy backend may fail:\n{}",
        report.summary()
    );
    let per = report.per_backend();
    for r in &bed.roles {
        assert!(
            per.get(r.name).copied().unwrap_or(0) > 0,
            "{label}: {} answered nothing: {per:?}",
            r.name
        );
    }
    assert!(
        report.requests.len() > 1000,
        "{label}: too little traffic to mean anything: {}",
        report.summary()
    );
}

#[test]
fn ordinary_traffic_moves_no_health_nat() {
    ordinary_traffic(Forwarding::Nat, 161, DURATION);
}

#[test]
fn ordinary_traffic_moves_no_health_dsr() {
    ordinary_traffic(Forwarding::Dsr, 162, dsr_soak());
}
