//! Per-service membership: which servers take new flows, which only keep their pinned
//! flows, which are out — from health, admin state, spares, backup levels, the removal cap
//! and fail-open (DESIGN.md §6). Pure and time-injected: the caller passes every server's
//! state and `now`; [`ServiceMembership`] remembers only what must persist between calls.
//!
//! # Rules, in the order they are applied
//!
//! Roles: [`Role::Active`] takes new flows and keeps its pinned ones; [`Role::Sticky`] takes
//! no new flow but keeps its established TCP flows until they end (pinned UDP flows and a
//! SYN reusing a pinned 5-tuple move); [`Role::Removed`] is out, its flows re-hash.
//! **Health never breaks a working TCP connection:** every exit for a health or
//! membership reason (unhealthy, unavailable, checking after having been up, drained,
//! idle or retired spare, inactive backup level) is `Sticky`; only admin `down`, a
//! server that was never in traffic (`checking` from new) and, in the publisher, an
//! unknown MAC are `Removed`.
//!
//! 1. **Healthy.** A server is *healthy* when its health is [`MemberHealth::Usable`] and
//!    its admin state is [`Admin::Up`]. Only healthy servers count for the decisions
//!    below (spares, backup levels, fail-open). Admin `drain` makes a server `Sticky`
//!    whatever its health; admin `down` is always `Removed`. Admin states are honoured
//!    whatever the cap, the spares or the backup levels say; only fail-open (step 5) makes
//!    a drained server take new flows again.
//! 2. **Removal cap** (Azure `WEBSITE_HEALTHCHECK_MAXUNHEALTHYWORKERPERCENT`, our
//!    `max_unhealthy_percent`, default 100). Per group — the servers that carry a level's
//!    traffic: the primary group's non-spare servers, and each backup level — with `n` =
//!    the group's servers whose admin state is `up` (and not `checking`), health may
//!    remove at most `floor(n × pct / 100)` of them at once, plus one for each spare that
//!    rule 3 runs (a running spare stands in for a removed primary; an idle spare carries
//!    no traffic, so its failure uses up nothing). When more are unusable, the ones that
//!    became unusable first (earliest `since`; equal `since`: lower address first) are
//!    removed and the rest — the most recent failures — are *held*: they stay `Active`
//!    while their group is the active level, and a note says so. When **every** such
//!    server of the group is unusable, `pct < 100` and no spare runs, none is removed:
//!    all are held (Azure: "when every instance is unhealthy, none is removed"). A held server is **not healthy**: it never makes its
//!    group usable, never covers missing weight for spares and never keeps fail-open
//!    from starting. Drained and down servers are neither in `n` nor in the count: an
//!    operator's decision never uses up health's budget. Example: 4 servers at 50% → at
//!    most 2 removed; with 3 unusable, the latest to fail stays in.
//! 3. **Spares** (`spare = true`, primary group only; a `spare` flag on a backup server is
//!    ignored — config validation rejects it). `main_weight` is the total weight of the
//!    primary group's non-spare servers, whatever their state (so a spare also covers a
//!    primary drained or downed for maintenance); `active_weight` the total weight of the
//!    healthy ones. While `active_weight < main_weight`, the fewest healthy spares whose
//!    weights cover the deficit run; when they cannot cover it, every healthy spare runs.
//!    From one computation to the next: spares that became unhealthy stop at once; while
//!    the running ones fall short, the idle spare with the largest weight joins first; then
//!    running spares no longer needed retire, smallest weight first, as long as the rest
//!    still cover the deficit. If health changes leave more spares running than the fewest
//!    that could cover the deficit (a larger spare came back), the running set is chosen
//!    afresh, largest first. Ties between equal weights go by address: the lower address
//!    joins first and retires last. A spare of weight 0 never runs. An idle (or retired)
//!    spare is `Sticky`: flows already pinned to it stay. A primary group with no
//!    non-spare server has `main_weight` 0 and never runs its spares.
//! 4. **Backup levels.** The primary group (level 0: its healthy primaries plus running
//!    spares) and each backup level `1..` are *usable* when one of their servers is
//!    healthy and has a weight above 0 (servers the cap holds do not count). One level is
//!    active; servers of other levels are `Sticky`. Which level, per [`BackupSwitch`]:
//!    - `TryPrimaryEachFlow` (default): the lowest usable level, re-evaluated at every
//!      computation — back to the primaries as soon as one is usable.
//!    - `RetryAfter(d)`: stay on the active level while it is usable; lower levels (the
//!      primary group included) are tried at most every `d`: when `d` has passed since the
//!      last try (or since this level was entered), the lowest usable level is taken, and
//!      the try is recorded. When the active level has no usable server, move at once to
//!      the lowest usable level. [`Outcome::recheck_at`] says when to compute again so
//!      the retry happens even if no input changes.
//!    - `Permanent`: stay on the active level while it is usable, even after lower levels
//!      recover. When it fails, move to the next higher usable level; from the highest,
//!      return to the primary group (then, if that is not usable either, the lowest usable
//!      backup level: the search is cyclic).
//!
//!    While no level is usable the active level is left unchanged. Nor is it left while
//!    it has no usable server but one whose probes have not reached a verdict yet
//!    ([`MemberHealth::Checking`] with `pending`: at a start, after a reload that checks
//!    servers again, after an addition): a level is not switched because probes have
//!    not run. Once each of them passes or reaches its `fails`, the rules above apply.
//! 5. **Fail-open, in tiers.** When no level is usable (no healthy server anywhere):
//!    - with `fail_open = true` (default), tier 1: every server not `down` and not
//!      `checking` that is only *suspect* — out for passive checks only (`unavailable`),
//!      held by the cap, or healthy but drained — is `Active`, over every level;
//!      tier 2, only when tier 1 is empty: every server not `down` and not `checking`,
//!      probe-failing (`unhealthy`) ones included. [`Outcome::fail_open_tier`] says which;
//!      the others are `Sticky`. No server at all: as `fail_open = false`.
//!    - with `fail_open = false`, no level takes new flows, except that the servers the
//!      cap holds in the active level stay `Active` (the cap's promise: at most `pct`%
//!      of the group removed by health); with none held, the data plane drops and counts.
//!
//! [`Outcome::changes`] holds a human-readable note for every transition (a spare starting
//! or stopping, a level switch, the cap holding or releasing a server, fail-open starting,
//! changing tier or ending); a computation that changes nothing adds none.

