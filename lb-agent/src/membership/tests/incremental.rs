//! `ServiceMembership::update` against `compute`, the reference: over random services
//! (spares, backup levels, every `backup_switch`, a removal cap, fail-open on and off)
//! and random sequences of health changes, admin changes and rechecks, an update that
//! is accepted yields the outcome a computation over every server gives, and says which
//! servers' roles moved.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

/// xorshift64*: a reproducible sequence without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

fn random_service(rng: &mut Rng) -> (Vec<MemberInput>, Policy) {
    let n = 2 + rng.below(11);
    let servers = (0..n)
        .map(|i| {
            let backup = [0, 0, 0, 1, 2][rng.below(5)];
            MemberInput {
                key: a(i as u8 + 1),
                weight: [0, 1, 1, 2, 3][rng.below(5)],
                spare: backup == 0 && rng.one_in(4),
                backup,
                health: MemberHealth::Usable,
                admin: [
                    Admin::Up,
                    Admin::Up,
                    Admin::Up,
                    Admin::Up,
                    Admin::Drain,
                    Admin::Down,
                ][rng.below(6)],
            }
        })
        .collect();
    let policy = Policy {
        backup_switch: [
            BackupSwitch::TryPrimaryEachFlow,
            BackupSwitch::Permanent,
            BackupSwitch::RetryAfter(Duration::from_secs(3)),
        ][rng.below(3)],
        max_unhealthy_percent: [100, 100, 50, 25][rng.below(4)],
        fail_open: !rng.one_in(3),
    };
    (servers, policy)
}

fn random_health(rng: &mut Rng, now: Instant) -> MemberHealth {
    match rng.below(7) {
        0..=2 => MemberHealth::Usable,
        3 => MemberHealth::Passive { since: now },
        4 | 5 => MemberHealth::Failing { since: now },
        _ => MemberHealth::Checking {
            was_up: rng.one_in(2),
            pending: rng.one_in(2),
        },
    }
}

#[test]
fn an_accepted_update_gives_the_outcome_of_a_computation_over_every_server() {
    let t0 = Instant::now();
    let (mut updated, mut fell_back) = (0, 0);
    // Accepted while spares ran, and while spares were needed but could not cover.
    let (mut updated_running, mut updated_short) = (0, 0);
    for seed in 1..=300u64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
        let (mut servers, policy) = random_service(&mut rng);
        let mut now = t0;
        let mut reference = ServiceMembership::new();
        let mut incremental = ServiceMembership::new();
        let mut want = reference.compute(&servers, &policy, now);
        let mut have = incremental.compute(&servers, &policy, now);
        assert_eq!(have, want);
        for step in 0..60 {
            let ctx = format!("seed {seed} step {step} ({policy:?})");
            now += Duration::from_millis(rng.below(2_500) as u64);
            let before = want.clone();
            // Health changes of 1 to 3 servers (a verdict batch), or else an admin or
            // weight change, or nothing (a recheck): the agent computes those fully.
            let health_only = !rng.one_in(8);
            let mut changed = Vec::new();
            if health_only {
                for _ in 0..1 + rng.below(3) {
                    let i = rng.below(servers.len());
                    if !changed.contains(&i) {
                        servers[i].health = random_health(&mut rng, now);
                        changed.push(i);
                    }
                }
            } else if rng.one_in(2) {
                let i = rng.below(servers.len());
                servers[i].admin = [Admin::Up, Admin::Drain, Admin::Down][rng.below(3)];
                servers[i].weight = rng.below(4) as u32;
            }
            want = reference.compute(&servers, &policy, now);
            let inputs: Vec<MemberInput> = changed.iter().map(|&i| servers[i]).collect();
            let moved = health_only
                .then(|| incremental.update(&inputs, &policy, now, &mut have))
                .flatten();
            match moved {
                Some(moved) => {
                    updated += 1;
                    updated_running += usize::from(before.spare_num > 0);
                    updated_short += usize::from(
                        before.spare_num > 0
                            && before.main_weight - before.active_weight
                                > before
                                    .spares
                                    .iter()
                                    .filter(|(_, s)| *s == SpareStatus::Running)
                                    .map(|(k, _)| {
                                        servers.iter().find(|s| s.key == *k).unwrap().weight
                                    })
                                    .sum::<u32>(),
                    );
                    assert_eq!(have, want, "{ctx}: the update differs from the computation");
                    let really: Vec<usize> = (0..servers.len())
                        .filter(|&i| before.roles[i] != want.roles[i])
                        .collect();
                    assert_eq!(moved, really, "{ctx}: the roles said to have moved");
                }
                None => {
                    fell_back += usize::from(health_only);
                    have = incremental.compute(&servers, &policy, now);
                    assert_eq!(have, want, "{ctx}: the fallback computation");
                }
            }
        }
    }
    // Both paths must be exercised (about 2,900 updates and 12,900 fallbacks: these
    // small services cross a decision at most verdicts).
    assert!(
        updated > 2_000 && fell_back > 2_000,
        "updated {updated}, fell back {fell_back}"
    );
    // The verdicts accepted while spares run (the fixed point of the spare choice): some
    // with the spares covering the missing weight, some with them falling short.
    assert!(
        updated_running > 300 && updated_short > 30,
        "updated {updated} ({updated_running} with spares running, {updated_short} of \
         them short), fell back {fell_back}"
    );
}

