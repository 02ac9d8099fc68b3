//! One shard of the replica table: an open-addressed hash table (linear probing over
//! 16-bit tags, deletion by backward shift) whose slots for a hash the caller can
//! prefetch before it looks the key up, so that a batch's cache misses overlap.
//!
//! Hashes come from the caller, always from the same function of the key: a key's home
//! slot is its hash's low bits, its tag the top ones. `rehash` arguments give that
//! function back where entries move (a growth, a removal's shift).

use crate::util::prefetch::{CACHE_LINE, prefetch_line};

/// Slots of a new shard (a power of two).
const FIRST_SLOTS: usize = 16;

/// Where a key is, or where it would go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    Found(usize),
    /// The free slot that ends the key's probe sequence.
    Vacant(usize),
}

/// Entries `K -> V` by caller-given hash.
#[derive(Debug)]
pub struct Shard<K, V> {
    /// Per slot: 0 when free, else its key's [`tag`].
    tags: Vec<u16>,
    /// Per slot: the entry, meaningful where its tag is not 0.
    entries: Vec<(K, V)>,
    len: usize,
}

/// The tag of a hash: its top 15 bits, never 0.
fn tag(hash: u64) -> u16 {
    (hash >> 48) as u16 | 1
}

impl<K: Copy + Default + Eq, V: Copy + Default> Default for Shard<K, V> {
    fn default() -> Self {
        Shard {
            tags: vec![0; FIRST_SLOTS],
            entries: vec![Default::default(); FIRST_SLOTS],
            len: 0,
        }
    }
}

impl<K: Copy + Default + Eq, V: Copy + Default> Shard<K, V> {
    pub fn len(&self) -> usize {
        self.len
    }

    fn mask(&self) -> usize {
        self.tags.len() - 1
    }

    /// Starts loading the home slot of `hash` (its tag and its entry's first lines).
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        let at = hash as usize & self.mask();
        prefetch_line(self.tags[at..].as_ptr().cast());
        let entry: *const u8 = self.entries[at..].as_ptr().cast();
        for offset in (0..size_of::<(K, V)>()).step_by(CACHE_LINE) {
            prefetch_line(entry.wrapping_add(offset));
        }
    }

    /// Where `key` (of `hash`) is, or the slot it would take. Make room first
    /// ([`Shard::reserve_one`]) if it may be inserted there.
    #[inline]
    pub fn probe(&self, hash: u64, key: &K) -> Probe {
        let mask = self.mask();
        let want = tag(hash);
        let mut at = hash as usize & mask;
        loop {
            match self.tags[at] {
                0 => return Probe::Vacant(at),
                t if t == want && self.entries[at].0 == *key => return Probe::Found(at),
                _ => at = (at + 1) & mask,
            }
        }
    }

    /// Grows the shard, if need be, so that one more entry keeps it at most 7/8 full.
    pub fn reserve_one(&mut self, rehash: impl Fn(&K) -> u64) {
        if (self.len + 1) * 8 <= self.tags.len() * 7 {
            return;
        }
        let slots = self.tags.len() * 2;
        let tags = std::mem::replace(&mut self.tags, vec![0; slots]);
        let entries = std::mem::replace(&mut self.entries, vec![Default::default(); slots]);
        let mask = slots - 1;
        for (t, entry) in tags.into_iter().zip(entries) {
            if t == 0 {
                continue;
            }
            let mut at = rehash(&entry.0) as usize & mask;
            while self.tags[at] != 0 {
                at = (at + 1) & mask;
            }
            self.tags[at] = t;
            self.entries[at] = entry;
        }
    }

    /// Puts `key -> value` in the slot [`Shard::probe`] gave as vacant (after
    /// [`Shard::reserve_one`]).
    pub fn insert_at(&mut self, at: usize, hash: u64, key: K, value: V) {
        debug_assert_eq!(self.tags[at], 0);
        self.tags[at] = tag(hash);
        self.entries[at] = (key, value);
        self.len += 1;
    }

    pub fn value_at(&mut self, at: usize) -> &mut V {
        &mut self.entries[at].1
    }

    /// Removes the entry at `at` (found), shifting back the entries after it that
    /// their probe allows, so that no search ends early at the freed slot.
    pub fn remove_at(&mut self, at: usize, rehash: impl Fn(&K) -> u64) -> V {
        let mask = self.mask();
        let value = self.entries[at].1;
        self.tags[at] = 0;
        self.len -= 1;
        let mut hole = at;
        let mut next = (at + 1) & mask;
        while self.tags[next] != 0 {
            let home = rehash(&self.entries[next].0) as usize & mask;
            // It may move back if its home is not after the hole on its way to `next`.
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.tags[hole] = self.tags[next];
                self.entries[hole] = self.entries[next];
                self.tags[next] = 0;
                hole = next;
            }
            next = (next + 1) & mask;
        }
        value
    }

    pub fn iter(&self) -> impl Iterator<Item = &(K, V)> {
        self.tags
            .iter()
            .zip(&self.entries)
            .filter(|(t, _)| **t != 0)
            .map(|(_, entry)| entry)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A poor hash on purpose (many keys share a home and a tag), so that probes,
    /// wrap-arounds and shifts are exercised.
    fn weak(key: &u32) -> u64 {
        u64::from(key % 97).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    #[test]
    fn inserts_lookups_and_removals_agree_with_a_map() {
        let mut shard: Shard<u32, u64> = Shard::default();
        let mut model = HashMap::new();
        let mut seed = 0x2545_f491_u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        for step in 0..200_000u64 {
            let key = next(600) as u32;
            let hash = weak(&key);
            if next(3) == 0 {
                let removed = match shard.probe(hash, &key) {
                    Probe::Found(at) => Some(shard.remove_at(at, weak)),
                    Probe::Vacant(_) => None,
                };
                assert_eq!(removed, model.remove(&key), "step {step}");
            } else {
                shard.reserve_one(weak);
                match shard.probe(hash, &key) {
                    Probe::Found(at) => *shard.value_at(at) = step,
                    Probe::Vacant(at) => shard.insert_at(at, hash, key, step),
                }
                model.insert(key, step);
            }
            assert_eq!(shard.len(), model.len());
        }
        let mut held: Vec<(u32, u64)> = shard.iter().copied().collect();
        let mut expected: Vec<(u32, u64)> = model.into_iter().collect();
        held.sort_unstable();
        expected.sort_unstable();
        assert_eq!(held, expected);
        // Every key is found from its home, after all the shifts.
        for (key, value) in expected {
            let Probe::Found(at) = shard.probe(weak(&key), &key) else {
                panic!("{key} lost");
            };
            assert_eq!(*shard.value_at(at), value);
        }
    }

    #[test]
    fn it_grows_before_it_is_full() {
        let mut shard: Shard<u32, u32> = Shard::default();
        let hash = |k: &u32| u64::from(*k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for key in 0..10_000 {
            shard.reserve_one(hash);
            let Probe::Vacant(at) = shard.probe(hash(&key), &key) else {
                panic!("{key} found before it was put");
            };
            shard.insert_at(at, hash(&key), key, key);
            assert!(shard.len() * 8 <= shard.tags.len() * 7);
        }
        assert_eq!(shard.tags.len(), 16_384);
    }
}
