//! Incremental membership: a health change of a few servers updates the service's
//! aggregates (weights, usable servers per level, the cap's counts per group) and the
//! roles of those servers only — as long as no whole-service decision can change (which
//! spares run, the active level, the cap's held servers, fail-open). When one might, the
//! caller falls back to [`ServiceMembership::compute`], which stays the reference.
//!
//! Spares: which run is `spares::select(candidates, running, deficit)`, and that choice is
//! a fixed point — selecting again with the same candidates (usable spares of weight > 0)
//! and the same missing weight returns the running set unchanged (it covers the deficit or
//! holds every candidate, none of its members can retire, it is no larger than the fewest
//! that cover). So while spares run, a change that leaves the missing weight and every
//! spare's candidacy as they were (a backup server, a primary of weight 0, a move between
//! two unusable states, a spare that stays unusable) keeps the same spares running, and
//! whether the primary group is usable through them, and is applied here too.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::{
    BackupSwitch, Blackout, Decided, MemberInput, Outcome, Policy, ServiceMembership, is_healthy,
};

/// Sums over a service's inputs that the whole-service decisions depend on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counts {
    /// Total weight of the primary group's non-spare servers (`Outcome::main_weight`
    /// before saturation).
    main_weight: u64,
    /// Of those, the healthy ones (`Outcome::active_weight` before saturation).
    active_weight: u64,
    /// Spares of the primary group with a weight above 0 (the only ones that can run).
    weighted_spares: usize,
    /// Per level: healthy non-spare servers with a weight above 0 (a level is usable
    /// when it has one; level 0 also with a running spare, which the fast path excludes).
    usable: BTreeMap<u32, usize>,
    /// Per level: servers that may still pass their first probes (`pending_levels`).
    pending: BTreeMap<u32, usize>,
    /// Per group (level): non-spare servers whose admin state is `up` and that are not
    /// `checking` (the cap's `n`), and how many of them are unusable.
    cap: BTreeMap<u32, (usize, usize)>,
}

impl Counts {
    fn of(servers: &[MemberInput]) -> Self {
        let mut c = Counts::default();
        for s in servers {
            c.add(s);
        }
        c
    }

    fn add(&mut self, s: &MemberInput) {
        self.step(s, true);
    }

    fn remove(&mut self, s: &MemberInput) {
        self.step(s, false);
    }

    fn step(&mut self, s: &MemberInput, add: bool) {
        let count = |n: &mut usize| {
            if add {
                *n += 1;
            } else {
                *n -= 1;
            }
        };
        let weigh = |w: &mut u64| {
            if add {
                *w += u64::from(s.weight);
            } else {
                *w -= u64::from(s.weight);
            }
        };
        let healthy = is_healthy(s);
        if s.is_spare() {
            if s.weight > 0 {
                count(&mut self.weighted_spares);
            }
        } else {
            if s.backup == 0 {
                weigh(&mut self.main_weight);
                if healthy {
                    weigh(&mut self.active_weight);
                }
            }
            if healthy && s.weight > 0 {
                count(self.usable.entry(s.backup).or_default());
            }
        }
        if s.admin == super::Admin::Up && s.weight > 0 && s.health.is_pending() {
            count(self.pending.entry(s.backup).or_default());
        }
        if s.admin == super::Admin::Up && !s.health.is_checking() && !s.is_spare() {
            let (n, unusable) = self.cap.entry(s.backup).or_default();
            count(n);
            if s.health.unusable_since().is_some() {
                count(unusable);
            }
        }
    }

    /// `main_weight − active_weight` as `compute` finds it (saturating sums).
    fn deficit(&self) -> u32 {
        saturate(self.main_weight).saturating_sub(saturate(self.active_weight))
    }

    fn usable_levels(&self) -> impl Iterator<Item = u32> + '_ {
        self.usable.iter().filter(|&(_, &n)| n > 0).map(|(&l, _)| l)
    }

    fn pending_levels(&self) -> impl Iterator<Item = u32> + '_ {
        self.pending
            .iter()
            .filter(|&(_, &n)| n > 0)
            .map(|(&l, _)| l)
    }

    /// Whether the cap holds servers in `level`'s group at `pct` with `stand_ins` spares
    /// running (as `cap::apply`: below 100 %, a group with every server unusable and no
    /// spare standing in has all of them held).
    fn over_cap(&self, level: u32, pct: u8, stand_ins: usize) -> bool {
        let (n, unusable) = self.cap.get(&level).copied().unwrap_or_default();
        let pct = pct.min(100);
        let stand_ins = if level == 0 { stand_ins } else { 0 };
        if pct < 100 && unusable > 0 && unusable == n && stand_ins == 0 {
            return true;
        }
        unusable > super::cap::removable(n, u64::from(pct), stand_ins)
    }
}