#[test]
fn a_verdict_that_moves_a_decision_is_left_to_the_computation() {
    // Two primaries, a spare: losing a primary needs the spare (rule 3).
    let mut svc = Svc::new(vec![primary(1, 1), primary(2, 1), spare(3, 1)]);
    let mut out = svc.compute();
    svc.fail(1);
    let changed = [*svc.server(1)];
    assert_eq!(
        svc.m
            .update(&changed, &svc.policy, Instant::now(), &mut out),
        None,
        "a spare must start: the whole service is computed"
    );

    // Without a spare the same verdict moves that server alone.
    let mut svc = Svc::new(vec![primary(1, 1), primary(2, 1), backup(3, 1)]);
    let mut out = svc.compute();
    svc.fail(1);
    let changed = [*svc.server(1)];
    assert_eq!(
        svc.m
            .update(&changed, &svc.policy, Instant::now(), &mut out),
        Some(vec![0])
    );
    assert_eq!(role(&out, 1), Role::Sticky);
    assert_eq!(out.active_weight, 1);
    // The last primary failing makes the backup level active: a decision.
    svc.fail(2);
    let changed = [*svc.server(2)];
    assert_eq!(
        svc.m
            .update(&changed, &svc.policy, Instant::now(), &mut out),
        None,
        "the active level changes: the whole service is computed"
    );
}

#[test]
fn a_verdict_that_leaves_the_running_spares_alone_is_applied_while_they_run() {
    // One primary down, the first spare covers it; the backup servers are not part of
    // that decision (level 1 stays usable with one of them).
    let mut svc = Svc::new(vec![
        primary(1, 1),
        primary(2, 1),
        spare(3, 1),
        spare(4, 1),
        backup(5, 1),
        backup(6, 1),
    ]);
    svc.fail(1);
    let mut out = svc.compute();
    assert_eq!(running(&out), vec![a(3)]);

    // The backup server failing moves neither the missing weight nor a spare.
    svc.fail(5);
    let changed = [*svc.server(5)];
    assert_eq!(
        svc.m
            .update(&changed, &svc.policy, Instant::now(), &mut out),
        Some(vec![]),
        "a backup server's verdict while the primary group is active moves no role"
    );
    // The failed primary turning suspect (unusable either way): its role is the same.
    svc.suspect(1);
    let changed = [*svc.server(1)];
    assert_eq!(
        svc.m
            .update(&changed, &svc.policy, Instant::now(), &mut out),
        Some(vec![])
    );
    // The idle spare failing: it runs no traffic, but it was a candidate of the choice,
    // so the choice is left to the computation.
    svc.fail(4);
    let changed = [*svc.server(4)];
    assert_eq!(
        svc.m
            .update(&changed, &svc.policy, Instant::now(), &mut out),
        None,
        "a spare's candidacy moved while spares are needed"
    );
    let mut out = svc.compute();
    // The primary recovering changes the missing weight: the spare must stop.
    svc.heal(1);
    let changed = [*svc.server(1)];
    assert_eq!(
        svc.m
            .update(&changed, &svc.policy, Instant::now(), &mut out),
        None,
        "the missing weight changes: the whole service is computed"
    );
}
