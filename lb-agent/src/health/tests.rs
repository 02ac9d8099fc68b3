//! One test per rule of DESIGN.md §5, with explicit instants.

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::config::{ProbeConfig, ProbeKind, ProbeMode};
use crate::probe::ProbeOutcome;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn probe(name: &str, fails: u32, passes: u32) -> ProbeConfig {
    let mut p = ProbeConfig::new(name, ProbeKind::Http);
    p.fails = fails;
    p.passes = passes;
    p
}

fn essential(mut p: ProbeConfig) -> ProbeConfig {
    p.essential = true;
    p
}

fn persistent(mut p: ProbeConfig) -> ProbeConfig {
    p.persistent = true;
    p
}

fn ok() -> ProbeOutcome {
    ProbeOutcome::pass(Duration::from_millis(3), "status 200")
}

fn bad() -> ProbeOutcome {
    ProbeOutcome::fail(Duration::from_millis(2), "status 500")
}

const NO_PASSIVE: PassivePolicy = PassivePolicy {
    max_fails: 0,
    fail_timeout: Duration::from_secs(10),
};

fn passive(max_fails: u32) -> PassivePolicy {
    PassivePolicy {
        max_fails,
        fail_timeout: secs(10),
    }
}

/// A server whose probes have all passed (Up), built from `probes`.
fn up_server(probes: &[ProbeConfig], policy: PassivePolicy, t0: Instant) -> ServerHealth {
    let mut h = ServerHealth::new(probes, policy, StartState::New, t0);
    for _ in 0..probes.iter().map(|p| p.passes).max().unwrap_or(0) {
        for i in 0..probes.len() {
            h.on_probe(i, &ok(), t0);
        }
    }
    assert_eq!(h.state(), HealthState::Up, "setup: every probe passed");
    h
}

#[test]
fn essential_probe_gates_new_server() {
    let t0 = Instant::now();
    let probes = [essential(probe("health", 1, 2))];
    let mut h = ServerHealth::new(&probes, NO_PASSIVE, StartState::New, t0);
    assert_eq!(h.state(), HealthState::Checking);
    assert!(!h.usable(), "a checking server gets no traffic");
    assert_eq!(
        h.on_probe(0, &ok(), t0 + secs(1)),
        None,
        "one pass of two keeps it checking"
    );
    let tr = h
        .on_probe(0, &ok(), t0 + secs(2))
        .expect("second pass makes it up");
    assert_eq!((tr.from, tr.to), (HealthState::Checking, HealthState::Up));
    assert_eq!(tr.cause, "all essential probes passed");
    assert!(h.usable());
    assert_eq!(
        h.downtime(t0 + secs(5)),
        secs(2),
        "not usable while checking"
    );
    assert_eq!(h.downstart(), None);
}

#[test]
fn all_essential_probes_must_pass_before_up() {
    let t0 = Instant::now();
    let probes = [
        essential(probe("a", 1, 1)),
        essential(probe("b", 1, 1)),
        probe("c", 1, 1),
    ];
    let mut h = ServerHealth::new(&probes, NO_PASSIVE, StartState::New, t0);
    assert_eq!(h.on_probe(0, &ok(), t0), None);
    assert_eq!(h.state(), HealthState::Checking, "b has not passed yet");
    let tr = h
        .on_probe(1, &ok(), t0)
        .expect("both essential probes passed");
    assert_eq!(
        tr.to,
        HealthState::Up,
        "the non-essential probe does not gate"
    );
}

#[test]
fn failing_essential_probe_keeps_server_checking() {
    let t0 = Instant::now();
    let probes = [essential(probe("a", 2, 1))];
    let mut h = ServerHealth::new(&probes, NO_PASSIVE, StartState::New, t0);
    for i in 0..5 {
        assert_eq!(h.on_probe(0, &bad(), t0 + secs(i)), None);
    }
    assert_eq!(h.state(), HealthState::Checking);
    assert_eq!(h.downstart(), Some(t0), "checking counts as down time");
    assert_eq!(h.fails(), 5, "failed probes count");
}