use std::{collections::BTreeSet, fmt, net::SocketAddr, time::Duration};

use tokio::time::Instant;

pub use crate::config::BackupSwitch;
pub use crate::publish::Role;

mod cap;
mod incremental;
mod levels;
mod spares;
#[cfg(test)]
mod tests;

/// Health of a server, as the health state machine (DESIGN.md §5) decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberHealth {
    /// Up: may take traffic.
    Usable,
    /// Out for passive checks only (`unavailable`) since `since`: suspect, not proven dead.
    Passive { since: Instant },
    /// Failing an active probe (`unhealthy`) since `since`.
    Failing { since: Instant },
    /// Has not passed its essential probes yet (`checking`). `was_up`: it was in traffic
    /// before (a reload changed its probes, a restart adopted it), so it may hold flows.
    /// `pending`: a probe that gates it has reached no verdict yet, so it may still pass
    /// (a start, a reload, an addition).
    Checking { was_up: bool, pending: bool },
}

impl MemberHealth {
    /// When it became unusable (`Passive`, `Failing`): the cap orders failures by it.
    fn unusable_since(self) -> Option<Instant> {
        match self {
            MemberHealth::Passive { since } | MemberHealth::Failing { since } => Some(since),
            _ => None,
        }
    }

    fn is_checking(self) -> bool {
        matches!(self, MemberHealth::Checking { .. })
    }

