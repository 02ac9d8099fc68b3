//! Spares: which run, in which order, and their roles; the weights and counters they drive.

use std::time::Duration;

use tokio::time::advance;

use super::*;

// --- Spares -------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn spare_with_largest_weight_runs_first_on_one_failure() {
    // The lighter spare has the lower address: weight, not address, must decide.
    let mut svc = Svc::new(vec![
        primary(1, 1),
        primary(2, 1),
        spare(10, 1),
        spare(11, 2),
    ]);
    let o = svc.compute();
    assert!(
        running(&o).is_empty(),
        "no spare runs while primaries are whole: {o:?}"
    );
    assert_eq!(
        (role(&o, 10), role(&o, 11)),
        (Role::Sticky, Role::Sticky),
        "idle spares"
    );

    svc.fail(1);
    let o = svc.compute();
    assert_eq!(
        running(&o),
        vec![a(11)],
        "the weight-2 spare must run first"
    );
    assert_eq!(role(&o, 11), Role::Active);
    assert_eq!(
        role(&o, 10),
        Role::Sticky,
        "an idle spare takes no new flows"
    );
    assert_eq!(role(&o, 1), Role::Sticky);
    assert_note(
        &o,
        "spare 10.0.1.11:80 running (weight 2): spares cover 1 of 1 missing weight",
    );
}

