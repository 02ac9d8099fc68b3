//! A peer table (`LB_PEER_FLOWS`, `LB_PEER_NAT`) written through `mmap`: a two-choice
//! set-associative table (`lb_common::table`) of which the agent is the only writer and
//! the XDP program a reader (lb-ebpf's `slots::find_choice` and `slots::read_at`).
//!
//! A key lives in one of the ways of its bucket (`table_hash(key, seed)`) or of its
//! second choice (`second_choice` of that hash); a new key goes into the less full of the
//! two. A slot is published by its word as the program's own writers publish theirs: the
//! word swapped to "not live, next generation", the key and value written, the word
//! swapped to "live" with the key's hash as its tag. A reader that copied a slot while it
//! changed sees another word after the copy and throws the copy away. With one writer no
//! bucket lock is taken (the program never writes these tables).

use std::{
    marker::PhantomData,
    ptr::{addr_of, addr_of_mut},
    sync::atomic::{AtomicU64, Ordering},
};

use aya::maps::MapData;
use lb_common::{
    hash::table_hash,
    maps::FlowKey,
    table::{
        Bucket, SLOT_LIVE, SLOT_TAG_SHIFT, Slot, TABLE_WAYS, free_word, live_word, same_flow,
        second_choice,
    },
};

use super::mapping::Mapping;
use crate::dataplane::DataplaneError;
use crate::util::prefetch::{CACHE_LINE, prefetch_line};

/// One peer table, mapped.
pub struct PeerTable<V> {
    mapping: Mapping,
    /// Buckets (a power of two).
    buckets: u32,
    seed: u32,
    /// Keeps the map open for as long as it is mapped.
    _map: MapData,
    _value: PhantomData<V>,
}

// SAFETY: the mapping is plain shared memory owned by this value; it is written only
// through `&mut self` (one writer), and the slot words are accessed atomically.
unsafe impl<V> Send for PeerTable<V> {}

impl<V: Copy> PeerTable<V> {
    /// Maps `map` (named `name`, an array of `Bucket<V>` created `BPF_F_MMAPABLE`), whose
    /// keys are hashed with `seed` (an adopted table holds the previous agent's
    /// connections). Nothing is read: a table of millions of connections is only paged in
    /// where it is written.
    pub fn new(map: MapData, name: &'static str, seed: u32) -> Result<Self, DataplaneError> {
        let info = map
            .info()
            .map_err(|source| DataplaneError::Map { name, source })?;
        let buckets = info.max_entries();
        if info.value_size() as usize != size_of::<Bucket<V>>() || !buckets.is_power_of_two() {
            return Err(DataplaneError::Layout {
                name,
                detail: format!(
                    "{buckets} values of {} bytes, not a power of two of {}-byte buckets",
                    info.value_size(),
                    size_of::<Bucket<V>>()
                ),
            });
        }
        let mapping = Mapping::new(
            &map,
            buckets as usize * size_of::<Bucket<V>>(),
            "mmap of a peer table (needs BPF_F_MMAPABLE)",
        )?;
        Ok(Self {
            mapping,
            buckets,
            seed,
            _map: map,
            _value: PhantomData,
        })
    }

    /// Slot `way` of bucket `bucket` (`bucket < buckets`, `way < TABLE_WAYS`).
    fn slot(&self, bucket: u32, way: u32) -> *mut Slot<V> {
        debug_assert!(bucket < self.buckets && way < TABLE_WAYS);
        let b = self.mapping.addr.cast::<Bucket<V>>();
        // SAFETY: within the mapping (`buckets` whole buckets); a field address, not a read.
        unsafe { addr_of_mut!((*b.add(bucket as usize)).ways[way as usize]) }
    }

    /// The word of slot `s`, as an atomic.
    fn word(&self, s: *mut Slot<V>) -> &AtomicU64 {
        // SAFETY: `s` is a slot of the mapping (alive as long as `self`); its word is the
        // first field, 8-byte aligned, and every access to it (the program's included)
        // is a single aligned 64-bit load or atomic.
        unsafe { AtomicU64::from_ptr(addr_of_mut!((*s).word)) }
    }

    /// `key`'s hash (its tag) and its two buckets.
    fn choices(&self, key: &FlowKey) -> (u32, [u32; 2]) {
        let hash = table_hash(key, self.seed);
        (hash, self.buckets_of(hash))
    }

    /// Where `key` may live: its hash and its two buckets, for [`PeerTable::prefetch`] and
    /// [`PeerTable::put_at`].
    pub fn locate(&self, key: &FlowKey) -> Located {
        let (hash, buckets) = self.choices(key);
        Located { hash, buckets }
    }

    /// Starts reading the two buckets of a key (every cache line of them), so that a
    /// [`PeerTable::put_at`] of it a few keys later finds them in the cache: in tables
    /// of a million connections each bucket is a cache miss (and a TLB miss), which a
    /// batch of writes overlaps rather than waits for one after the other.
    pub fn prefetch(&self, at: &Located) {
        for b in at.buckets {
            let start = self.slot(b, 0).cast::<u8>();
            let mut offset = 0;
            while offset < size_of::<Bucket<V>>() {
                // SAFETY: an address within bucket `b` of the mapping; a prefetch reads
                // nothing into the program and never faults.
                prefetch_line(unsafe { start.add(offset) });
                offset += CACHE_LINE;
            }
        }
    }

    /// The two buckets of a key of hash `hash`.
    fn buckets_of(&self, hash: u32) -> [u32; 2] {
        let mask = self.buckets - 1;
        [hash & mask, second_choice(hash) & mask]
    }