    fn is_pending(self) -> bool {
        matches!(self, MemberHealth::Checking { pending: true, .. })
    }
}

/// Operator's state of a server, separate from health.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Admin {
    #[default]
    Up,
    /// No new flows; established TCP flows continue (healthy or not).
    Drain,
    /// Out, pinned flows re-hash.
    Down,
}

/// One server of a service, as membership sees it. Keys are unique within a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberInput {
    pub key: SocketAddr,
    pub weight: u32,
    /// A spare of the primary group (ignored when `backup` is not 0).
    pub spare: bool,
    /// 0 = primary group, 1.. = backup levels.
    pub backup: u32,
    pub health: MemberHealth,
    pub admin: Admin,
}

impl MemberInput {
    fn is_spare(&self) -> bool {
        self.spare && self.backup == 0
    }
}

/// A service's membership settings (`[[service]]` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub backup_switch: BackupSwitch,
    /// 0..=100; larger values count as 100.
    pub max_unhealthy_percent: u8,
    pub fail_open: bool,
}

impl Default for Policy {
    /// The config defaults: try the primaries for each flow, cap 100%, fail open.
    fn default() -> Self {
        Policy {
            backup_switch: BackupSwitch::TryPrimaryEachFlow,
            max_unhealthy_percent: 100,
            fail_open: true,
        }
    }
}

/// `spare` in the status API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpareStatus {
    Idle,
    Running,
}

/// Result of one [`ServiceMembership::compute`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Every input server, in input order.
    pub roles: Vec<(SocketAddr, Role)>,
    /// Every spare of the primary group, in input order.
    pub spares: Vec<(SocketAddr, SpareStatus)>,
    /// Total weight of the primary group's non-spare servers.
    pub main_weight: u32,
    /// Total weight of the primary group's healthy non-spare servers (held ones excluded).
    pub active_weight: u32,
    /// Running spares.
    pub spare_num: usize,
    /// 0 = the primary group.
    pub active_backup_level: u32,
    /// No level is usable and `fail_open` spreads traffic over suspect or all servers.
    pub fail_open: bool,
    /// 0: not failing open; 1: over suspect servers (passive, held, drained); 2: over
    /// every server not down, probe-failing ones included.
    pub fail_open_tier: u8,
    /// Unusable servers the removal cap keeps in traffic, in input order.
    pub held_by_cap: Vec<SocketAddr>,
    /// Compute again at this instant even if no input changes (a `RetryAfter` try is due).
    pub recheck_at: Option<Instant>,
    /// Notes for the transition log, one per change since the previous computation.
    pub changes: Vec<String>,
}

impl Outcome {
    /// Role of `key`, if it was an input.
    pub fn role_of(&self, key: SocketAddr) -> Option<Role> {
        self.roles.iter().find(|(k, _)| *k == key).map(|&(_, r)| r)
    }

    /// Spare status of `key`, if it is a spare.
    pub fn spare_status(&self, key: SocketAddr) -> Option<SpareStatus> {
        self.spares.iter().find(|(k, _)| *k == key).map(|&(_, s)| s)
    }
}

/// What happens to traffic when no level is usable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Blackout {
    /// Some level is usable.
    #[default]
    No,
    /// Fail-open over tier 1 (suspect servers) or tier 2 (every server not down).
    FailOpen(u8),
    /// No new flows (except to servers the cap holds in the active level).
    Drop,
}

/// Membership state of one service that must persist between computations.
#[derive(Clone, Debug, Default)]
pub struct ServiceMembership {
    /// Spares running after the last computation.
    running_spares: BTreeSet<SocketAddr>,
    levels: levels::LevelState,
    /// Unusable servers the cap held in traffic at the last computation.
    held: BTreeSet<SocketAddr>,
    /// Spares the last computation chose to run before deciding the active level: each
    /// stands in for one removed primary in the cap's count (rule 2).
    stand_ins: usize,
    /// Whether the primary group was usable at the last computation (for notes only).
    primary_usable: bool,
    blackout: Blackout,
    /// What the last computation saw ([`ServiceMembership::update`] applies changes to it).
    agg: incremental::Aggregates,
}

