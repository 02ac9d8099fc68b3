//! The removal cap, backup levels and fail-open tiers together: one test per row of the
//! table in the module doc and docs/membership.md ("Cap, backup levels and fail-open").

use std::time::Duration;

use tokio::time::Instant;

use super::*;

/// Four primaries and, with `with_backup`, one backup server; `pct` cap, `fail_open`.
fn group(with_backup: bool, pct: u8, fail_open: bool) -> Svc {
    let mut servers: Vec<MemberInput> = (1..=4).map(|i| primary(i, 1)).collect();
    if with_backup {
        servers.push(backup(21, 1));
    }
    Svc::new(servers).with(Policy {
        max_unhealthy_percent: pct,
        fail_open,
        ..Policy::default()
    })
}

/// Fails `lasts` in that order, one second apart from `t0` (later = more recent).
fn fail_in_order(svc: &mut Svc, t0: Instant, lasts: &[u8]) {
    for (i, &last) in lasts.iter().enumerate() {
        svc.fail_since(last, t0 + Duration::from_secs(i as u64));
    }
}

fn roles(o: &Outcome, lasts: &[u8]) -> Vec<Role> {
    lasts.iter().map(|&l| role(o, l)).collect()
}

#[test]
fn row1_cap_holds_inside_a_group_that_still_has_a_healthy_server() {
    let t0 = Instant::now();
    let mut svc = group(true, 50, true);
    fail_in_order(&mut svc, t0, &[1, 2, 3]);
    let o = svc.compute_at(t0 + Duration::from_secs(10));
    assert_eq!(
        o.active_backup_level, 0,
        "server 4 is healthy: primaries stay"
    );
    assert_eq!(o.held_by_cap, vec![a(3)]);
    assert_eq!(
        roles(&o, &[1, 2, 3, 4, 21]),
        [
            Role::Sticky,
            Role::Sticky,
            Role::Active,
            Role::Active,
            Role::Sticky
        ],
        "removed failures keep their flows, the held one and the healthy one serve"
    );
    assert!(!o.fail_open);
}

#[test]
fn row2_servers_held_by_the_cap_do_not_keep_a_healthy_backup_level_out() {
    let t0 = Instant::now();
    let mut svc = group(true, 50, true);
    fail_in_order(&mut svc, t0, &[1, 2, 3, 4]);
    let o = svc.compute_at(t0 + Duration::from_secs(10));
    assert_eq!(
        o.held_by_cap,
        vec![a(1), a(2), a(3), a(4)],
        "every primary unusable: none removed"
    );
    assert_eq!(
        o.active_backup_level, 1,
        "held primaries are not healthy: the backup level takes over"
    );
    assert_eq!(
        roles(&o, &[1, 2, 3, 4, 21]),
        [
            Role::Sticky,
            Role::Sticky,
            Role::Sticky,
            Role::Sticky,
            Role::Active
        ]
    );
    assert!(!o.fail_open);
    assert_note(
        &o,
        "backup level 1 active: primary group has no usable server",
    );
}

#[test]
fn row3_every_server_unhealthy_under_a_cap_none_is_removed() {
    let t0 = Instant::now();
    let mut svc = group(false, 50, true);
    fail_in_order(&mut svc, t0, &[1, 2, 3, 4]);
    let o = svc.compute_at(t0 + Duration::from_secs(10));
    assert_eq!((o.fail_open, o.fail_open_tier), (true, 1));
    assert_eq!(
        roles(&o, &[1, 2, 3, 4]),
        [Role::Active; 4],
        "Azure: with every instance unhealthy none is removed; tier 1 spreads over all held"
    );
    assert_note(
        &o,
        "removal cap: all 4 servers of primary group unusable, none is removed",
    );
    assert_note(&o, "fail-open tier 1");
}

#[test]
fn row4_no_healthy_server_without_fail_open_keeps_the_caps_promise() {
    let t0 = Instant::now();
    let mut svc = group(false, 50, false);
    fail_in_order(&mut svc, t0, &[1, 2, 3, 4]);
    let o = svc.compute_at(t0 + Duration::from_secs(10));
    assert_eq!((o.fail_open, o.fail_open_tier), (false, 0));
    assert_eq!(
        roles(&o, &[1, 2, 3, 4]),
        [Role::Active; 4],
        "fail_open = false: the cap keeps the whole group, none is removed (Azure)"
    );
    assert_note(
        &o,
        "new flows go only to the 4 server(s) the removal cap holds",
    );
}

