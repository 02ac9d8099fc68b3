//! The live table kept up to date slot by slot: a backend starting or stopping to take
//! new flows rewrites only the slots [`maglev::failover_table`] would change, found
//! without a pass over the table (docs/internals/publish.md, *Rewriting only the changed slots*).
//!
//! Each slot's failover walk (step 0 is the slot itself, then
//! [`maglev::failover_walk`]) stops at the first step whose home owner is active. Kept:
//! the step each slot stopped at, and per backend the slots whose walk, up to and
//! including that step, visits one of its home slots — at step 0 (its home slots: an
//! index built once per table) and at later steps (a list per backend, exact: one entry
//! per such step). Then
//! - a backend leaving changes exactly the slots it holds: each resumes its walk after
//!   the step it stopped at (every earlier step was inactive and still is);
//! - a backend returning changes exactly the slots whose walk visits one of its home
//!   slots before the step it stopped at: each now stops at the first such step (the
//!   only step that became active), and the later steps leave the lists.
use std::collections::HashMap;

use lb_common::NO_BACKEND;

use crate::maglev;

/// Per-slot walk state of a live table (see the module docs).
#[derive(Debug)]
pub(super) struct Failover {
    /// Per slot, the step of its walk at which it found its live owner.
    step: Vec<u32>,
    /// The slots, ordered by home owner; `homes[id]` is the range of `id`'s.
    by_home: Vec<u32>,
    homes: HashMap<u32, (u32, u32)>,
    /// Per backend id, one entry `s` per step `1..=step[s]` of slot `s`'s walk at a home
    /// slot of that backend.
    later: HashMap<u32, Vec<u32>>,
}

/// The walk cannot be followed incrementally (a walk ran out of steps, or nothing is
/// active): the caller computes the live table whole.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Whole;

/// Step 0 of slot `s`'s walk is `s`, then [`maglev::failover_walk`].
fn walk(s: usize, size: usize) -> impl Iterator<Item = usize> {
    std::iter::once(s).chain(maglev::failover_walk(s, size))
}