impl ServiceMembership {
    pub fn new() -> Self {
        Self::default()
    }

    /// The active level (0 = primary group).
    pub fn active_backup_level(&self) -> u32 {
        self.levels.level
    }

    /// When the active level was entered (`None` before the first computation).
    pub fn level_since(&self) -> Option<Instant> {
        self.levels.since
    }

    /// When lower levels were last tried under `RetryAfter`.
    pub fn last_retry(&self) -> Option<Instant> {
        self.levels.last_retry
    }

    /// Spares running after the last computation, by address.
    pub fn running_spares(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.running_spares.iter().copied()
    }

    /// Applies the rules of the module doc to `servers` at `now`.
    pub fn compute(&mut self, servers: &[MemberInput], policy: &Policy, now: Instant) -> Outcome {
        let mut changes = Vec::new();
        // 1. Only healthy servers decide (held ones do not).
        let healthy = is_healthy;

        // 3. Spares (first: which run does not depend on the cap, and running ones stand
        // in for removed servers in the cap's count).
        let primaries = || servers.iter().filter(|s| s.backup == 0 && !s.is_spare());
        let main_weight = primaries().fold(0u32, |a, s| a.saturating_add(s.weight));
        let active_weight = primaries()
            .filter(|s| healthy(s))
            .fold(0u32, |a, s| a.saturating_add(s.weight));
        let deficit = main_weight.saturating_sub(active_weight);
        let candidates: Vec<(SocketAddr, u32)> = servers
            .iter()
            .filter(|s| s.is_spare() && healthy(s) && s.weight > 0)
            .map(|s| (s.key, s.weight))
            .collect();
        let mut running = spares::select(&candidates, &self.running_spares, deficit);
        self.stand_ins = running.len();

        // 2. Removal cap.
        let caps = cap::apply(servers, policy.max_unhealthy_percent, self.stand_ins);
        let held: BTreeSet<SocketAddr> = caps.iter().flat_map(|c| c.held.iter().copied()).collect();
        for c in &caps {
            for k in c.held.iter().filter(|k| !self.held.contains(k)) {
                if c.all {
                    changes.push(format!(
                        "removal cap: all {} servers of {} unusable, none is removed \
                         (max_unhealthy_percent {}, as Azure's): {k} kept in traffic",
                        c.servers,
                        Level(c.level),
                        policy.max_unhealthy_percent.min(100),
                    ));
                    continue;
                }
                changes.push(format!(
                    "removal cap: {} of {} servers of {} unusable, at most {} may be removed \
                     (max_unhealthy_percent {}): {k} kept in traffic as one of the most recent failures",
                    c.unusable,
                    c.servers,
                    Level(c.level),
                    c.removable,
                    policy.max_unhealthy_percent.min(100),
                ));
            }
        }
        for k in self.held.difference(&held) {
            changes.push(format!("removal cap: {k} no longer held in traffic"));
        }

        // 4. Backup levels.
        let primary_usable = primaries().any(|s| healthy(s) && s.weight > 0) || !running.is_empty();
        let mut usable_levels: BTreeSet<u32> = servers
            .iter()
            .filter(|s| s.backup > 0 && healthy(s) && s.weight > 0)
            .map(|s| s.backup)
            .collect();
        if primary_usable {
            usable_levels.insert(0);
        }
        let pending = pending_levels(servers);
        let from = self.levels.level;
        if let Some(why) = self
            .levels
            .step(&usable_levels, &pending, policy.backup_switch, now)
        {
            let to = self.levels.level;
            let reason = match why {
                levels::Why::Failed => format!("{} has no usable server", Level(from)),
                levels::Why::Recovered => "it has a usable server again".to_string(),
                levels::Why::Retried(d) => {
                    format!("it has a usable server at the retry after {}", Secs(d))
                }
            };
            let again = if to == 0 { " again" } else { "" };
            changes.push(format!("{} active{again}: {reason}", Level(to)));
        } else if primary_usable && !self.primary_usable && self.levels.level != 0 {
            let why = match policy.backup_switch {
                BackupSwitch::Permanent => "backup_switch permanent".to_string(),
                BackupSwitch::RetryAfter(d) => format!(
                    "backup_switch permanent = {}: next try in {}",
                    Secs(d),
                    Secs(self.levels.retry_at(d).saturating_duration_since(now))
                ),
                BackupSwitch::TryPrimaryEachFlow => "no level switch".to_string(),
            };
            changes.push(format!(
                "primary group usable again; {} stays active ({why})",
                Level(self.levels.level)
            ));
        }
        self.primary_usable = primary_usable;
        let active = self.levels.level;

        // 5. Fail-open, in tiers.
        let eligible = |s: &MemberInput, tier: u8| fail_open_eligible(s, tier, &held);
        let blackout = if !usable_levels.is_empty() {
            Blackout::No
        } else if !policy.fail_open {
            Blackout::Drop
        } else if servers.iter().any(|s| eligible(s, 1)) {
            Blackout::FailOpen(1)
        } else if servers.iter().any(|s| eligible(s, 2)) {
            Blackout::FailOpen(2)
        } else {
            Blackout::Drop
        };
        let held_active = servers
            .iter()
            .filter(|s| s.backup == active && !s.is_spare() && held.contains(&s.key))
            .count();
        if blackout != self.blackout {
            match (self.blackout, blackout) {
                (Blackout::FailOpen(_), Blackout::No) => changes.push(format!(
                    "fail-open ended: {} has a usable server",
                    Level(active)
                )),
                (Blackout::Drop, Blackout::No) => changes.push(format!(
                    "usable server again: {} takes new flows",
                    Level(active)
                )),
                _ => {}
            }
            match blackout {
                Blackout::No => {}
                Blackout::FailOpen(1) => changes.push(
                    "fail-open tier 1: no healthy server; spreading over the servers out only \
                     for passive checks, held by the removal cap or drained"
                        .to_string(),
                ),
                Blackout::FailOpen(_) => changes.push(
                    "fail-open tier 2: no healthy or suspect server left; spreading over every \
                     server not down, probe-failing ones included"
                        .to_string(),
                ),
                Blackout::Drop if held_active > 0 => changes.push(format!(
                    "no healthy server: new flows go only to the {held_active} server(s) the \
                     removal cap holds in {} (fail_open = false)",
                    Level(active)
                )),
                Blackout::Drop => changes.push(
                    "no healthy server: new flows are dropped (fail_open = false)".to_string(),
                ),
            }
        }
        self.blackout = blackout;

        // Spares run only while the primary group takes the traffic.
        let primary_active = blackout == Blackout::No && active == 0;
        if !primary_active {
            running.clear();
        }
        let running_weight: u32 = candidates
            .iter()
            .filter(|(k, _)| running.contains(k))
            .fold(0, |a, &(_, w)| a.saturating_add(w));
        // In joining order: most preferred first.
        for (k, w) in spares::by_preference(&candidates) {
            if running.contains(&k) && !self.running_spares.contains(&k) {
                changes.push(format!(
                    "spare {k} running (weight {w}): spares cover {} of {deficit} missing weight",
                    running_weight.min(deficit)
                ));
            }
        }
        for &k in self.running_spares.difference(&running) {
            let why = if !primary_active {
                "primary group not active".to_string()
            } else if !servers.iter().any(|s| s.key == k) {
                "no longer in the service".to_string()
            } else if !candidates.iter().any(|&(c, _)| c == k) {
                "unusable".to_string()
            } else {
                format!("no longer needed (missing weight {deficit})")
            };
            changes.push(format!("spare {k} idle: {why}"));
        }

        let decided = Decided {
            blackout,
            active,
            held: &held,
            running: &running,
        };
        let roles = servers.iter().map(|s| (s.key, decided.role(s))).collect();
        let spares = servers
            .iter()
            .filter(|s| s.is_spare())
            .map(|s| {
                let status = if running.contains(&s.key) {
                    SpareStatus::Running
                } else {
                    SpareStatus::Idle
                };
                (s.key, status)
            })
            .collect();
        let held_by_cap = servers
            .iter()
            .filter(|s| held.contains(&s.key))
            .map(|s| s.key)
            .collect();

        let spare_num = running.len();
        self.agg = incremental::Aggregates::of(servers);
        self.running_spares = running;
        self.held = held;
        let fail_open_tier = match blackout {
            Blackout::FailOpen(t) => t,
            _ => 0,
        };
        Outcome {
            roles,
            spares,
            main_weight,
            active_weight,
            spare_num,
            active_backup_level: active,
            fail_open: fail_open_tier > 0,
            fail_open_tier,
            held_by_cap,
            recheck_at: self.levels.recheck_at(policy.backup_switch),
            changes,
        }
    }
}