#[tokio::test(start_paused = true)]
async fn spares_join_largest_first_as_primaries_fail_one_by_one() {
    let servers = vec![
        primary(1, 1),
        primary(2, 1),
        primary(3, 1),
        primary(4, 1),
        spare(10, 1),
        spare(11, 2),
        spare(12, 3),
    ];
    let mut svc = Svc::new(servers.clone());
    svc.compute();
    let expected = [vec![a(12)], vec![a(12)], vec![a(12)], vec![a(11), a(12)]];
    for (i, want) in expected.iter().enumerate() {
        svc.fail(i as u8 + 1);
        let o = svc.compute();
        assert_eq!(&running(&o), want, "after {} primaries failed", i + 1);
    }

    // The same four failures at once: the same spares, largest first.
    let mut svc = Svc::new(servers);
    svc.compute();
    for last in 1..=4 {
        svc.fail(last);
    }
    let o = svc.compute();
    assert_eq!(running(&o), vec![a(11), a(12)]);
    let started: Vec<&String> = o.changes.iter().filter(|c| c.contains("running")).collect();
    assert!(
        started[0].contains("10.0.1.12:80") && started[1].contains("10.0.1.11:80"),
        "notes must list the weight-3 spare before the weight-2 one: {started:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn spares_retire_smallest_weight_first_on_recovery() {
    // The lighter spare has the lower address: weight, not address, must decide.
    let mut svc = Svc::new(vec![
        primary(1, 2),
        primary(2, 1),
        spare(10, 1),
        spare(11, 2),
    ]);
    svc.compute();
    svc.fail(1);
    svc.fail(2);
    let o = svc.compute();
    assert_eq!(
        running(&o),
        vec![a(10), a(11)],
        "deficit 3 needs both spares"
    );

    svc.heal(1);
    let o = svc.compute();
    assert_eq!(
        running(&o),
        vec![a(11)],
        "deficit 1: the weight-1 spare retires first"
    );
    assert_eq!(
        role(&o, 10),
        Role::Sticky,
        "a retired healthy spare keeps its flows"
    );
    assert_note(
        &o,
        "spare 10.0.1.10:80 idle: no longer needed (missing weight 1)",
    );

    svc.heal(2);
    let o = svc.compute();
    assert!(running(&o).is_empty(), "no deficit, no spare: {o:?}");
    assert_note(&o, "spare 10.0.1.11:80 idle");
}

#[tokio::test(start_paused = true)]
async fn fewest_spares_cover_the_deficit() {
    let mut svc = Svc::new(vec![
        primary(1, 3),
        primary(2, 3),
        spare(10, 1),
        spare(11, 1),
        spare(12, 1),
        spare(13, 3),
    ]);
    svc.fail(1);
    let o = svc.compute();
    assert_eq!(
        running(&o),
        vec![a(13)],
        "one weight-3 spare covers a deficit of 3"
    );
    assert_eq!(o.spare_num, 1);

    // A deficit of 4: the weight-3 spare plus one weight-1 spare, not four spares.
    svc.server(1).weight = 4;
    let o = svc.compute();
    assert_eq!(o.main_weight, 7);
    assert_eq!(running(&o), vec![a(10), a(13)]);
}

#[tokio::test(start_paused = true)]
async fn equal_weight_spares_lower_address_joins_first_and_retires_last() {
    // Input order is the reverse of address order: the address must decide.
    let mut svc = Svc::new(vec![
        primary(1, 1),
        primary(2, 1),
        spare(12, 1),
        spare(11, 1),
    ]);
    svc.fail(1);
    let o = svc.compute();
    assert_eq!(running(&o), vec![a(11)]);
    svc.fail(2);
    let o = svc.compute();
    assert_eq!(running(&o), vec![a(11), a(12)]);
    svc.heal(1);
    let o = svc.compute();
    assert_eq!(running(&o), vec![a(11)], "the higher address retires first");
}

#[tokio::test(start_paused = true)]
async fn unhealthy_spare_never_runs() {
    let mut svc = Svc::new(vec![primary(1, 2), spare(10, 1), spare(11, 2)]);
    svc.fail(11);
    svc.fail(1);
    let o = svc.compute();
    assert_eq!(
        running(&o),
        vec![a(10)],
        "the unhealthy weight-2 spare must be skipped"
    );
    assert_eq!(role(&o, 11), Role::Sticky);
    assert_eq!(o.spare_status(a(11)), Some(SpareStatus::Idle));
    assert_note(&o, "spares cover 1 of 2 missing weight");

    // Healthy again: it joins, and the weight-1 spare is no longer needed.
    svc.heal(11);
    let o = svc.compute();
    assert_eq!(running(&o), vec![a(11)]);

    // A running spare that fails stops at once.
    svc.fail(11);
    let o = svc.compute();
    assert_eq!(running(&o), vec![a(10)]);
    assert_eq!(role(&o, 11), Role::Sticky);
    assert_note(&o, "spare 10.0.1.11:80 idle: unusable");
}

#[tokio::test(start_paused = true)]
async fn retired_spare_is_sticky_while_healthy() {
    let mut svc = Svc::new(vec![primary(1, 1), spare(10, 1)]);
    svc.fail(1);
    let o = svc.compute();
    assert_eq!(role(&o, 10), Role::Active);
    svc.heal(1);
    let o = svc.compute();
    assert_eq!(o.spare_status(a(10)), Some(SpareStatus::Idle));
    assert_eq!(
        role(&o, 10),
        Role::Sticky,
        "flows pinned to a retired spare must stay"
    );
    svc.fail(10);
    let o = svc.compute();
    assert_eq!(
        role(&o, 10),
        Role::Sticky,
        "an unhealthy retired spare keeps its established flows"
    );
}

// --- Metrics and notes --------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn weights_and_counters_follow_the_primary_group() {
    let mut svc = Svc::new(vec![
        primary(1, 3),
        primary(2, 2),
        spare(10, 2),
        spare(11, 1),
        MemberInput {
            weight: 5,
            ..backup(21, 1)
        },
    ]);
    let o = svc.compute();
    assert_eq!(
        (
            o.main_weight,
            o.active_weight,
            o.spare_num,
            o.active_backup_level
        ),
        (5, 5, 0, 0)
    );

    svc.fail(2);
    let o = svc.compute();
    assert_eq!(
        (
            o.main_weight,
            o.active_weight,
            o.spare_num,
            o.active_backup_level
        ),
        (5, 3, 1, 0)
    );

    svc.fail(1);
    let o = svc.compute();
    assert_eq!(
        (
            o.main_weight,
            o.active_weight,
            o.spare_num,
            o.active_backup_level
        ),
        (5, 0, 2, 0)
    );

    svc.fail(10);
    svc.fail(11);
    let o = svc.compute();
    assert_eq!(
        (
            o.main_weight,
            o.active_weight,
            o.spare_num,
            o.active_backup_level
        ),
        (5, 0, 0, 1)
    );
    assert!(!o.fail_open);
}

#[tokio::test(start_paused = true)]
async fn an_unchanged_computation_adds_no_notes() {
    let mut svc = Svc::new(vec![
        primary(1, 1),
        primary(2, 1),
        spare(10, 1),
        backup(21, 1),
    ])
    .with(capped(50));
    svc.fail(1);
    svc.fail(2);
    let first = svc.compute();
    assert!(
        !first.changes.is_empty(),
        "the first computation has transitions to report"
    );
    advance(Duration::from_secs(1)).await;
    let again = svc.compute();
    assert!(
        again.changes.is_empty(),
        "nothing changed, yet: {:?}",
        again.changes
    );
    assert_eq!(again.roles, first.roles);
}
