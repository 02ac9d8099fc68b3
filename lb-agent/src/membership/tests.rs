//! One test per rule of the module doc, under paused tokio time or explicit instants.

use std::{net::SocketAddr, time::Duration};

use tokio::time::{Instant, advance};

use super::*;

fn a(last: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 1, last], 80))
}

fn primary(last: u8, weight: u32) -> MemberInput {
    MemberInput {
        key: a(last),
        weight,
        spare: false,
        backup: 0,
        health: MemberHealth::Usable,
        admin: Admin::Up,
    }
}

fn spare(last: u8, weight: u32) -> MemberInput {
    MemberInput {
        spare: true,
        ..primary(last, weight)
    }
}

fn backup(last: u8, level: u32) -> MemberInput {
    MemberInput {
        backup: level,
        ..primary(last, 1)
    }
}

/// One service's inputs and membership, driven step by step.
struct Svc {
    m: ServiceMembership,
    servers: Vec<MemberInput>,
    policy: Policy,
}

impl Svc {
    fn new(servers: Vec<MemberInput>) -> Self {
        Svc {
            m: ServiceMembership::new(),
            servers,
            policy: Policy::default(),
        }
    }

    fn with(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    fn compute(&mut self) -> Outcome {
        self.compute_at(Instant::now())
    }

    fn compute_at(&mut self, now: Instant) -> Outcome {
        self.m.compute(&self.servers, &self.policy, now)
    }

    fn server(&mut self, last: u8) -> &mut MemberInput {
        self.servers
            .iter_mut()
            .find(|s| s.key == a(last))
            .expect("server in the test service")
    }

    fn fail(&mut self, last: u8) {
        self.fail_since(last, Instant::now());
    }

    fn fail_since(&mut self, last: u8, since: Instant) {
        self.server(last).health = MemberHealth::Unusable { since };
    }

    fn heal(&mut self, last: u8) {
        self.server(last).health = MemberHealth::Usable;
    }

    fn admin(&mut self, last: u8, admin: Admin) {
        self.server(last).admin = admin;
    }
}

/// Running spares, by address.
fn running(o: &Outcome) -> Vec<SocketAddr> {
    let mut r: Vec<SocketAddr> = o
        .spares
        .iter()
        .filter(|(_, s)| *s == SpareStatus::Running)
        .map(|&(k, _)| k)
        .collect();
    r.sort();
    r
}

fn role(o: &Outcome, last: u8) -> Role {
    o.role_of(a(last)).expect("server in the outcome")
}

#[track_caller]
fn assert_note(o: &Outcome, needle: &str) {
    assert!(
        o.changes.iter().any(|c| c.contains(needle)),
        "expected a change note containing {needle:?}, got {:?}",
        o.changes
    );
}

fn retry_after(d: Duration) -> Policy {
    Policy {
        backup_switch: BackupSwitch::RetryAfter(d),
        ..Policy::default()
    }
}

fn permanent() -> Policy {
    Policy {
        backup_switch: BackupSwitch::Permanent,
        ..Policy::default()
    }
}

fn capped(pct: u8) -> Policy {
    Policy {
        max_unhealthy_percent: pct,
        ..Policy::default()
    }
}

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
    assert_eq!(role(&o, 1), Role::Removed);
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
    assert_eq!(role(&o, 11), Role::Removed);
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
    assert_eq!(role(&o, 11), Role::Removed);
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
        Role::Removed,
        "an unhealthy retired spare loses its flows"
    );
}

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
    assert_eq!((role(&o, 1), role(&o, 21)), (Role::Removed, Role::Active));
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
    assert_eq!(role(&o, 32), Role::Removed);
    assert_eq!(
        role(&o, 41),
        Role::Sticky,
        "usable server of an inactive level"
    );
    assert_eq!(
        role(&o, 21),
        Role::Removed,
        "unusable server of an inactive level"
    );
    assert_eq!(role(&o, 10), Role::Removed);
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

// --- Removal cap --------------------------------------------------------------------

#[test]
fn removal_cap_four_at_fifty_percent_removes_two_and_keeps_the_most_recent() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut svc = Svc::new((1..=4).map(|i| primary(i, 1)).collect()).with(capped(50));
    // Server 1 failed last; 2 and 3 earlier: 2 and 3 go, 1 stays.
    svc.fail_since(2, t0);
    svc.fail_since(3, t0 + s(1));
    svc.fail_since(1, t0 + s(2));
    let o = svc.compute_at(t0 + s(3));
    assert_eq!(
        [role(&o, 1), role(&o, 2), role(&o, 3), role(&o, 4)],
        [Role::Active, Role::Removed, Role::Removed, Role::Active],
        "4 servers at 50%: at most 2 removed, the latest failure kept"
    );
    assert_eq!(o.held_by_cap, vec![a(1)]);
    assert_eq!(o.active_weight, 2, "a held server counts as usable");
    assert_note(
        &o,
        "removal cap: 3 of 4 servers of primary group unusable, at most 2 may be removed",
    );
    assert_note(&o, "10.0.1.1:80 kept in traffic");

    // One of the removed ones recovers: now only 2 unhealthy, both removed.
    svc.heal(2);
    let o = svc.compute_at(t0 + s(4));
    assert_eq!((role(&o, 1), role(&o, 3)), (Role::Removed, Role::Removed));
    assert!(o.held_by_cap.is_empty());
    assert_note(&o, "removal cap: 10.0.1.1:80 no longer held in traffic");
}