/// The whole-service decisions of one computation, from which every server's role
/// follows given its own input alone (what lets [`ServiceMembership::update`] recompute
/// only the servers that changed while these stay the same).
struct Decided<'a> {
    blackout: Blackout,
    active: u32,
    held: &'a BTreeSet<SocketAddr>,
    running: &'a BTreeSet<SocketAddr>,
}

impl Decided<'_> {
    /// The role of `s` under these decisions (rules 1–5 of the module doc).
    fn role(&self, s: &MemberInput) -> Role {
        let held = self.held.contains(&s.key);
        match (s.admin, s.health, self.blackout) {
            (Admin::Down, _, _) => Role::Removed,
            // Never in traffic: nothing pinned to keep.
            (_, MemberHealth::Checking { was_up: false, .. }, _) => Role::Removed,
            (_, MemberHealth::Checking { was_up: true, .. }, _) => Role::Sticky,
            (_, _, Blackout::FailOpen(tier)) if fail_open_eligible(s, tier, self.held) => {
                Role::Active
            }
            (_, _, Blackout::FailOpen(_)) => Role::Sticky,
            (Admin::Drain, _, _) => Role::Sticky,
            _ if !is_healthy(s) && !held => Role::Sticky,
            _ if s.backup != self.active => Role::Sticky,
            // fail_open = false with no healthy server: only the cap's promise.
            (_, _, Blackout::Drop) if !held => Role::Sticky,
            _ if s.is_spare() && !self.running.contains(&s.key) => Role::Sticky,
            _ => Role::Active,
        }
    }
}

