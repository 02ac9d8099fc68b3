//! The live table kept up to date slot by slot: a backend starting or stopping to take
//! new flows rewrites only the slots [`maglev::failover_table`] would change, found
//! without a pass over the table (docs/publish.md, *Rewriting only the changed slots*).
//!
//! Each slot's failover walk (step 0 is the slot itself, then
//! [`maglev::failover_walk`]) stops at the first step whose home owner is active. Kept:
//! the step each slot stopped at, and per backend the slots whose walk, up to and
//! including that step, visits one of its home slots. Then
//! - a backend leaving changes exactly the slots it holds (its list, filtered): each
//!   resumes its walk after the step it stopped at (every earlier step was inactive and
//!   still is);
//! - a backend returning changes exactly the slots whose walk visits one of its home
//!   slots before the step it stopped at (its list): each now stops at the first such
//!   step (the only step that became active).
//!
//! The lists may hold stale entries (a walk that since stops earlier) and duplicates;
//! every entry is checked against the walk before use, and the lists are rebuilt when
//! they outgrow the table.
use std::collections::HashMap;

use lb_common::NO_BACKEND;

use crate::maglev;

/// Per-slot walk state of a live table (see the module docs).
#[derive(Debug)]
pub(super) struct Failover {
    /// Per slot, the step of its walk at which it found its live owner.
    step: Vec<u32>,
    /// Per backend id, slots whose walk up to its step visits a home slot of the backend
    /// (a superset: stale entries and duplicates are checked at use).
    visits: HashMap<u32, Vec<u32>>,
    /// Entries in `visits`, to bound the stale ones.
    entries: usize,
}

/// The walk cannot be followed incrementally (a walk ran out of steps, or nothing is
/// active): the caller computes the live table whole.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Whole;

impl Failover {
    /// The live table of `home` for the backends `active` says take new flows — equal to
    /// [`maglev::failover_table`] — and its walk state; `None` when some walk runs out of
    /// steps or nothing is active (then the live table is [`maglev::failover_table`]'s).
    pub(super) fn build(home: &[u32], active: impl Fn(u32) -> bool) -> Option<(Vec<u32>, Self)> {
        let size = home.len();
        let mut live = vec![NO_BACKEND; size];
        let mut state = Self {
            step: vec![0; size],
            visits: HashMap::new(),
            entries: 0,
        };
        let is_active = |id: u32| id != NO_BACKEND && active(id);
        if !home.iter().any(|&id| is_active(id)) {
            return None;
        }
        for (slot, out) in live.iter_mut().enumerate() {
            let (step, id) = std::iter::once(slot)
                .chain(maglev::failover_walk(slot, size))
                .enumerate()
                .find_map(|(step, at)| {
                    let id = home[at];
                    state.visit(id, slot);
                    is_active(id).then_some((step, id))
                })?;
            state.step[slot] = step as u32;
            *out = id;
        }
        Some((live, state))
    }

    fn visit(&mut self, id: u32, slot: usize) {
        if id != NO_BACKEND {
            self.visits.entry(id).or_default().push(slot as u32);
            self.entries += 1;
        }
    }

    /// Backend `id` takes new flows again (it did not; something else did): updates
    /// `live` and records each slot it changes with its old owner in `changed`.
    pub(super) fn enter(
        &mut self,
        id: u32,
        home: &[u32],
        live: &mut [u32],
        changed: &mut Vec<(u32, u32)>,
    ) {
        let size = home.len();
        let list = self.visits.remove(&id).unwrap_or_default();
        self.entries -= list.len();
        let mut kept = Vec::with_capacity(list.len());
        for slot in list {
            let s = slot as usize;
            if live[s] == id {
                continue; // a duplicate, taken already
            }
            let stopped = self.step[s] as usize;
            // Steps before `stopped` were all inactive; now `id`'s are active.
            let Some(step) = std::iter::once(s)
                .chain(maglev::failover_walk(s, size))
                .take(stopped)
                .position(|at| home[at] == id)
            else {
                continue; // stale: the walk stops before reaching `id`'s slots
            };
            changed.push((slot, live[s]));
            self.step[s] = step as u32;
            live[s] = id;
            kept.push(slot);
        }
        self.keep(id, kept);
    }