#[test]
fn failed_non_essential_probe_makes_checked_server_unhealthy() {
    let t0 = Instant::now();
    let probes = [essential(probe("gate", 1, 1)), probe("deep", 1, 1)];
    let mut h = ServerHealth::new(&probes, NO_PASSIVE, StartState::New, t0);
    assert_eq!(h.on_probe(1, &bad(), t0), None, "still checking");
    let tr = h.on_probe(0, &ok(), t0).expect("essential passed");
    assert_eq!(tr.to, HealthState::Unhealthy);
    assert_eq!(
        tr.cause,
        "essential probes passed, but probe deep: 1 consecutive failure (status 500)"
    );
}

#[test]
fn no_essential_probe_starts_up() {
    let t0 = Instant::now();
    let h = ServerHealth::new(&[probe("health", 1, 1)], NO_PASSIVE, StartState::New, t0);
    assert_eq!(h.state(), HealthState::Up);
    let h = ServerHealth::new(&[], NO_PASSIVE, StartState::New, t0);
    assert_eq!(h.state(), HealthState::Up, "no probe at all");
}

#[test]
fn any_probe_reaching_fails_makes_unhealthy() {
    let t0 = Instant::now();
    let probes = [probe("health", 2, 1), probe("other", 5, 1)];
    let mut h = up_server(&probes, NO_PASSIVE, t0);
    assert_eq!(h.on_probe(0, &bad(), t0 + secs(1)), None, "1 of 2 failures");
    assert_eq!(h.state(), HealthState::Up);
    let tr = h
        .on_probe(0, &bad(), t0 + secs(2))
        .expect("2 of 2 failures");
    assert_eq!((tr.from, tr.to), (HealthState::Up, HealthState::Unhealthy));
    assert_eq!(
        tr.cause,
        "probe health: 2 consecutive failures (status 500)"
    );
    assert!(!h.usable());
    assert_eq!(h.downstart(), Some(t0 + secs(2)));
    assert_eq!(h.state_since(), t0 + secs(2));
}

#[test]
fn failures_must_be_consecutive() {
    let t0 = Instant::now();
    let probes = [probe("health", 2, 1)];
    let mut h = up_server(&probes, NO_PASSIVE, t0);
    for i in 0..10 {
        let outcome = if i % 2 == 0 { bad() } else { ok() };
        assert_eq!(
            h.on_probe(0, &outcome, t0 + secs(i)),
            None,
            "a pass between failures resets the run"
        );
    }
    assert_eq!(h.state(), HealthState::Up);
}

#[test]
fn all_probes_must_reach_passes_to_recover() {
    let t0 = Instant::now();
    let probes = [probe("a", 1, 2), probe("b", 1, 3)];
    let mut h = up_server(&probes, NO_PASSIVE, t0);
    h.on_probe(0, &bad(), t0 + secs(1)).expect("a failed");
    h.on_probe(1, &bad(), t0 + secs(1));
    assert_eq!(h.state(), HealthState::Unhealthy);
    // a reaches its 2 passes; b has 2 of 3.
    for i in 2..4 {
        assert_eq!(h.on_probe(0, &ok(), t0 + secs(i)), None);
        assert_eq!(
            h.on_probe(1, &ok(), t0 + secs(i)),
            None,
            "b has not reached 3 passes"
        );
    }
    assert_eq!(h.state(), HealthState::Unhealthy);
    let tr = h
        .on_probe(1, &ok(), t0 + secs(4))
        .expect("b reached 3 passes");
    assert_eq!((tr.from, tr.to), (HealthState::Unhealthy, HealthState::Up));
    assert_eq!(tr.cause, "all probes passed");
    assert_eq!(h.downtime(t0 + secs(100)), secs(3), "down from 1s to 4s");
    assert_eq!(h.downstart(), None);
}

#[test]
fn onfail_probe_must_pass_afresh_to_recover() {
    let t0 = Instant::now();
    let mut deep = probe("deep", 1, 2);
    deep.mode = ProbeMode::Onfail;
    let probes = [probe("basic", 1, 1), deep];
    let mut h = up_server(&probes, NO_PASSIVE, t0);
    h.on_probe(0, &bad(), t0 + secs(1)).expect("basic failed");
    assert_eq!(
        h.on_probe(0, &ok(), t0 + secs(2)),
        None,
        "deep's old passes are stale"
    );
    assert_eq!(
        h.on_probe(1, &ok(), t0 + secs(2)),
        None,
        "deep: 1 of 2 fresh passes"
    );
    let tr = h
        .on_probe(1, &ok(), t0 + secs(3))
        .expect("deep passed twice");
    assert_eq!(tr.to, HealthState::Up);
}