/// Whether a spare is one `spares::select` may run: usable and of weight above 0.
fn is_spare_candidate(s: &MemberInput) -> bool {
    is_healthy(s) && s.weight > 0
}

fn saturate(sum: u64) -> u32 {
    u32::try_from(sum).unwrap_or(u32::MAX)
}

/// What the last computation saw, kept so that a change can be applied to it.
#[derive(Clone, Debug, Default)]
pub(super) struct Aggregates {
    /// The inputs of the last computation, sorted by key; `None` before the first one, or
    /// when they were not sorted (then every computation is a full one).
    inputs: Option<Vec<MemberInput>>,
    counts: Counts,
}

impl Aggregates {
    pub(super) fn of(servers: &[MemberInput]) -> Self {
        let sorted = servers.windows(2).all(|w| w[0].key < w[1].key);
        Aggregates {
            inputs: sorted.then(|| servers.to_vec()),
            counts: Counts::of(servers),
        }
    }
}

impl ServiceMembership {
    /// Applies a health change of the servers in `changed` (their new inputs; keys unique,
    /// every other field as at the last computation) to `outcome`, the result of the last
    /// [`compute`](ServiceMembership::compute) or `update`, when no whole-service decision
    /// can change: the primary group runs no spare and needs none, the sets of usable
    /// levels and of levels with pending verdicts stay the same (so does the active level, and no `RetryAfter` try is due), the cap
    /// holds no server in the changed servers' groups before or after. While spares run or
    /// are needed, the missing weight and every spare's candidacy (usable with a weight
    /// above 0) must stay as they were; then the running spares stay too (the module doc's
    /// fixed point). Returns the indices
    /// (in input order) of the servers whose role changed; `outcome` is then what
    /// `compute` over every input would return. `None`: a full computation is needed;
    /// nothing was changed.
    ///
    /// Cost: `O(changed × log servers)`, not the service's size.
    pub fn update(
        &mut self,
        changed: &[MemberInput],
        policy: &Policy,
        now: Instant,
        outcome: &mut Outcome,
    ) -> Option<Vec<usize>> {
        let inputs = self.agg.inputs.as_ref()?;
        if outcome.roles.len() != inputs.len() || self.blackout != Blackout::No {
            return None;
        }
        if let BackupSwitch::RetryAfter(d) = policy.backup_switch
            && self.levels.level != 0
            && now >= self.levels.retry_at(d)
        {
            return None;
        }
        let mut counts = self.agg.counts.clone();
        let mut at = Vec::with_capacity(changed.len());
        let mut candidacy_moved = false;
        for new in changed {
            let i = inputs.binary_search_by_key(&new.key, |s| s.key).ok()?;
            let old = &inputs[i];
            if (old.weight, old.spare, old.backup, old.admin)
                != (new.weight, new.spare, new.backup, new.admin)
            {
                return None;
            }
            candidacy_moved |= old.is_spare() && is_spare_candidate(old) != is_spare_candidate(new);
            counts.remove(old);
            counts.add(new);
            at.push(i);
        }
        let mut sorted = at.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != at.len() {
            return None;
        }
        let before = &self.agg.counts;
        if counts.usable_levels().next().is_none()
            || !counts.usable_levels().eq(before.usable_levels())
            || !counts.pending_levels().eq(before.pending_levels())
            || (counts.weighted_spares > 0
                && (counts.deficit() != before.deficit()
                    || (counts.deficit() > 0 && candidacy_moved)))
        {
            return None;
        }
        let pct = policy.max_unhealthy_percent;
        if changed.iter().any(|s| {
            before.over_cap(s.backup, pct, self.stand_ins)
                || counts.over_cap(s.backup, pct, self.stand_ins)
        }) {
            return None;
        }

        // No decision changes: only the changed servers' roles can.
        let decided = Decided {
            blackout: Blackout::No,
            active: self.levels.level,
            held: &self.held,
            running: &self.running_spares,
        };
        let inputs = self.agg.inputs.as_mut().expect("checked above");
        let mut moved = Vec::new();
        for (new, &i) in changed.iter().zip(&at) {
            inputs[i] = *new;
            let role = decided.role(new);
            if outcome.roles[i].1 != role {
                outcome.roles[i].1 = role;
                moved.push(i);
            }
        }
        moved.sort_unstable();
        outcome.active_weight = saturate(counts.active_weight);
        outcome.changes.clear();
        self.agg.counts = counts;
        Some(moved)
    }
}