#[tokio::test(start_paused = true)]
async fn row5_tier1_spreads_over_servers_out_only_for_passive_checks() {
    let mut svc = group(true, 100, true);
    for last in [1, 2, 3, 21] {
        svc.fail(last);
    }
    svc.suspect(4);
    let o = svc.compute();
    assert_eq!(o.fail_open_tier, 1);
    assert_eq!(
        roles(&o, &[1, 2, 3, 4, 21]),
        [
            Role::Sticky,
            Role::Sticky,
            Role::Sticky,
            Role::Active,
            Role::Sticky
        ],
        "probe-failing servers are provably dead: only the passive suspect serves"
    );
}

#[tokio::test(start_paused = true)]
async fn row6_tier1_includes_a_drained_healthy_server() {
    let mut svc = group(false, 100, true);
    for last in [1, 2, 3] {
        svc.fail(last);
    }
    svc.admin(4, Admin::Drain);
    let o = svc.compute();
    assert_eq!(o.fail_open_tier, 1);
    assert_eq!(
        roles(&o, &[1, 2, 3, 4]),
        [Role::Sticky, Role::Sticky, Role::Sticky, Role::Active]
    );
}

#[tokio::test(start_paused = true)]
async fn row7_tier2_only_when_every_server_fails_its_probes() {
    let mut svc = group(true, 100, true);
    for last in [1, 2, 3, 21] {
        svc.fail(last);
    }
    svc.suspect(4);
    assert_eq!(svc.compute().fail_open_tier, 1, "setup: tier 1");
    svc.fail(4);
    let o = svc.compute();
    assert_eq!((o.fail_open, o.fail_open_tier), (true, 2));
    assert!(
        o.roles.iter().all(|&(_, r)| r == Role::Active),
        "tier 2: every server not down: {:?}",
        o.roles
    );
    assert_note(&o, "fail-open tier 2");
    svc.heal(2);
    let o = svc.compute();
    assert_eq!((o.fail_open, o.fail_open_tier), (false, 0));
    assert_note(&o, "fail-open ended: primary group has a usable server");
}

#[tokio::test(start_paused = true)]
async fn row8_everything_failing_without_fail_open_drops() {
    let mut svc = group(true, 100, false);
    for last in [1, 2, 3, 4, 21] {
        svc.fail(last);
    }
    let o = svc.compute();
    assert!(
        o.roles.iter().all(|&(_, r)| r == Role::Sticky),
        "nothing takes new flows, every established flow stays: {:?}",
        o.roles
    );
    assert_note(
        &o,
        "no healthy server: new flows are dropped (fail_open = false)",
    );
}

#[test]
fn row9_fail_open_tier1_spans_every_levels_held_servers() {
    let t0 = Instant::now();
    let mut servers: Vec<MemberInput> = (1..=2).map(|i| primary(i, 1)).collect();
    servers.extend([backup(21, 1), backup(22, 1)]);
    let mut svc = Svc::new(servers).with(capped(50));
    fail_in_order(&mut svc, t0, &[1, 21, 2, 22]);
    let o = svc.compute_at(t0 + Duration::from_secs(10));
    assert_eq!(
        o.held_by_cap,
        vec![a(1), a(2), a(21), a(22)],
        "each group is entirely unusable: none of it is removed"
    );
    assert_eq!(o.fail_open_tier, 1);
    assert_eq!(roles(&o, &[1, 2, 21, 22]), [Role::Active; 4]);
}

#[tokio::test(start_paused = true)]
async fn row10_checking_servers_never_fail_open_and_keep_flows_only_if_they_had_any() {
    let mut svc = group(false, 100, true);
    for last in [1, 2] {
        svc.fail(last);
    }
    svc.checking(3, true);
    svc.checking(4, false);
    let o = svc.compute();
    assert_eq!(o.fail_open_tier, 2);
    assert_eq!(
        roles(&o, &[1, 2, 3, 4]),
        [Role::Active, Role::Active, Role::Sticky, Role::Removed],
        "checking after having been up keeps its flows; a new one has none"
    );
}

#[tokio::test(start_paused = true)]
async fn row11_admin_down_is_removed_in_every_case() {
    let mut svc = group(false, 100, true);
    for last in [1, 2, 3] {
        svc.fail(last);
    }
    svc.admin(4, Admin::Down);
    let o = svc.compute();
    assert_eq!(o.fail_open_tier, 2);
    assert_eq!(role(&o, 4), Role::Removed);
}