#[test]
fn persistent_probe_skipped_after_reload_for_up_server() {
    let t0 = Instant::now();
    let probes = [persistent(essential(probe("health", 1, 3)))];
    let h = ServerHealth::new(&probes, NO_PASSIVE, StartState::ReloadedWasUp, t0);
    assert_eq!(h.state(), HealthState::Up, "a server that was up stays up");
    let h = ServerHealth::new(&probes, NO_PASSIVE, StartState::New, t0);
    assert_eq!(
        h.state(),
        HealthState::Checking,
        "a new server is still checked"
    );
}

#[test]
fn non_persistent_essential_probe_gates_reloaded_server() {
    let t0 = Instant::now();
    let probes = [
        persistent(essential(probe("p", 1, 1))),
        essential(probe("e", 1, 1)),
    ];
    let mut h = ServerHealth::new(&probes, NO_PASSIVE, StartState::ReloadedWasUp, t0);
    assert_eq!(h.state(), HealthState::Checking);
    let tr = h
        .on_probe(1, &ok(), t0)
        .expect("only the non-persistent probe had to pass");
    assert_eq!(tr.to, HealthState::Up);
}

#[test]
fn reloaded_down_server_stays_unhealthy_until_all_probes_pass() {
    let t0 = Instant::now();
    let probes = [persistent(essential(probe("p", 1, 1))), probe("q", 1, 1)];
    let mut h = ServerHealth::new(&probes, NO_PASSIVE, StartState::ReloadedWasDown, t0);
    assert_eq!(
        h.state(),
        HealthState::Unhealthy,
        "persistent is not skipped for a down server"
    );
    assert_eq!(h.downstart(), Some(t0));
    assert_eq!(h.on_probe(0, &ok(), t0 + secs(1)), None);
    let tr = h
        .on_probe(1, &ok(), t0 + secs(1))
        .expect("all probes passed");
    assert_eq!(tr.to, HealthState::Up);
}

#[test]
fn passive_max_fails_within_fail_timeout_makes_unavailable() {
    let t0 = Instant::now();
    let mut h = up_server(&[], passive(3), t0);
    assert_eq!(h.on_passive_failure(t0), None);
    assert_eq!(h.on_passive_failure(t0 + secs(4)), None);
    let tr = h
        .on_passive_failure(t0 + secs(9))
        .expect("3 failures within 10s");
    assert_eq!(
        (tr.from, tr.to),
        (HealthState::Up, HealthState::Unavailable)
    );
    assert_eq!(tr.cause, "passive: 3 failures within 10s");
    assert!(!h.usable());
    assert_eq!(h.next_deadline(), Some(t0 + secs(19)));
    assert_eq!(h.fails(), 3);
}

#[test]
fn passive_failures_older_than_fail_timeout_do_not_count() {
    let t0 = Instant::now();
    let mut h = up_server(&[], passive(3), t0);
    for i in 0..10 {
        assert_eq!(
            h.on_passive_failure(t0 + secs(6 * i)),
            None,
            "never 3 within 10s"
        );
    }
    assert_eq!(h.state(), HealthState::Up);
}

#[test]
fn unavailable_ends_after_fail_timeout() {
    let t0 = Instant::now();
    let mut h = up_server(&[], passive(1), t0);
    h.on_passive_failure(t0).expect("max_fails = 1");
    assert_eq!(h.tick(t0 + secs(9)), None, "fail_timeout not over");
    assert_eq!(h.state(), HealthState::Unavailable);
    let tr = h.tick(t0 + secs(10)).expect("fail_timeout over");
    assert_eq!(
        (tr.from, tr.to),
        (HealthState::Unavailable, HealthState::Up)
    );
    assert_eq!(tr.cause, "passive: fail_timeout 10s elapsed");
    assert!(h.usable(), "client traffic tries it again");
    assert_eq!(h.downtime(t0 + secs(60)), secs(10));
    assert_eq!(h.next_deadline(), None);
}