    /// Backend `id` stops taking new flows; `active` says which backends still do (at
    /// least one). Updates `live` and records each slot it changes with its old owner in
    /// `changed`; `Err(Whole)` if a walk runs out of steps (`live` and the state are then
    /// to be rebuilt whole).
    pub(super) fn leave(
        &mut self,
        id: u32,
        home: &[u32],
        live: &mut [u32],
        active: impl Fn(u32) -> bool,
        changed: &mut Vec<(u32, u32)>,
    ) -> Result<(), Whole> {
        let size = home.len();
        let list = self.visits.remove(&id).unwrap_or_default();
        self.entries -= list.len();
        let mut kept = Vec::with_capacity(list.len());
        for slot in list {
            let s = slot as usize;
            if live[s] != id {
                continue; // stale, or a duplicate already moved
            }
            kept.push(slot);
            let stopped = self.step[s] as usize;
            // Resume the walk after the step it stopped at: earlier steps stay inactive.
            let mut found = None;
            for (step, at) in maglev::failover_walk(s, size).enumerate().skip(stopped) {
                let owner = home[at];
                if owner == id {
                    continue; // already in `kept`
                }
                self.visit(owner, s);
                if owner != NO_BACKEND && active(owner) {
                    found = Some((step + 1, owner));
                    break;
                }
            }
            let (step, owner) = found.ok_or(Whole)?;
            changed.push((slot, live[s]));
            self.step[s] = step as u32;
            live[s] = owner;
        }
        self.keep(id, kept);
        Ok(())
    }

    fn keep(&mut self, id: u32, kept: Vec<u32>) {
        if !kept.is_empty() {
            self.entries += kept.len();
            self.visits.entry(id).or_default().extend(kept);
        }
    }

    /// Whether stale entries have grown past the table (rebuild to drop them).
    pub(super) fn bloated(&self) -> bool {
        self.entries > 4 * self.step.len() + 1024
    }
}

/// The slots to write: `changed` (slot, owner before) reduced to the first record of
/// each slot, without those whose owner ended where it began, with their new owner.
pub(super) fn slot_writes(mut changed: Vec<(u32, u32)>, live: &[u32]) -> Vec<(u32, u32)> {
    changed.sort_by_key(|&(slot, _)| slot); // stable: the first record stays first
    changed.dedup_by_key(|&mut (slot, _)| slot);
    changed
        .into_iter()
        .filter(|&(slot, was)| live[slot as usize] != was)
        .map(|(slot, _)| (slot, live[slot as usize]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maglev::{MaglevBackend, build_table, failover_table};

    /// Tiny xorshift, seeded: reproducible sequences without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    fn home(n: u32, size: u32) -> Vec<u32> {
        let backends: Vec<MaglevBackend> = (1..=n)
            .map(|id| MaglevBackend {
                id,
                key: u64::from(id) * 7_919,
                weight: 1 + id % 3,
            })
            .collect();
        build_table(&backends, size)
    }

    #[test]
    fn slot_updates_give_the_table_of_a_whole_pass_and_change_only_what_it_changes() {
        for (seed, n, size) in [(1u64, 5u32, 4099u32), (2, 40, 4099), (3, 300, 65537)] {
            let home = home(n, size);
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
            let mut active: Vec<bool> = (0..=n).map(|id| id != 0).collect();
            let (mut live, mut state) = Failover::build(&home, |id| active[id as usize]).unwrap();
            assert_eq!(live, failover_table(&home, |id| active[id as usize]));
            for _ in 0..400 {
                let id = 1 + (rng.next() % u64::from(n)) as u32;
                let up = !active[id as usize];
                let mut next = active.clone();
                next[id as usize] = up;
                if !next.iter().any(|&a| a) {
                    continue;
                }
                let before = live.clone();
                let mut changed = Vec::new();
                if up {
                    state.enter(id, &home, &mut live, &mut changed);
                } else {
                    state
                        .leave(id, &home, &mut live, |b| next[b as usize], &mut changed)
                        .unwrap();
                }
                active = next;
                let whole = failover_table(&home, |b| active[b as usize]);
                assert_eq!(live, whole, "n={n} id={id} up={up}");
                let writes = slot_writes(changed, &live);
                let differing: Vec<u32> = (0..size)
                    .filter(|&s| before[s as usize] != whole[s as usize])
                    .collect();
                let written: Vec<u32> = writes.iter().map(|&(s, _)| s).collect();
                assert_eq!(
                    written, differing,
                    "exactly the slots the whole pass changes"
                );
                if state.bloated() {
                    state = Failover::build(&home, |b| active[b as usize]).unwrap().1;
                }
            }
        }
    }

    #[test]
    fn nothing_active_is_left_to_the_whole_pass() {
        let home = home(3, 4099);
        assert!(Failover::build(&home, |_| false).is_none());
    }
}
