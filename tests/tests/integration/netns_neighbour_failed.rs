//! A backend stops answering at the link layer (its link goes down) under client
//! traffic, in nat and in dsr: the lb's kernel declares the neighbour FAILED and the
//! agent takes the server out of new flows within the bound of the lb's neighbour
//! timing, before its health check would (the probe needs ten failures); status shows
//! it `up` with no MAC and not active, and no connection fails that started after the
//! bound. The link comes back: the kernel resolves it again (REACHABLE) and the server
//! takes connections again.

use std::{
    path::Path,
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    net::topology::Forwarding,
    scenario::neighbour_moves::{Moves, NeighTiming, failed_after, probe, wait_answered},
    traffic::pacer::{summary, wall_now},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const WARM_UP: Duration = Duration::from_secs(3);
const TRAFFIC_LIMIT: Duration = Duration::from_secs(20);
/// How long b1 stays away after the agent took it out (status is read meanwhile).
const AWAY: Duration = Duration::from_millis(300);
/// Back: the next probe makes the kernel resolve it (a probe interval, the broadcast
/// solicitations, the agent's turn), or the agent's own retry (every 2 s) does.
const BACK: Duration = Duration::from_secs(3);

fn failed(forwarding: Forwarding, subnet: u8) {
    let label = forwarding.as_str();
    let timing = NeighTiming::FAST;
    let bed = Moves::start(
        forwarding,
        subnet,
        false,
        3,
        Some(timing),
        Path::new(TESTSERVER),
    );
    let b1 = bed.addrs[0];
    let bound = timing.silent_bound(probe().interval);
    let pacer = bed.pacer(34_000, TRAFFIC_LIMIT);
    thread::sleep(WARM_UP);
    let t0 = wall_now();
    let down_at = Instant::now();
    bed.set_link("b1", false);
    // Out of new flows, health untouched, no MAC.
    let mut out = None;
    while down_at.elapsed() < bound + Duration::from_secs(1) {
        if let Some((None, state, false)) = bed.server(b1) {
            out = Some((down_at.elapsed(), state));
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let (took, state) = out.unwrap_or_else(|| {
        panic!(
            "{label}: b1 still selectable {:?} after its link went down (bound {bound:?}); \
             lb's entry: {:?}; API: {:?}",
            down_at.elapsed(),
            bed.lb_neigh(b1.ip()),
            bed.server(b1)
        )
    });
    assert!(
        took <= bound,
        "{label}: b1 out of new flows {took:?} after its link went down (bound {bound:?})"
    );
    assert_eq!(
        state, "up",
        "{label}: the neighbour table, not the health check, took b1 out"
    );
    thread::sleep(AWAY);
    let t1 = wall_now();
    let up_at = Instant::now();
    bed.set_link("b1", true);
    let back = wait_answered(&pacer, "b1", t1, BACK);
    let back_in = up_at.elapsed();
    let attempts = pacer.finish();
    let late: Vec<_> = failed_after(&attempts, t0 + bound.as_secs_f64())
        .into_iter()
        .filter(|a| a.start < t1)
        .collect();
    assert!(
        late.is_empty(),
        "{label}: {} connections failed that started later than {bound:?} after b1's link \
         went down (first at +{:.3} s: {})\n{}",
        late.len(),
        late[0].start - t0,
        late[0].outcome,
        summary(&attempts)
    );
    assert!(
        back,
        "{label}: b1 answered nothing within {BACK:?} of its link coming back; lb's entry: \
         {:?}\n{}",
        bed.lb_neigh(b1.ip()),
        summary(&attempts)
    );
    eprintln!(
        "{label}: b1 out {:.3} s after its link went down (bound {bound:?}), answering \
         again {:.3} s after it came back; {}",
        took.as_secs_f64(),
        back_in.as_secs_f64(),
        summary(&attempts)
    );
}

#[test]
fn a_silent_backend_is_out_by_its_neighbour_entry_nat() {
    failed(Forwarding::Nat, 252);
}

#[test]
fn a_silent_backend_is_out_by_its_neighbour_entry_dsr() {
    failed(Forwarding::Dsr, 253);
}
