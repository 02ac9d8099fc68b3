//! Backup levels under each `backup_switch`.

use std::time::Duration;

use tokio::time::{Instant, advance};

use super::*;

// --- Backup levels ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn default_backup_switch_returns_to_primaries_at_once() {
    let mut svc = Svc::new(vec![primary(1, 1), backup(21, 1)]);
    let o = svc.compute();
    assert_eq!(o.active_backup_level, 0);
    assert_eq!(
        role(&o, 21),
        Role::Sticky,
        "a usable server of an inactive level"
    );

    svc.fail(1);
    let o = svc.compute();
    assert_eq!(o.active_backup_level, 1);
    assert_eq!((role(&o, 1), role(&o, 21)), (Role::Sticky, Role::Active));
    assert_note(
        &o,
        "backup level 1 active: primary group has no usable server",
    );
    assert_eq!(o.recheck_at, None);

    advance(Duration::from_millis(1)).await;
    svc.heal(1);
    let o = svc.compute();
    assert_eq!(
        o.active_backup_level, 0,
        "back to the primaries as soon as one is usable"
    );
    assert_eq!((role(&o, 1), role(&o, 21)), (Role::Active, Role::Sticky));
    assert_note(&o, "primary group active again");
}

#[tokio::test(start_paused = true)]
async fn lowest_usable_backup_level_takes_over_and_inactive_levels_are_sticky_or_removed() {
    let mut svc = Svc::new(vec![
        primary(1, 1),
        spare(10, 1),
        backup(21, 1),
        backup(31, 3),
        backup(32, 3),
        backup(41, 4),
    ]);
    svc.fail(1);
    svc.fail(10);
    svc.fail(21);
    svc.fail(32);
    let o = svc.compute();
    assert_eq!(
        o.active_backup_level, 3,
        "level 1 has no usable server, level 2 none at all"
    );
    assert_eq!(role(&o, 31), Role::Active);
    assert_eq!(role(&o, 32), Role::Sticky);
    assert_eq!(
        role(&o, 41),
        Role::Sticky,
        "usable server of an inactive level"
    );
    assert_eq!(
        role(&o, 21),
        Role::Sticky,
        "unusable server of an inactive level keeps its established flows"
    );
    assert_eq!(role(&o, 10), Role::Sticky);
    assert!(!o.fail_open);
}

#[tokio::test(start_paused = true)]
async fn retry_after_returns_to_primaries_at_most_every_d() {
    let d = Duration::from_secs(120);
    let mut svc = Svc::new(vec![primary(1, 1), backup(21, 1)]).with(retry_after(d));
    let t0 = Instant::now();
    svc.fail(1);
    let o = svc.compute();
    assert_eq!(o.active_backup_level, 1);
    assert_eq!(
        o.recheck_at,
        Some(t0 + d),
        "the caller must be told when to try again"
    );

    advance(Duration::from_secs(10)).await;
    svc.heal(1);
    let o = svc.compute();
    assert_eq!(
        o.active_backup_level, 1,
        "primaries usable after 10s: too early to return"
    );
    assert_eq!(role(&o, 1), Role::Sticky);
    assert_note(
        &o,
        "primary group usable again; backup level 1 stays active",
    );

    let o = svc.compute_at(t0 + d - Duration::from_millis(1));
    assert_eq!(o.active_backup_level, 1, "1 ms before d has passed");
    let o = svc.compute_at(t0 + d);
    assert_eq!(
        o.active_backup_level, 0,
        "d has passed: back to the primaries"
    );
    assert_eq!(o.recheck_at, None);
    assert_note(
        &o,
        "primary group active again: it has a usable server at the retry after 120s",
    );

    // A try that finds the primaries still down restarts the wait.
    let t1 = t0 + d + Duration::from_secs(1);
    svc.fail_since(1, t1);
    assert_eq!(svc.compute_at(t1).active_backup_level, 1);
    let o = svc.compute_at(t1 + d);
    assert_eq!(o.active_backup_level, 1);
    assert_eq!(
        o.recheck_at,
        Some(t1 + d + d),
        "a failed try must restart the wait"
    );
    svc.heal(1);
    let o = svc.compute_at(t1 + d + Duration::from_secs(10));
    assert_eq!(o.active_backup_level, 1, "only 10s after the last try");
    let o = svc.compute_at(t1 + d + d);
    assert_eq!(o.active_backup_level, 0);
}

#[tokio::test(start_paused = true)]
async fn retry_after_leaves_a_failed_backup_level_at_once() {
    let d = Duration::from_secs(120);
    let mut svc = Svc::new(vec![primary(1, 1), backup(21, 1)]).with(retry_after(d));
    svc.fail(1);
    assert_eq!(svc.compute().active_backup_level, 1);
    advance(Duration::from_secs(5)).await;
    svc.heal(1);
    svc.fail(21);
    let o = svc.compute();
    assert_eq!(
        o.active_backup_level, 0,
        "the active level failed: no waiting"
    );
    assert_note(
        &o,
        "primary group active again: backup level 1 has no usable server",
    );
}