#[test]
fn removal_cap_rounds_down_and_counts_each_group_alone() {
    let t0 = Instant::now();
    let mut servers: Vec<MemberInput> = (1..=5).map(|i| primary(i, 1)).collect();
    servers.extend([backup(21, 1), backup(22, 1)]);
    let mut svc = Svc::new(servers).with(capped(50));
    for (i, last) in [1, 2, 3, 21].into_iter().enumerate() {
        svc.fail_since(last, t0 + Duration::from_secs(i as u64));
    }
    let o = svc.compute_at(t0 + Duration::from_secs(10));
    // Primary group: floor(5 × 50 / 100) = 2 removed, server 3 held.
    assert_eq!(o.held_by_cap, vec![a(3)]);
    // Level 1: floor(2 × 50 / 100) = 1: server 21 may be removed.
    assert_eq!(role(&o, 21), Role::Removed);
}

#[tokio::test(start_paused = true)]
async fn admin_down_is_removed_and_not_counted_by_the_cap() {
    let mut svc = Svc::new((1..=4).map(|i| primary(i, 1)).collect()).with(capped(50));
    svc.admin(1, Admin::Down);
    svc.admin(2, Admin::Down);
    svc.fail(3);
    let o = svc.compute();
    assert_eq!(
        (role(&o, 1), role(&o, 2)),
        (Role::Removed, Role::Removed),
        "down is honoured"
    );
    // n = 2 servers up, floor(2 × 50 / 100) = 1: the two downs did not use the budget.
    assert_eq!(role(&o, 3), Role::Removed);
    assert!(o.held_by_cap.is_empty(), "nothing held: {o:?}");

    // A second failure exceeds the budget of 1 (n = 2, not 4): the later one is held.
    advance(Duration::from_secs(1)).await;
    svc.fail(4);
    let o = svc.compute();
    assert_eq!(o.held_by_cap, vec![a(4)]);
    assert_eq!((role(&o, 3), role(&o, 4)), (Role::Removed, Role::Active));

    // With a cap of 0, health removes nothing, but down is still out.
    let o = svc.with(capped(0)).compute();
    assert_eq!([role(&o, 1), role(&o, 3)], [Role::Removed, Role::Active]);
}

// --- Admin --------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn drain_is_sticky_and_a_spare_covers_it() {
    let mut svc = Svc::new(vec![primary(1, 1), primary(2, 1), spare(10, 1)]);
    svc.admin(1, Admin::Drain);
    let o = svc.compute();
    assert_eq!(
        role(&o, 1),
        Role::Sticky,
        "drain: no new flows, pinned flows continue"
    );
    assert_eq!((o.main_weight, o.active_weight), (2, 1));
    assert_eq!(running(&o), vec![a(10)], "a spare covers a drained primary");

    svc.fail(1);
    let o = svc.compute();
    assert_eq!(
        role(&o, 1),
        Role::Removed,
        "a drained server that fails loses its flows"
    );
}

// --- Fail-open ----------------------------------------------------------------------

fn all_broken() -> Svc {
    let mut svc = Svc::new(vec![
        primary(1, 1),
        primary(2, 1),
        primary(3, 1),
        spare(10, 1),
        backup(21, 1),
    ]);
    for last in [1, 2, 10, 21] {
        svc.fail(last);
    }
    svc.admin(2, Admin::Drain);
    svc.admin(3, Admin::Down);
    svc
}

#[tokio::test(start_paused = true)]
async fn fail_open_spreads_over_every_server_not_down() {
    let mut svc = all_broken();
    let o = svc.compute();
    assert!(o.fail_open);
    assert_eq!(
        [
            role(&o, 1),
            role(&o, 2),
            role(&o, 3),
            role(&o, 10),
            role(&o, 21)
        ],
        [
            Role::Active,
            Role::Active,
            Role::Removed,
            Role::Active,
            Role::Active
        ],
    );
    assert_note(
        &o,
        "fail-open: every server unusable, spreading over all servers not down",
    );

    svc.heal(21);
    let o = svc.compute();
    assert!(!o.fail_open);
    assert_eq!(
        (o.active_backup_level, role(&o, 21), role(&o, 1)),
        (1, Role::Active, Role::Removed)
    );
    assert_note(&o, "fail-open ended: backup level 1 has a usable server");
}

#[tokio::test(start_paused = true)]
async fn fail_closed_leaves_nothing_active() {
    let mut svc = all_broken().with(Policy {
        fail_open: false,
        ..Policy::default()
    });
    let o = svc.compute();
    assert!(!o.fail_open);
    assert!(
        o.roles.iter().all(|&(_, r)| r != Role::Active),
        "fail_open = false: nothing may be Active: {:?}",
        o.roles
    );
    assert_note(
        &o,
        "no usable server: new flows are dropped (fail_open = false)",
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
