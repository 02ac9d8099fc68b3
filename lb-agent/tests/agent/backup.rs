//! DESIGN.md §6 backup levels through the whole agent: when every primary fails the
//! lowest usable backup level takes the table; `backup_switch` decides when it returns.
//! A start or a reload that checks servers again switches no level before the probes
//! reach their verdicts.

use std::net::SocketAddr;

use crate::util::{Harness, Verdict, sa, secs, servers, web};
use tokio::time::Instant;

/// Primaries .1 and .2, backup level 1 .11, level 2 .21; `extra` service lines.
fn config(extra: &str) -> String {
    with_probe(extra, "")
}

/// [`config`] whose tcp probe has the `probe` lines too.
fn with_probe(extra: &str, probe: &str) -> String {
    web(
        extra,
        &(servers(&[
            ("10.0.1.1:80", ""),
            ("10.0.1.2:80", ""),
            ("10.0.1.11:80", "backup = 1"),
            ("10.0.1.21:80", "backup = 2"),
        ]) + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n"
            + probe),
    )
}

fn primaries() -> [SocketAddr; 2] {
    [sa("10.0.1.1:80"), sa("10.0.1.2:80")]
}

fn b1() -> SocketAddr {
    sa("10.0.1.11:80")
}

fn b2() -> SocketAddr {
    sa("10.0.1.21:80")
}

async fn primaries_failed(extra: &str) -> Harness {
    let mut h = Harness::start(&config(extra)).await;
    h.run_for(secs(2)).await;
    for p in primaries() {
        h.set(p, Verdict::Refuse);
    }
    h.run_until(secs(5), |h| {
        h.service_status("web").active_backup_level == 1
    })
    .await
    .expect("backup level 1 must take over when every primary failed");
    h
}

#[tokio::test(start_paused = true)]
async fn backup_servers_take_no_slots_while_primaries_are_up() {
    let mut h = Harness::start(&config("")).await;
    h.run_for(secs(2)).await;
    for b in [b1(), b2()] {
        assert_eq!(h.slots("web", b), 0, "backup {b} takes no new flow");
        assert!(h.live("web", b), "a healthy backup server stays LIVE");
    }
    assert_eq!(h.service_status("web").active_backup_level, 0);
    assert_eq!(h.server_status("web", b2()).backup, 2);
}

#[tokio::test(start_paused = true)]
async fn all_primaries_failing_moves_the_table_to_backup_level_1() {
    let h = primaries_failed("").await;
    assert_eq!(
        h.slots("web", b1()),
        h.table("web").len(),
        "level 1 takes every slot"
    );
    assert_eq!(h.slots("web", b2()), 0, "level 2 is not needed");
    assert!(h.live("web", b2()));
    for p in primaries() {
        assert!(
            h.live("web", p) && !h.serving("web", p),
            "failed primary {p} takes no new flow but keeps its established ones"
        );
    }
    assert!(!h.service_status("web").fail_open);
}

#[tokio::test(start_paused = true)]
async fn primaries_returning_take_the_table_back_by_default() {
    let mut h = primaries_failed("").await;
    let [p1, _] = primaries();
    h.set(p1, Verdict::Pass);
    let took = h
        .run_until(secs(5), |h| h.slots("web", p1) > 0)
        .await
        .expect("by default every new flow tries the primaries first");
    assert!(
        took <= secs(1),
        "back on the primary's next pass, took {took:?}"
    );
    assert_eq!(h.slots("web", p1), h.table("web").len());
    assert_eq!(h.slots("web", b1()), 0, "level 1 stops taking new flows");
    assert!(h.live("web", b1()), "level 1 keeps its pinned flows");
    assert_eq!(h.service_status("web").active_backup_level, 0);
}

#[tokio::test(start_paused = true)]
async fn failing_backup_level_1_moves_to_level_2() {
    let mut h = primaries_failed("").await;
    h.set(b1(), Verdict::Refuse);
    h.run_until(secs(5), |h| {
        h.service_status("web").active_backup_level == 2
    })
    .await
    .expect("level 2 takes over when level 1 fails");
    assert_eq!(h.slots("web", b2()), h.table("web").len());
    assert!(h.live("web", b1()) && !h.serving("web", b1()));
}