#[test]
fn after_unavailable_the_passive_count_starts_afresh() {
    let t0 = Instant::now();
    let mut h = up_server(&[], passive(3), t0);
    for _ in 0..3 {
        h.on_passive_failure(t0);
    }
    h.tick(t0 + secs(10)).expect("back up");
    assert_eq!(
        h.on_passive_failure(t0 + secs(11)),
        None,
        "one spurious signal after the return must not eject it again"
    );
    assert_eq!(h.on_passive_failure(t0 + secs(12)), None, "2 of 3");
    let tr = h
        .on_passive_failure(t0 + secs(13))
        .expect("max_fails fresh failures eject it again");
    assert_eq!(tr.to, HealthState::Unavailable);
}

#[test]
fn passive_removal_with_probes_ends_only_when_every_probe_passed_afresh() {
    let t0 = Instant::now();
    // An always probe (passes 2) and an onfail one: both must confirm.
    let mut onfail = probe("confirm", 1, 1);
    onfail.mode = ProbeMode::Onfail;
    let probes = [probe("health", 1, 2), onfail];
    let mut h = up_server(&probes, passive(1), t0);
    h.on_passive_failure(t0).expect("max_fails = 1");
    assert_eq!(h.state(), HealthState::Unavailable);
    // The always probe passes twice before fail_timeout; the onfail one has not run.
    assert_eq!(h.on_probe(0, &ok(), t0 + secs(2)), None);
    assert_eq!(h.on_probe(0, &ok(), t0 + secs(4)), None);
    assert_eq!(
        h.tick(t0 + secs(10)),
        None,
        "fail_timeout over, but the onfail probe has not confirmed"
    );
    assert_eq!(h.state(), HealthState::Unavailable);
    assert_eq!(
        h.next_deadline(),
        None,
        "nothing time-driven left to wait for"
    );
    let tr = h
        .on_probe(1, &ok(), t0 + secs(11))
        .expect("every probe passed since the removal");
    assert_eq!(
        (tr.from, tr.to, tr.cause.as_str()),
        (
            HealthState::Unavailable,
            HealthState::Up,
            "passive: all probes passed after fail_timeout"
        )
    );
}

#[test]
fn passive_removal_confirmed_before_fail_timeout_ends_at_fail_timeout() {
    let t0 = Instant::now();
    let probes = [probe("health", 1, 1)];
    let mut h = up_server(&probes, passive(1), t0);
    h.on_passive_failure(t0).expect("max_fails = 1");
    assert_eq!(
        h.on_probe(0, &ok(), t0 + secs(1)),
        None,
        "fail_timeout is the shortest removal"
    );
    let tr = h
        .tick(t0 + secs(10))
        .expect("confirmed and fail_timeout over");
    assert_eq!(
        tr.cause,
        "passive: fail_timeout 10s elapsed and all probes passed"
    );
}

#[test]
fn a_probe_pass_from_before_the_passive_removal_does_not_confirm() {
    let t0 = Instant::now();
    let probes = [probe("health", 1, 1)];
    // The probe passed at t0 (up_server); the removal comes later.
    let mut h = up_server(&probes, passive(1), t0);
    h.on_passive_failure(t0 + secs(1)).expect("max_fails = 1");
    assert_eq!(h.tick(t0 + secs(11)), None, "no pass since the removal");
    assert_eq!(h.state(), HealthState::Unavailable);
}

#[test]
fn one_success_resets_passive_count() {
    let t0 = Instant::now();
    let mut h = up_server(&[], passive(3), t0);
    h.on_passive_failure(t0);
    h.on_passive_failure(t0 + secs(1));
    h.on_passive_success(t0 + secs(2));
    assert_eq!(
        h.on_passive_failure(t0 + secs(3)),
        None,
        "count restarted at 1"
    );
    assert_eq!(h.on_passive_failure(t0 + secs(4)), None, "2 of 3");
    assert!(h.on_passive_failure(t0 + secs(5)).is_some(), "3 of 3");

    // After an unavailable period the count is fresh too.
    h.tick(t0 + secs(15)).expect("back up");
    h.on_passive_success(t0 + secs(16));
    assert_eq!(h.on_passive_failure(t0 + secs(17)), None, "count restarted");
}

#[test]
fn max_fails_zero_disables_passive() {
    let t0 = Instant::now();
    let mut h = up_server(&[], passive(0), t0);
    for i in 0..100 {
        assert_eq!(h.on_passive_failure(t0 + Duration::from_millis(i)), None);
    }
    assert_eq!(h.state(), HealthState::Up);
    assert_eq!(h.fails(), 100, "still counted for the API");
}

