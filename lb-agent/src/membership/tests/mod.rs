//! One test per rule of the module doc, under paused tokio time or explicit instants;
//! shared helpers here, the tests by rule in the submodules.

use std::{net::SocketAddr, time::Duration};

use tokio::time::Instant;

use super::*;

mod cap_admin;
mod combined;
mod incremental;
mod levels;
mod spares;

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

    /// Failing an active probe (`unhealthy`) since `since`.
    fn fail_since(&mut self, last: u8, since: Instant) {
        self.server(last).health = MemberHealth::Failing { since };
    }

    /// Out for passive checks only (`unavailable`) since now.
    fn suspect(&mut self, last: u8) {
        self.server(last).health = MemberHealth::Passive {
            since: Instant::now(),
        };
    }

    /// `checking`, its probes' verdicts reached (failed); `was_up`: it was in traffic
    /// before.
    fn checking(&mut self, last: u8, was_up: bool) {
        self.server(last).health = MemberHealth::Checking {
            was_up,
            pending: false,
        };
    }

    /// `checking`, its probes not run yet (a start, a reload).
    fn pending(&mut self, last: u8, was_up: bool) {
        self.server(last).health = MemberHealth::Checking {
            was_up,
            pending: true,
        };
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