    /// The slot holding `key` live.
    fn find(&self, key: &FlowKey, hash: u32, buckets: [u32; 2]) -> Option<*mut Slot<V>> {
        buckets.into_iter().find_map(|b| {
            (0..TABLE_WAYS).map(|w| self.slot(b, w)).find(|&s| {
                let word = self.word(s).load(Ordering::Acquire);
                // SAFETY: a slot of the mapping; only this writer rewrites its key.
                word & SLOT_LIVE != 0
                    && (word >> SLOT_TAG_SHIFT) as u32 == hash
                    && same_flow(unsafe { &*addr_of!((*s).key) }, key)
            })
        })
    }

    /// Rewrites slot `s` to `key` -> `value` (tag `hash`).
    fn write(&self, s: *mut Slot<V>, key: &FlowKey, value: &V, hash: u32) {
        let word = self.word(s);
        let next = free_word(word.load(Ordering::Relaxed));
        word.swap(next, Ordering::SeqCst);
        // SAFETY: a slot of the mapping that no reader takes while its word is not live
        // (and whose copy a reader throws away if the word changed under it).
        unsafe {
            addr_of_mut!((*s).key).write_volatile(*key);
            addr_of_mut!((*s).value).write_volatile(*value);
        }
        word.swap(live_word(next, hash), Ordering::SeqCst);
    }

    /// Puts `key` -> `value`: over the key's own slot if it holds one, else into a free
    /// way of the less full of its two buckets, else into the way of an entry of those
    /// buckets that moves to a free way of its own other bucket ([`PeerTable::make_room`]).
    /// `false`: no room (nothing written).
    pub fn put(&mut self, key: &FlowKey, value: &V) -> bool {
        let at = self.locate(key);
        self.put_at(key, value, &at)
    }

    /// [`PeerTable::put`] of a key [`PeerTable::locate`] located.
    pub fn put_at(&mut self, key: &FlowKey, value: &V, at: &Located) -> bool {
        let Located { hash, buckets } = *at;
        if let Some(s) = self.find(key, hash, buckets) {
            self.write(s, key, value, hash);
            return true;
        }
        let (first, second) = (self.free_ways(buckets[0]), self.free_ways(buckets[1]));
        let target = if second.0 > first.0 {
            second.1
        } else {
            first.1
        };
        let Some(s) = target.or_else(|| self.make_room(buckets)) else {
            return false;
        };
        self.write(s, key, value, hash);
        true
    }

    /// With both `buckets` full: moves one of their entries whose other bucket has a
    /// free way there, and returns the way it left (free). The entry is written into its
    /// new way before it leaves the old one, so a reader that searches its two buckets
    /// finds it in one or the other (or both, for an instant): only a reader that looked
    /// at the new bucket before the copy and at the old one after the move misses it,
    /// and takes that one packet for one of a connection the tables do not hold.
    /// `None`: no entry can move (one step, as the two-choice load leaves this rare).
    fn make_room(&self, buckets: [u32; 2]) -> Option<*mut Slot<V>> {
        for b in buckets {
            for w in 0..TABLE_WAYS {
                let s = self.slot(b, w);
                let hash = (self.word(s).load(Ordering::Relaxed) >> SLOT_TAG_SHIFT) as u32;
                let [one, two] = self.buckets_of(hash);
                let other = if one == b { two } else { one };
                if other == b {
                    continue;
                }
                let Some(to) = self.free_ways(other).1 else {
                    continue;
                };
                // SAFETY: a live slot of the mapping; only this writer rewrites it.
                let (key, value) = unsafe {
                    (
                        addr_of!((*s).key).read_volatile(),
                        addr_of!((*s).value).read_volatile(),
                    )
                };
                self.write(to, &key, &value, hash);
                let word = self.word(s);
                word.swap(free_word(word.load(Ordering::Relaxed)), Ordering::SeqCst);
                return Some(s);
            }
        }
        None
    }

    /// How many ways of bucket `b` are free, and the first.
    fn free_ways(&self, b: u32) -> (u32, Option<*mut Slot<V>>) {
        (0..TABLE_WAYS)
            .map(|w| self.slot(b, w))
            .filter(|&s| self.word(s).load(Ordering::Relaxed) & SLOT_LIVE == 0)
            .fold((0, None), |(n, first), s| (n + 1, first.or(Some(s))))
    }

    /// Removes `key`; `false` if the table did not hold it.
    pub fn remove(&mut self, key: &FlowKey) -> bool {
        let at = self.locate(key);
        self.remove_at(key, &at)
    }

    /// [`PeerTable::remove`] of a key [`PeerTable::locate`] located.
    pub fn remove_at(&mut self, key: &FlowKey, at: &Located) -> bool {
        let Located { hash, buckets } = *at;
        let Some(s) = self.find(key, hash, buckets) else {
            return false;
        };
        let word = self.word(s);
        word.swap(free_word(word.load(Ordering::Relaxed)), Ordering::SeqCst);
        true
    }

    /// The value of `key`, if the table holds it.
    pub fn get(&self, key: &FlowKey) -> Option<V> {
        let (hash, buckets) = self.choices(key);
        let s = self.find(key, hash, buckets)?;
        // SAFETY: a live slot of the mapping; only this writer rewrites it.
        Some(unsafe { addr_of!((*s).value).read_volatile() })
    }

    /// How many keys it holds: every slot's word read (for status and tests, not a
    /// path that runs per connection).
    pub fn len(&self) -> usize {
        (0..self.buckets)
            .flat_map(|b| (0..TABLE_WAYS).map(move |w| (b, w)))
            .filter(|&(b, w)| self.word(self.slot(b, w)).load(Ordering::Relaxed) & SLOT_LIVE != 0)
            .count()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a key may live in a [`PeerTable`]: its hash (the slot's tag) and its buckets.
#[derive(Clone, Copy, Debug)]
pub struct Located {
    hash: u32,
    buckets: [u32; 2],
}
