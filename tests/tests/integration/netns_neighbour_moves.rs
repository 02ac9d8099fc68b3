//! A backend's MAC moves under client traffic (one new connection every 20 ms), in nat and
//! in dsr: announced (a gratuitous ARP; IPv6: the kernel's unsolicited NA), no
//! connection fails that starts later than 1 s after the announcement; unannounced, none
//! fails later than the bound the lb's neighbour timing gives (`NeighTiming::silent_bound`).
//! Either way the moved backend answers again: lb writes its new MAC; a connection
//! established on it before an announced move keeps working after it.

use std::{path::Path, thread, time::Duration};

use lb_tests::{
    net::topology::Forwarding,
    scenario::neighbour_moves::{
        FOLLOW, FOLLOWS_LINE, Moves, NeighTiming, failed_after, last_failure, logged_after, probe,
        wait_answered,
    },
    traffic::{
        clients::EchoConn,
        pacer::{summary, wall_now},
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Traffic before the move.
const WARM_UP: Duration = Duration::from_secs(3);
/// Upper bound on one scenario's client traffic.
const TRAFFIC_LIMIT: Duration = Duration::from_secs(25);
/// The announced bound.
const ANNOUNCED: Duration = Duration::from_secs(1);
/// How long the moved backend gets to answer again after the bound (its probe may
/// have failed meanwhile: recovery is `passes × interval`, 1 s, plus scheduling).
const ANSWER_AGAIN: Duration = Duration::from_secs(5);
/// Traffic kept running after the moved backend answered again, to see no failure.
const SETTLE: Duration = Duration::from_secs(2);
/// Timing of the lb's neighbour table for the unannounced move.
const TIMING: NeighTiming = NeighTiming::FAST;

/// Moves b1 (announced or not), runs traffic, returns nothing: asserts the bound.
fn moved(forwarding: Forwarding, subnet: u8, v6: bool, announced: bool) {
    let label = format!(
        "{} {} {}",
        forwarding.as_str(),
        if v6 { "IPv6" } else { "IPv4" },
        if announced {
            "announced"
        } else {
            "unannounced"
        }
    );
    let timing = (!announced).then_some(TIMING);
    let bed = Moves::start(forwarding, subnet, v6, 3, timing, Path::new(TESTSERVER));
    let b1 = bed.addrs[0].ip();
    let bound = if announced {
        ANNOUNCED
    } else {
        TIMING.silent_bound(probe().interval)
    };
    if announced && v6 {
        bed.announce_on_change("b1");
    }
    // An established connection on b1 (announced moves): it must survive the move.
    let mut pinned = announced.then(|| pinned_to(&bed, "b1"));
    let pacer = bed.pacer(31_000, TRAFFIC_LIMIT);
    thread::sleep(WARM_UP);
    let before = bed.lb_neigh(b1);
    let new_mac = bed.moved_mac("b1");
    let log_from = bed.agent.process().cursor();
    let t0 = wall_now();
    bed.change_mac("b1", new_mac);
    // The announcement: the kernel's own NA (IPv6) goes out with the change; arping's
    // (IPv4) now.
    let announced_at = if v6 { t0 } else { wall_now() };
    let arping = (announced && !v6).then(|| bed.gratuitous_arp("b1"));
    // The agent logs the new MAC once the maps hold it.
    let followed = announced
        .then(|| {
            bed.agent
                .process()
                .wait_for_line(log_from, FOLLOWS_LINE, ANNOUNCED)
                .ok()
                .map(|line| (logged_after(&line, announced_at), line))
        })
        .flatten();
    if let Some(a) = arping {
        a.finish();
    }
    let deadline = t0 + bound.as_secs_f64();
    let back = wait_answered(&pacer, "b1", deadline, bound + ANSWER_AGAIN);
    let after_neigh = bed.lb_neigh(b1);
    if back {
        thread::sleep(SETTLE);
    }
    let attempts = pacer.finish();
    let late = failed_after(&attempts, deadline);
    assert!(
        back,
        "{label}: b1 (moved to {new_mac}) never answered again after {bound:?}; lb's kernel \
         entry before: {before:?}, after: {after_neigh:?}\n{}",
        summary(&attempts)
    );
    assert!(
        late.is_empty(),
        "{label}: {} connections failed later than {bound:?} after b1 moved to {new_mac} \
         (first at +{:.3} s: {}; last at +{:.3} s)\n{}",
        late.len(),
        late[0].start - t0,
        late[0].outcome,
        late.last().map_or(0.0, |a| a.start - t0),
        summary(&attempts)
    );
    if announced {
        let (took, line) = followed.clone().unwrap_or_else(|| {
            panic!("{label}: the agent did not hold b1's new MAC {new_mac} within {ANNOUNCED:?}")
        });
        assert!(
            line.contains(&b1.to_string()) && line.contains(&new_mac.to_string()),
            "{label}: the agent followed something else: {line}"
        );
        let took = took.unwrap_or_else(|| panic!("{label}: no timestamp in {line:?}"));
        assert!(
            took <= FOLLOW,
            "{label}: the agent held b1's new MAC {took:?} after the announcement was sent \
             (bound {FOLLOW:?}, counting from before the announcement's process started to \
             the agent's log line)"
        );
    }
    // How the agent saw it (the path the kernel took: straight to the new MAC, or
    // FAILED first; a MAC found by the agent's own retry is not logged).
    let seen: Vec<String> = bed.agent.process().lines()[log_from..]
        .iter()
        .filter(|l| !l.contains("GET /api"))
        .cloned()
        .collect();
    if let Some(conn) = pinned.as_mut() {
        conn.check_echo("after the move").unwrap_or_else(|e| {
            panic!("{label}: the connection established on b1 before the move broke: {e}")
        });
    }
    let answered_after = attempts
        .iter()
        .filter(|a| a.start >= deadline && a.answered_by("b1"))
        .count();
    eprintln!(
        "{label}: bound {bound:?} (agent's share {FOLLOW:?}); MAC in the agent {}; last \
         failure at {}; b1 answered {answered_after} connections after the bound; {}",
        followed
            .and_then(|(d, _)| d)
            .map_or("-".into(), |d| format!(
                "{:.1} ms after the announcement",
                d.as_secs_f64() * 1e3
            )),
        last_failure(&attempts, t0).map_or("none".into(), |s| format!("+{s:.3} s")),
        summary(&attempts)
    );
    eprintln!("{label}: agent: {}", seen.join(" | "));
}

/// A connection from the client that the balancer gave to `role` (new connections
/// until one lands there). A setup step, not what the scenario measures: one connect
/// that times out is retried, as any client retries, after printing what the balancer
/// held; a second one fails the test with the same.
fn pinned_to(bed: &Moves, role: &str) -> EchoConn {
    let client = bed.topo.client();
    let src = client.addr(bed.v6).expect("client address");
    let mut timed_out = 0;
    for _ in 0..64 {
        let conn = match EchoConn::connect(&client.ns, src, bed.vip)
            .expect("entering the client namespace")
        {
            Ok(conn) => conn,
            Err(e) if timed_out == 0 && e.kind() == std::io::ErrorKind::TimedOut => {
                timed_out += 1;
                eprintln!("a setup connection timed out ({e}); {}", held(bed));
                continue;
            }
            Err(e) => panic!("connecting through the balancer: {e}; {}", held(bed)),
        };
        if conn.backend() == role {
            return conn;
        }
    }
    panic!("no connection out of 64 went to {role}");
}

/// What the balancer holds for the servers: the agent's view and the lb's kernel's
/// neighbour entries.
fn held(bed: &Moves) -> String {
    let view = bed
        .api
        .request_ok("GET", "/api/v1/services/web", None)
        .unwrap_or_else(|e| format!("no service view: {e}"));
    let neigh: Vec<String> = bed.addrs.iter().map(|a| bed.lb_neigh(a.ip())).collect();
    format!("agent: {view}; lb's neighbours: {}", neigh.join(" | "))
}

#[test]
fn an_announced_move_nat_ipv4() {
    moved(Forwarding::Nat, 241, false, true);
}

#[test]
fn an_announced_move_dsr_ipv4() {
    moved(Forwarding::Dsr, 242, false, true);
}

#[test]
fn an_announced_move_nat_ipv6() {
    moved(Forwarding::Nat, 243, true, true);
}

#[test]
fn an_announced_move_dsr_ipv6() {
    moved(Forwarding::Dsr, 244, true, true);
}

#[test]
fn an_unannounced_move_nat_ipv4() {
    moved(Forwarding::Nat, 245, false, false);
}

#[test]
fn an_unannounced_move_dsr_ipv4() {
    moved(Forwarding::Dsr, 246, false, false);
}

#[test]
fn an_unannounced_move_nat_ipv6() {
    moved(Forwarding::Nat, 247, true, false);
}

#[test]
fn an_unannounced_move_dsr_ipv6() {
    moved(Forwarding::Dsr, 248, true, false);
}