/// Rule 1: healthy = usable and admin `up` (servers the cap holds are not).
fn is_healthy(s: &MemberInput) -> bool {
    s.admin == Admin::Up && s.health == MemberHealth::Usable
}

/// Rule 4: the levels with a server that may still pass its first probes (admin `up`,
/// weight above 0, `checking` with verdicts pending).
fn pending_levels(servers: &[MemberInput]) -> BTreeSet<u32> {
    servers
        .iter()
        .filter(|s| s.admin == Admin::Up && s.weight > 0 && s.health.is_pending())
        .map(|s| s.backup)
        .collect()
}

/// Rule 5: whether `s` takes new flows while failing open in `tier`.
fn fail_open_eligible(s: &MemberInput, tier: u8, held: &BTreeSet<SocketAddr>) -> bool {
    s.admin != Admin::Down
        && !s.health.is_checking()
        && (tier >= 2
            || matches!(
                s.health,
                MemberHealth::Usable | MemberHealth::Passive { .. }
            )
            || held.contains(&s.key))
}

/// A level's name in notes: "primary group" or "backup level N".
struct Level(u32);

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => write!(f, "primary group"),
            n => write!(f, "backup level {n}"),
        }
    }
}

/// A duration in notes: "120s", "1.5s".
struct Secs(Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}s", self.0.as_secs_f64())
    }
}