#[tokio::test(start_paused = true)]
async fn permanent_backup_switch_stays_on_the_backup_level() {
    let mut h = primaries_failed("backup_switch = { permanent = true }").await;
    for p in primaries() {
        h.set(p, Verdict::Pass);
    }
    h.run_until(secs(5), |h| h.state("web", primaries()[0]) == "up")
        .await
        .expect("setup: the primary recovers");
    h.run_for(secs(60)).await;
    assert_eq!(
        h.service_status("web").active_backup_level,
        1,
        "permanent = true stays on level 1 after the primaries recover"
    );
    assert_eq!(h.slots("web", b1()), h.table("web").len());
    for p in primaries() {
        assert_eq!(h.slots("web", p), 0);
        assert!(h.live("web", p), "a recovered primary is LIVE (sticky)");
    }
}

#[tokio::test(start_paused = true)]
async fn timed_backup_switch_returns_at_the_next_try() {
    let mut h = primaries_failed("backup_switch = { permanent = \"30s\" }").await;
    let entered = Instant::now();
    for p in primaries() {
        h.set(p, Verdict::Pass);
    }
    h.run_until(secs(5), |h| h.state("web", primaries()[0]) == "up")
        .await
        .expect("setup: the primary recovers");
    let took = h
        .run_until(secs(60), |h| {
            h.service_status("web").active_backup_level == 0
        })
        .await
        .expect("the primaries must be tried again after 30s, even with no new verdict");
    let back = Instant::now() - entered;
    assert!(
        back >= secs(30) && back <= secs(31),
        "the return must happen at the 30s try after entering level 1, came after {back:?} \
         ({took:?} after the primaries recovered)"
    );
    assert!(h.slots("web", primaries()[0]) > 0);
    assert_eq!(h.slots("web", b1()), 0);
}

/// `config` with an essential probe whose verdicts take a while: a server that never
/// answers fails it only after three timeouts.
fn essential_config(extra: &str) -> String {
    with_probe(extra, "timeout = \"1s\"\nfails = 3\nessential = true\n")
}

/// The primaries answer only after the backup passed: the level must not have moved.
async fn primaries_late(h: &mut Harness) {
    h.run_until(secs(3), |h| h.state("web", b1()) == "up")
        .await
        .expect("the backup passes its probe");
    assert_eq!(
        h.service_status("web").active_backup_level,
        0,
        "the primaries' probes have not reached a verdict: no level switch"
    );
    for p in primaries() {
        h.set(p, Verdict::Pass);
    }
    h.run_until(secs(5), |h| {
        primaries().iter().all(|&p| h.serving("web", p))
    })
    .await
    .expect("the primaries pass and take new flows");
    h.run_for(secs(60)).await;
    assert_eq!(h.service_status("web").active_backup_level, 0);
    assert_eq!(h.slots("web", b1()), 0, "the backup takes no new flow");
}

#[tokio::test(start_paused = true)]
async fn a_start_does_not_switch_to_a_backup_whose_probe_passed_first() {
    for switch in ["{ permanent = true }", "{ permanent = \"1h\" }"] {
        let cfg = essential_config(&format!("backup_switch = {switch}"));
        let mut h = Harness::start(&cfg).await;
        // Before any probe ran: the first runs are spread over the interval.
        for p in primaries() {
            h.set(p, Verdict::Silent);
        }
        primaries_late(&mut h).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_reload_that_checks_again_does_not_switch_to_a_backup() {
    let mut h = Harness::start(&essential_config("")).await;
    h.run_until(secs(5), |h| {
        primaries().iter().all(|&p| h.serving("web", p))
    })
    .await
    .expect("setup: the primaries take new flows");
    for p in primaries() {
        h.set(p, Verdict::Silent);
    }
    h.reload(&essential_config("backup_switch = { permanent = true }"))
        .await;
    assert_eq!(h.state("web", primaries()[0]), "checking", "checked again");
    primaries_late(&mut h).await;
}
