//! The removal cap, admin drain/down, fail-open and fail-closed.

use std::time::Duration;

use tokio::time::{Instant, advance};

use super::*;

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
        [Role::Active, Role::Sticky, Role::Sticky, Role::Active],
        "4 servers at 50%: at most 2 removed (sticky: their flows stay), the latest failure kept"
    );
    assert_eq!(o.held_by_cap, vec![a(1)]);
    assert_eq!(
        o.active_weight, 1,
        "a held server is in traffic but not healthy: it does not count"
    );
    assert_note(
        &o,
        "removal cap: 3 of 4 servers of primary group unusable, at most 2 may be removed",
    );
    assert_note(&o, "10.0.1.1:80 kept in traffic");

    // One of the removed ones recovers: now only 2 unhealthy, both removed.
    svc.heal(2);
    let o = svc.compute_at(t0 + s(4));
    assert_eq!((role(&o, 1), role(&o, 3)), (Role::Sticky, Role::Sticky));
    assert!(o.held_by_cap.is_empty());
    assert_note(&o, "removal cap: 10.0.1.1:80 no longer held in traffic");
}

#[test]
fn removal_cap_counts_the_servers_that_carry_traffic_not_idle_spares() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut servers: Vec<MemberInput> = (1..=4).map(|i| primary(i, 1)).collect();
    servers.push(spare(10, 1));
    let mut svc = Svc::new(servers).with(capped(50));
    // The idle spare fails first: it carried no traffic, so it uses up nothing.
    svc.fail_since(10, t0);
    svc.fail_since(1, t0 + s(1));
    svc.fail_since(2, t0 + s(2));
    let o = svc.compute_at(t0 + s(3));
    assert!(
        o.held_by_cap.is_empty(),
        "4 primaries at 50%: 2 may be removed whatever the spare: {:?}",
        o.held_by_cap
    );
    assert_eq!((role(&o, 1), role(&o, 2)), (Role::Sticky, Role::Sticky));
    svc.fail_since(3, t0 + s(4));
    let o = svc.compute_at(t0 + s(5));
    assert_eq!(o.held_by_cap, vec![a(3)], "the third failure is held");
    assert_note(
        &o,
        "removal cap: 3 of 4 servers of primary group unusable, at most 2 may be removed",
    );
}

#[test]
fn removal_cap_lets_a_running_spare_stand_in_for_a_removed_primary() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut svc = Svc::new(vec![primary(1, 2), primary(2, 1), spare(10, 3)]).with(capped(50));
    svc.fail_since(1, t0);
    svc.fail_since(2, t0 + s(1));
    let o = svc.compute_at(t0 + s(2));
    assert_eq!(
        running(&o),
        vec![a(10)],
        "the spare covers the missing weight 3"
    );
    assert!(
        o.held_by_cap.is_empty(),
        "the running spare stands in: both dead primaries removed, none held: {:?}",
        o.held_by_cap
    );
    assert_eq!(
        [role(&o, 1), role(&o, 2), role(&o, 10)],
        [Role::Sticky, Role::Sticky, Role::Active]
    );
    // Without a healthy spare, Azure's rule: every primary unusable, none removed.
    svc.fail_since(10, t0 + s(3));
    let o = svc.compute_at(t0 + s(4));
    assert_eq!(o.held_by_cap, vec![a(1), a(2)]);
}

#[test]
fn removal_cap_removes_none_when_every_server_of_the_group_is_unhealthy() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    for pct in [1, 50, 99] {
        let mut svc = Svc::new((1..=4).map(|i| primary(i, 1)).collect()).with(Policy {
            fail_open: false,
            ..capped(pct)
        });
        for i in 1..=3 {
            svc.fail_since(i, t0 + s(u64::from(i)));
        }
        let o = svc.compute_at(t0 + s(5));
        let removed = [1, 2, 3, 4]
            .iter()
            .filter(|&&i| role(&o, i) != Role::Active)
            .count();
        assert_eq!(
            removed,
            (3usize).min(4 * usize::from(pct) / 100),
            "{pct}%: 3 of 4 unhealthy, floor(4 × pct / 100) removed"
        );
        // The last one fails too: Azure removes none when every instance is unhealthy.
        svc.fail_since(4, t0 + s(6));
        let o = svc.compute_at(t0 + s(7));
        assert_eq!(
            [role(&o, 1), role(&o, 2), role(&o, 3), role(&o, 4)],
            [Role::Active; 4],
            "{pct}%: every server unhealthy, none removed"
        );
        assert_eq!(o.held_by_cap.len(), 4);
        assert_eq!(o.active_weight, 0, "held servers are not healthy");
        assert_note(
            &o,
            "removal cap: all 4 servers of primary group unusable, none is removed",
        );
        // One recovers: the cap's arithmetic applies again to the other three.
        svc.heal(1);
        let o = svc.compute_at(t0 + s(8));
        assert_eq!(role(&o, 1), Role::Active);
        assert_eq!(
            [2, 3, 4]
                .iter()
                .filter(|&&i| role(&o, i) == Role::Active)
                .count(),
            3 - (3usize).min(4 * usize::from(pct) / 100),
            "{pct}%: back to floor(4 × pct / 100) removed"
        );
    }
    // Without a cap (100 %) every unhealthy server is removed; fail_open decides.
    let mut svc = Svc::new((1..=4).map(|i| primary(i, 1)).collect()).with(Policy {
        fail_open: false,
        ..capped(100)
    });
    for i in 1..=4 {
        svc.fail_since(i, t0 + s(u64::from(i)));
    }
    let o = svc.compute_at(t0 + s(5));
    assert!(o.held_by_cap.is_empty());
    assert!((1..=4).all(|i| role(&o, i) == Role::Sticky));
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
    assert_eq!(role(&o, 21), Role::Sticky);
}

#[tokio::test(start_paused = true)]
async fn admin_down_is_removed_and_not_counted_by_the_cap() {
    let mut svc = Svc::new((1..=5).map(|i| primary(i, 1)).collect()).with(capped(50));
    svc.admin(1, Admin::Down);
    svc.admin(2, Admin::Down);
    svc.fail(3);
    let o = svc.compute();
    assert_eq!(
        (role(&o, 1), role(&o, 2)),
        (Role::Removed, Role::Removed),
        "down is honoured"
    );
    // n = 3 servers up, floor(3 × 50 / 100) = 1: the two downs did not use the budget.
    assert_eq!(role(&o, 3), Role::Sticky);
    assert!(o.held_by_cap.is_empty(), "nothing held: {o:?}");

    // A second failure exceeds the budget of 1 (n = 3, not 5): the later one is held.
    advance(Duration::from_secs(1)).await;
    svc.fail(4);
    let o = svc.compute();
    assert_eq!(o.held_by_cap, vec![a(4)]);
    assert_eq!((role(&o, 3), role(&o, 4)), (Role::Sticky, Role::Active));

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
        Role::Sticky,
        "a drained server that fails keeps its established flows"
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
    assert_note(&o, "fail-open tier 2: no healthy or suspect server left");

    svc.heal(21);
    let o = svc.compute();
    assert!(!o.fail_open);
    assert_eq!(
        (o.active_backup_level, role(&o, 21), role(&o, 1)),
        (1, Role::Active, Role::Sticky)
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
        "no healthy server: new flows are dropped (fail_open = false)",
    );
}