impl Failover {
    /// The live table of `home` for the backends `active` says take new flows — equal to
    /// [`maglev::failover_table`] — and its walk state; `None` when some walk runs out of
    /// steps or nothing is active (then the live table is [`maglev::failover_table`]'s).
    pub(super) fn build(home: &[u32], active: impl Fn(u32) -> bool) -> Option<(Vec<u32>, Self)> {
        let size = home.len();
        let is_active = |id: u32| id != NO_BACKEND && active(id);
        if !home.iter().any(|&id| is_active(id)) {
            return None;
        }
        // The home index: a counting sort of the slots by owner (ids up to the largest
        // in the table: the data plane's size is chosen at load, `agent.max_backends`).
        let bound = home.iter().copied().max().unwrap_or(NO_BACKEND) as usize + 1;
        let mut starts = vec![0u32; bound + 1];
        for &id in home {
            starts[id as usize + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        let mut homes = HashMap::new();
        for (id, w) in starts.windows(2).enumerate() {
            if w[1] > w[0] && id as u32 != NO_BACKEND {
                homes.insert(id as u32, (w[0], w[1]));
            }
        }
        let mut by_home = vec![0u32; size];
        for (slot, &id) in home.iter().enumerate() {
            let at = &mut starts[id as usize];
            by_home[*at as usize] = slot as u32;
            *at += 1;
        }
        let mut state = Self {
            step: vec![0; size],
            by_home,
            homes,
            later: HashMap::new(),
        };
        let mut live = home.to_vec();
        for (slot, out) in live.iter_mut().enumerate() {
            if is_active(*out) {
                continue;
            }
            let (step, id) = walk(slot, size)
                .enumerate()
                .skip(1)
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
            self.later.entry(id).or_default().push(slot as u32);
        }
    }

    /// The slots whose walk visits a home slot of `id` up to their step (with
    /// repetitions: a slot once per such step).
    fn visitors(&self, id: u32) -> Vec<u32> {
        let own = self
            .homes
            .get(&id)
            .map_or(&[][..], |&(a, b)| &self.by_home[a as usize..b as usize]);
        let later = self.later.get(&id).map_or(&[][..], Vec::as_slice);
        [own, later].concat()
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
        for slot in self.visitors(id) {
            let s = slot as usize;
            if live[s] == id {
                continue; // a repetition, taken already
            }
            let stopped = self.step[s] as usize;
            // Steps before `stopped` were all inactive; now `id`'s are active.
            let Some(step) = walk(s, size).take(stopped).position(|at| home[at] == id) else {
                debug_assert!(false, "slot {s} is listed for {id} but does not visit it");
                continue;
            };
            // Steps after the new stop leave the lists.
            for at in walk(s, size).take(stopped + 1).skip(step + 1) {
                if let Some(list) = self.later.get_mut(&home[at])
                    && let Some(i) = list.iter().position(|&x| x == slot)
                {
                    list.swap_remove(i);
                }
            }
            changed.push((slot, live[s]));
            self.step[s] = step as u32;
            live[s] = id;
        }
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
        // `id` is active, so every walk that visits it stops there (once): each slot
        // listed holds `id` (the lists are exact), and its home slots stopped at step 0 —
        // neither is read from the table (cold memory, in a service not touched lately).
        let own = self.homes.get(&id).map_or(0, |&(a, b)| (b - a) as usize);
        for (i, slot) in self.visitors(id).into_iter().enumerate() {
            let s = slot as usize;
            debug_assert_eq!(live[s], id, "slot {s} is listed for {id}");
            // Resume the walk after the step it stopped at: earlier steps stay inactive.
            let stopped = if i < own { 0 } else { self.step[s] as usize };
            let mut found = None;
            for (step, at) in walk(s, size).enumerate().skip(stopped + 1) {
                let owner = home[at];
                self.visit(owner, s);
                if owner != NO_BACKEND && active(owner) {
                    found = Some((step, owner));
                    break;
                }
            }
            let (step, owner) = found.ok_or(Whole)?;
            changed.push((slot, id));
            self.step[s] = step as u32;
            live[s] = owner;
        }
        Ok(())
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

    /// `later`, each list sorted, empty lists left out.
    fn lists(f: &Failover) -> std::collections::BTreeMap<u32, Vec<u32>> {
        f.later
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(&id, l)| {
                let mut l = l.clone();
                l.sort_unstable();
                (id, l)
            })
            .collect()
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
        // Steps of the large table are fewer: each compares two whole passes over 65,537
        // slots, which a debug build takes about 60 ms for.
        for (seed, n, size, steps) in [
            (1u64, 5u32, 4099u32, 400),
            (2, 40, 4099, 400),
            (3, 300, 65537, 100),
        ] {
            let home = home(n, size);
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
            let mut active: Vec<bool> = (0..=n).map(|id| id != 0).collect();
            let (mut live, mut state) = Failover::build(&home, |id| active[id as usize]).unwrap();
            assert_eq!(live, failover_table(&home, |id| active[id as usize]));
            for _ in 0..steps {
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
                let fresh = Failover::build(&home, |b| active[b as usize]).unwrap().1;
                assert_eq!(state.step, fresh.step, "the steps of a fresh build");
                assert_eq!(
                    lists(&state),
                    lists(&fresh),
                    "exact lists: no stale entry left behind"
                );
                let writes = slot_writes(changed, &live);
                let differing: Vec<u32> = (0..size)
                    .filter(|&s| before[s as usize] != whole[s as usize])
                    .collect();
                let written: Vec<u32> = writes.iter().map(|&(s, _)| s).collect();
                assert_eq!(
                    written, differing,
                    "exactly the slots the whole pass changes"
                );
            }
        }
    }

    #[test]
    fn nothing_active_is_left_to_the_whole_pass() {
        let home = home(3, 4099);
        assert!(Failover::build(&home, |_| false).is_none());
    }
}