#[test]
fn passive_does_not_apply_while_unhealthy_or_checking() {
    let t0 = Instant::now();
    let probes = [essential(probe("health", 1, 1))];
    let mut h = ServerHealth::new(&probes, passive(1), StartState::New, t0);
    assert_eq!(h.on_passive_failure(t0), None, "checking");
    assert_eq!(h.state(), HealthState::Checking);
    h.on_probe(0, &ok(), t0).expect("up");
    h.on_probe(0, &bad(), t0).expect("unhealthy");
    assert_eq!(h.on_passive_failure(t0), None, "unhealthy");
    assert_eq!(h.state(), HealthState::Unhealthy);
}

#[test]
fn max_fails_applies_again_after_recovery() {
    let t0 = Instant::now();
    let probes = [probe("health", 1, 1)];
    let mut h = up_server(&probes, passive(2), t0);
    h.on_passive_failure(t0);
    h.on_probe(0, &bad(), t0 + secs(1)).expect("unhealthy");
    h.on_probe(0, &ok(), t0 + secs(2)).expect("up");
    assert_eq!(
        h.on_passive_failure(t0 + secs(3)),
        None,
        "the count before unhealthy is gone"
    );
    assert!(
        h.on_passive_failure(t0 + secs(4)).is_some(),
        "2 fresh failures"
    );
}

#[test]
fn probe_failure_while_unavailable_makes_unhealthy() {
    let t0 = Instant::now();
    let probes = [probe("health", 1, 1)];
    let mut h = up_server(&probes, passive(1), t0);
    h.on_passive_failure(t0).expect("unavailable");
    let tr = h.on_probe(0, &bad(), t0 + secs(1)).expect("probe failed");
    assert_eq!(
        (tr.from, tr.to),
        (HealthState::Unavailable, HealthState::Unhealthy)
    );
    assert_eq!(
        h.tick(t0 + secs(30)),
        None,
        "fail_timeout no longer ends it"
    );
    assert_eq!(h.state(), HealthState::Unhealthy);
    assert_eq!(h.downstart(), Some(t0), "one down period");
}

#[test]
fn probe_stats_follow_results() {
    let t0 = Instant::now();
    let probes = [probe("health", 3, 1)];
    let mut h = up_server(&probes, NO_PASSIVE, t0);
    h.on_probe(0, &bad(), t0 + secs(5));
    h.on_probe(0, &bad(), t0 + secs(6));
    let s = h.probe_stats(0).unwrap();
    assert_eq!(s.count, 3);
    assert_eq!(s.fails, 2);
    assert_eq!(s.failures, 2);
    assert_eq!(s.last, Some(t0 + secs(6)));
    assert_eq!(s.last_result, Some(false));
    assert_eq!(s.last_detail, "status 500");
    assert_eq!(s.last_duration, Some(Duration::from_millis(2)));
    assert_eq!(h.probes().map(|(n, _)| n).collect::<Vec<_>>(), ["health"]);
    assert_eq!(h.on_probe(7, &bad(), t0), None, "unknown index ignored");
}

#[test]
fn a_local_fault_keeps_every_verdict_and_counter() {
    let t0 = Instant::now();
    let probes = [probe("health", 1, 1)];
    let mut h = up_server(&probes, NO_PASSIVE, t0);
    let emfile = ProbeOutcome::local_fault(
        Duration::ZERO,
        "local fault: out of file descriptors (EMFILE)",
    );
    for i in 0..5 {
        assert_eq!(h.on_probe(0, &emfile, t0 + secs(i)), None, "no transition");
    }
    assert_eq!(h.state(), HealthState::Up);
    let s = h.probe_stats(0).unwrap();
    assert_eq!(
        (s.count, s.fails, s.failures),
        (1, 0, 0),
        "not counted: {s:?}"
    );
    assert_eq!(s.local_faults, 5);
    assert_eq!(s.last_result, Some(true), "the last verdict stays");

    // Unhealthy stays unhealthy too: a local fault is no pass either.
    h.on_probe(0, &bad(), t0 + secs(10)).expect("unhealthy");
    assert_eq!(h.on_probe(0, &emfile, t0 + secs(11)), None);
    assert_eq!(h.state(), HealthState::Unhealthy);
    assert_eq!(h.probe_stats(0).unwrap().fails, 1);
}