#[tokio::test(start_paused = true)]
async fn permanent_stays_on_backup_after_primaries_recover() {
    let mut svc = Svc::new(vec![
        primary(1, 1),
        primary(2, 1),
        spare(10, 1),
        backup(21, 1),
        backup(31, 2),
    ])
    .with(permanent());
    svc.fail(1);
    svc.fail(2);
    svc.fail(10);
    assert_eq!(svc.compute().active_backup_level, 1);

    advance(Duration::from_secs(3600)).await;
    svc.heal(1);
    svc.heal(10);
    let o = svc.compute();
    assert_eq!(
        o.active_backup_level, 1,
        "permanent: stay although the primaries recovered"
    );
    assert_eq!(o.recheck_at, None);
    assert_eq!((role(&o, 1), role(&o, 21)), (Role::Sticky, Role::Active));
    assert_eq!(
        o.spare_num, 0,
        "spares run only while the primary group is active"
    );
    assert_eq!(role(&o, 10), Role::Sticky);
    assert_note(
        &o,
        "primary group usable again; backup level 1 stays active (backup_switch permanent)",
    );
}

#[tokio::test(start_paused = true)]
async fn permanent_moves_to_next_level_when_active_level_fails() {
    let mut svc = Svc::new(vec![primary(1, 1), backup(21, 1), backup(31, 2)]).with(permanent());
    svc.fail(1);
    assert_eq!(svc.compute().active_backup_level, 1);
    svc.heal(1);
    svc.fail(21);
    let o = svc.compute();
    assert_eq!(
        o.active_backup_level, 2,
        "the next level up, not back to the primaries"
    );
    assert_eq!(role(&o, 31), Role::Active);
    assert_eq!(role(&o, 1), Role::Sticky);
    assert_note(
        &o,
        "backup level 2 active: backup level 1 has no usable server",
    );
}

#[tokio::test(start_paused = true)]
async fn permanent_wraps_to_primaries_from_highest_level() {
    let mut svc = Svc::new(vec![primary(1, 1), backup(21, 1), backup(31, 2)]).with(permanent());
    svc.fail(1);
    svc.fail(21);
    assert_eq!(svc.compute().active_backup_level, 2);
    svc.heal(1);
    svc.heal(21);
    assert_eq!(
        svc.compute().active_backup_level,
        2,
        "level 2 still usable: stay"
    );
    svc.fail(31);
    let o = svc.compute();
    assert_eq!(
        o.active_backup_level, 0,
        "from the highest level back to the primaries, not level 1"
    );
    assert_eq!((role(&o, 1), role(&o, 21)), (Role::Active, Role::Sticky));
    assert_note(
        &o,
        "primary group active again: backup level 2 has no usable server",
    );
}

#[tokio::test(start_paused = true)]
async fn a_level_whose_probes_have_not_run_is_not_left() {
    for policy in [
        Policy::default(),
        permanent(),
        retry_after(Duration::from_secs(30)),
    ] {
        // At start: every server `checking`, the backup's probe passes first.
        let mut svc = Svc::new(vec![primary(1, 1), primary(2, 1), backup(21, 1)]).with(policy);
        svc.pending(1, false);
        svc.pending(2, false);
        let o = svc.compute();
        assert_eq!(
            o.active_backup_level, 0,
            "{policy:?}: the primaries' probes have not run: no switch"
        );
        assert_eq!(role(&o, 21), Role::Sticky);
        svc.heal(1);
        svc.pending(2, false);
        let o = svc.compute();
        assert_eq!(o.active_backup_level, 0, "{policy:?}");
        assert_eq!(role(&o, 1), Role::Active);

        // A reload checks the servers again: the same.
        svc.pending(1, true);
        svc.pending(2, true);
        let o = svc.compute();
        assert_eq!(o.active_backup_level, 0, "{policy:?}: reload, no switch");
        assert_eq!((role(&o, 1), role(&o, 21)), (Role::Sticky, Role::Sticky));
        assert!(o.changes.is_empty(), "{policy:?}: {:?}", o.changes);

        // The primaries' verdicts come: failed. Now the backup level takes over.
        svc.checking(1, true);
        svc.checking(2, true);
        let o = svc.compute();
        assert_eq!(o.active_backup_level, 1, "{policy:?}: verdicts reached");
        assert_note(
            &o,
            "backup level 1 active: primary group has no usable server",
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_backup_level_whose_probes_have_not_run_is_not_left_for_the_primaries() {
    let mut svc = Svc::new(vec![primary(1, 1), backup(21, 1)]).with(permanent());
    svc.fail(1);
    assert_eq!(svc.compute().active_backup_level, 1);
    // A reload: both `checking` again, the primary's probe passes first.
    svc.heal(1);
    svc.pending(21, true);
    let o = svc.compute();
    assert_eq!(
        o.active_backup_level, 1,
        "permanent: the backup level's probes have not run: stay"
    );
    svc.heal(21);
    assert_eq!(svc.compute().active_backup_level, 1);
}