#[test]
fn server_added_at_runtime_waits_for_every_probe_essential_or_not() {
    let t0 = Instant::now();
    let probes = [probe("plain", 1, 2), essential(probe("ready", 1, 1))];
    let mut h = ServerHealth::new(&probes, NO_PASSIVE, StartState::Added, t0);
    assert_eq!(
        h.state(),
        HealthState::Checking,
        "held back although only one probe is essential"
    );
    assert!(!h.usable());
    assert!(!h.was_up_before(), "it never had traffic to keep");
    assert_eq!(h.on_probe(1, &ok(), t0 + secs(1)), None, "ready passed");
    assert_eq!(
        h.on_probe(0, &ok(), t0 + secs(1)),
        None,
        "plain: 1 of 2 passes"
    );
    let tr = h
        .on_probe(0, &ok(), t0 + secs(2))
        .expect("every probe reached its passes");
    assert_eq!(tr.to, HealthState::Up);
    assert_eq!(tr.cause, "added at runtime: all probes passed");
}

#[test]
fn server_added_at_runtime_that_fails_a_plain_probe_never_gets_up() {
    let t0 = Instant::now();
    let mut h = ServerHealth::new(&[probe("plain", 2, 1)], NO_PASSIVE, StartState::Added, t0);
    for i in 1..=5 {
        assert_eq!(h.on_probe(0, &bad(), t0 + secs(i)), None);
        assert_eq!(h.state(), HealthState::Checking);
    }
}

#[test]
fn a_spare_at_start_waits_for_every_probe_essential_or_not() {
    let t0 = Instant::now();
    let probes = [probe("plain", 1, 1)];
    let mut h = ServerHealth::new(&probes, NO_PASSIVE, StartState::NewSpare, t0);
    assert_eq!(
        h.state(),
        HealthState::Checking,
        "no essential probe, still held back"
    );
    assert!(!h.was_up_before());
    let tr = h
        .on_probe(0, &ok(), t0 + secs(1))
        .expect("its probe passed");
    assert_eq!(
        (tr.to, tr.cause.as_str()),
        (HealthState::Up, "spare: all probes passed")
    );
    let h = ServerHealth::new(&[], NO_PASSIVE, StartState::NewSpare, t0);
    assert_eq!(h.state(), HealthState::Up, "without probes: up at once");
}

#[test]
fn server_added_at_runtime_without_probes_is_up_at_once() {
    let h = ServerHealth::new(&[], NO_PASSIVE, StartState::Added, Instant::now());
    assert_eq!(h.state(), HealthState::Up);
}

/// A passive ejection restored after a restart (`restore_unavailable`): with probes it
/// ends only at the end of what was left of `fail_timeout` **and** once every probe has
/// passed afresh, as the original would have; a server kept `up` by the restart (its
/// probes taken as passed) loses that.
#[test]
fn a_restored_ejection_ends_as_the_original_would() {
    let t0 = Instant::now();
    let probes = [essential(persistent(probe("health", 2, 2)))];
    let mut h = ServerHealth::new(&probes, passive(3), StartState::ReloadedWasUp, t0);
    assert_eq!(
        h.state(),
        HealthState::Up,
        "a restart keeps an up server up"
    );
    assert!(h.restore_unavailable(secs(4), t0));
    assert_eq!(h.state(), HealthState::Unavailable);
    assert!(!h.usable());
    assert!(!h.was_up_before(), "it holds no new flows");
    assert_eq!(h.unavailable_until(), Some(t0 + secs(4)));
    assert_eq!(h.next_deadline(), Some(t0 + secs(4)));
    h.on_probe(0, &ok(), t0 + secs(1));
    h.on_probe(0, &ok(), t0 + secs(2));
    assert_eq!(
        h.state(),
        HealthState::Unavailable,
        "probes alone do not end it"
    );
    let t = h.tick(t0 + secs(4)).expect("back at the end");
    assert_eq!((t.from, t.to), (HealthState::Unavailable, HealthState::Up));

    let mut off = ServerHealth::new(&probes, NO_PASSIVE, StartState::New, t0);
    assert!(!off.restore_unavailable(secs(4), t0), "passive checks off");
    let mut none = ServerHealth::new(&[], passive(3), StartState::New, t0);
    assert!(
        !none.restore_unavailable(Duration::ZERO, t0),
        "nothing left"
    );
    assert_eq!(none.state(), HealthState::Up);
}
