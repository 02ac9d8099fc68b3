//! Atomic Maglev table publication: every service owns a pair of tables (live and next)
//! of its own size, a contiguous run of blocks in the one `mmap`ed `LB_MAGLEV` pool (16
//! slots per 64-byte value, so a table is one contiguous run of `u32`s), allocated by
//! [`super::maglev_pool`]; a per-service generation word says which of the two is live.
//! The pair's base block and size live in the service's VIP slot (`ServiceMeta`).
//!
//! Publishing a table of the service's size writes the table that is not live (one
//! `memcpy` through the mapping, no syscall), then flips the generation with one aligned
//! 64-bit `AtomicU64` Release store, paired with the program's address-dependent read
//! (see `publish`). A packet reads the generation once and then its slot, so it sees the
//! old table or the new one, never a mix. The table a flip retires is overwritten only
//! by the publish after next, and never within [`GRACE`] of the flip, so a packet that
//! read the old generation just before the flip (a few nanoseconds of XDP work, in
//! softirq context that cannot sleep) has long finished with it.
//!
//! Publishing a table of another size (a new service, or one resized) takes a new pair
//! from the pool and writes the table into both of its halves, so whichever generation
//! a packet reads it finds that table; the caller then switches the service's VIP slot
//! to the new pair (one VIP index flip) and retires the old pair, which returns to the
//! pool only [`GRACE`] after that switch. The next flip of the service waits [`GRACE`]
//! too, so a packet still on the old slot never reads a half of the old pair rewritten.
//!
//! An array-of-maps swap would also be atomic, but the kernel ends every update of such
//! a map with `synchronize_rcu()` (about 10 ms measured here), far over the
//! sub-millisecond budget from verdict to maps written.

use std::{
    ptr,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use aya::maps::MapData;
use lb_common::{
    MAGLEV_BLOCKS, MAX_SERVICES, MaglevBlock, is_maglev_size, maglev_block_index,
    maglev_table_blocks,
};

use super::{
    maglev_pool::{Pool, pair_blocks},
    mapping::Mapping,
};
use crate::dataplane::DataplaneError;

/// Minimum time between a flip and the next write into the table it retired. A packet
/// holds the generation it read for the few nanoseconds until it reads its slot, in
/// softirq context that is not preempted (on non-RT kernels), so 100 µs is a margin of
/// three orders of magnitude. Even a reader stalled past it would read one whole `u32`
/// slot of a newer table (aligned stores are atomic): a valid backend id, or
/// `NO_BACKEND` (dropped and counted) — never a torn value.
pub const GRACE: Duration = Duration::from_micros(100);

/// Where a service's pair of tables lies in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    /// First block (`ServiceMeta::maglev_base`).
    pub base: u32,
    /// Slots per table (`ServiceMeta::maglev_size`).
    pub size: u32,
}

/// What a publish did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::dataplane) enum Published {
    /// The table went into the service's pair (generation flipped).
    InPlace,
    /// The service has a new pair (`now`): its VIP slot must be switched to it, then
    /// `old` (if any) retired with [`MaglevTables::retire`].
    Moved { now: Pair, old: Option<Pair> },
}

/// `LB_MAGLEV` and `LB_MAGLEV_GEN`, mapped into the agent, and the pool's allocation.
pub(in crate::dataplane) struct MaglevTables {
    tables: Mapping,
    generations: Mapping,
    /// When each service's generation last flipped (or its pair last moved).
    last_flip: Vec<Instant>,
    /// Each service id's pair, if it has one.
    pairs: Vec<Option<Pair>>,
    pool: Pool,
    /// Pairs no VIP slot names any more, and since when: free after [`GRACE`].
    retired: Vec<(Instant, Pair)>,
    /// Keep the maps open for as long as they are mapped.
    _maps: (MapData, MapData),
}

impl MaglevTables {
    /// Maps the two maps. `live` lists the pairs the live VIP slots name (an adopted
    /// pool holds the previous agent's tables): they stay allocated to their services.
    /// A pair that cannot be taken (no table size, outside the pool, overlapping another)
    /// is skipped with a warning: that service gets a new pair at its next publish.
    pub(in crate::dataplane) fn new(
        tables: MapData,
        generations: MapData,
        live: impl IntoIterator<Item = (u32, Pair)>,
    ) -> Result<Self, DataplaneError> {
        let t = Mapping::new(
            &tables,
            MAGLEV_BLOCKS as usize * size_of::<MaglevBlock>(),
            "mmap of LB_MAGLEV (needs BPF_F_MMAPABLE)",
        )?;
        let g = Mapping::new(
            &generations,
            MAX_SERVICES as usize * size_of::<u64>(),
            "mmap of LB_MAGLEV_GEN (needs BPF_F_MMAPABLE)",
        )?;
        let (pool, pairs) = recover(live);
        // A restarted agent does not know when the last flip happened: assume just now.
        let now = Instant::now();
        Ok(Self {
            tables: t,
            generations: g,
            last_flip: vec![now; MAX_SERVICES as usize],
            pairs,
            pool,
            retired: Vec::new(),
            _maps: (tables, generations),
        })
    }

    fn generation(&self, service_id: u32) -> &AtomicU64 {
        // SAFETY: `service_id < MAX_SERVICES` (checked by callers); array values are
        // 8-byte strided and aligned inside the page-aligned mapping, and the word is only
        // accessed atomically.
        unsafe {
            &*(self
                .generations
                .addr
                .cast::<AtomicU64>()
                .add(service_id as usize))
        }
    }

    /// The live generation (0 or 1) of a service.
    pub(in crate::dataplane) fn live_generation(&self, service_id: u32) -> u64 {
        self.generation(service_id).load(Ordering::Acquire) & 1
    }

    /// The pair a service's tables are in, if it has one.
    pub(in crate::dataplane) fn pair(&self, service_id: u32) -> Option<Pair> {
        self.pairs.get(service_id as usize).copied().flatten()
    }

    /// Publishes `table` (of one of `MAGLEV_SIZES`) as the service's table.
    pub(in crate::dataplane) fn publish(
        &mut self,
        service_id: u32,
        table: &[u32],
    ) -> Result<Published, DataplaneError> {
        let size = u32::try_from(table.len()).unwrap_or(0);
        if !is_maglev_size(size) || service_id >= MAX_SERVICES {
            return Err(DataplaneError::TableSize {
                service_id,
                len: table.len(),
            });
        }
        self.reclaim();
        let current = self.pair(service_id);
        if current.is_some_and(|p| p.size == size) {
            self.flip_in(service_id, table);
            return Ok(Published::InPlace);
        }
        let len = pair_blocks(size);
        let base = self.pool.alloc(len).ok_or(DataplaneError::MaglevPoolFull {
            service_id,
            size,
            largest: self.pool.largest_free(),
            wanted: len,
        })?;
        let now = Pair { base, size };
        // No VIP slot names this pair yet: both halves may be written at once.
        for generation in 0..2 {
            // SAFETY: the pair lies inside the mapping (the pool is `MAGLEV_BLOCKS` long).
            unsafe { self.write(now, generation, table) };
        }
        self.pairs[service_id as usize] = Some(now);
        // The VIP slot switches right after: the next flip waits out a packet that read
        // the old slot (and with it the old pair) just before.
        self.last_flip[service_id as usize] = Instant::now();
        Ok(Published::Moved { now, old: current })
    }

    /// Writes the half of the service's pair that is not live and flips to it.
    fn flip_in(&mut self, service_id: u32, table: &[u32]) {
        let pair = self.pairs[service_id as usize].expect("checked by the caller");
        // Spin rather than sleep: the wait is at most GRACE, and a sleeping thread can
        // wait milliseconds for a busy CPU.
        let flipped = self.last_flip[service_id as usize];
        while flipped.elapsed() < GRACE {
            std::hint::spin_loop();
        }
        let next = self.live_generation(service_id) ^ 1;
        // SAFETY: the pair lies inside the mapping; no packet reads this half until the
        // generation flips below.
        unsafe { self.write(pair, next, table) };
        // The flip: a Release store. Every write of the table above happens-before it
        // for any reader that observes the new generation. The XDP program's side is a
        // plain load of the generation whose value forms the address of its slot load
        // (`maglev_block_index(base, size, generation, slot)` in lb-ebpf's flow.rs): an
        // address dependency, which every architecture the kernel JITs BPF for orders
        // like an Acquire/consume load (the kernel's rcu_dereference relies on the same
        // guarantee). So a packet that sees the new generation reads the new table's
        // slots, never bytes from before this copy, on arm64 as on x86 (whose TSO would
        // order even independent loads). docs/restarts.md explains the pairing.
        self.generation(service_id).store(next, Ordering::Release);
        self.last_flip[service_id as usize] = Instant::now();
    }

    /// Writes `(slot, id)` into the live half of the service's pair, in place: each slot
    /// one aligned `u32` store (Release), so a packet reads that slot's old or new id,
    /// never a torn value; a packet reads one slot, so it sees one or the other. Neither
    /// the generation nor the retired half is touched: [`GRACE`] is not involved (a
    /// packet still reading the retired half after a flip reads the table it saw).
    /// Which ids may be written when (both the old and the new id must be allowed to take
    /// the packet) is the caller's rule: docs/internals/publish.md.
    pub(in crate::dataplane) fn write_slots(
        &mut self,
        service_id: u32,
        slots: &[(u32, u32)],
    ) -> Result<(), DataplaneError> {
        let Some(pair) = self.pair(service_id) else {
            return Err(DataplaneError::SlotOutside {
                service_id,
                slot: slots.first().map_or(0, |s| s.0),
                size: 0,
            });
        };
        if let Some(&(slot, _)) = slots.iter().find(|&&(s, _)| s >= pair.size) {
            return Err(DataplaneError::SlotOutside {
                service_id,
                slot,
                size: pair.size as usize,
            });
        }
        let offset = table_offset(pair, self.live_generation(service_id));
        for &(slot, id) in slots {
            // SAFETY: `slot < pair.size`, so the word lies inside the pair's live half,
            // inside the mapping; it is 4-byte aligned (the mapping is page-aligned and
            // slots are `u32`s) and the XDP program only loads it whole.
            let word = unsafe {
                &*(self
                    .tables
                    .addr
                    .cast::<AtomicU32>()
                    .add(offset + slot as usize))
            };
            word.store(id, Ordering::Release);
        }
        Ok(())
    }

    /// Copies `table` into half `generation` of `pair`.
    ///
    /// # Safety
    /// `pair` must lie inside the pool and `table.len() == pair.size`.
    unsafe fn write(&mut self, pair: Pair, generation: u64, table: &[u32]) {
        debug_assert_eq!(table.len(), pair.size as usize);
        let offset = table_offset(pair, generation);
        // SAFETY: per the contract, the table's slots lie inside the mapping.
        unsafe {
            ptr::copy_nonoverlapping(
                table.as_ptr(),
                self.tables.addr.cast::<u32>().add(offset),
                table.len(),
            );
        }
    }

    /// The service is gone (its VIP slot was removed): its pair returns to the pool
    /// [`GRACE`] from now.
    pub(in crate::dataplane) fn release(&mut self, service_id: u32) {
        if let Some(pair) = self
            .pairs
            .get_mut(service_id as usize)
            .and_then(Option::take)
        {
            self.retire(pair);
        }
    }

    /// No VIP slot names `pair` any more (as of now): it returns to the pool [`GRACE`]
    /// from now.
    pub(in crate::dataplane) fn retire(&mut self, pair: Pair) {
        self.retired.push((Instant::now(), pair));
    }

    /// The VIP slot could not be switched to `now`: the service keeps `old`, `now` is
    /// retired (nothing named it, but a grace costs nothing).
    pub(in crate::dataplane) fn undo_move(
        &mut self,
        service_id: u32,
        now: Pair,
        old: Option<Pair>,
    ) {
        self.pairs[service_id as usize] = old;
        self.retire(now);
    }

    /// Returns the retired pairs whose grace is over to the pool.
    fn reclaim(&mut self) {
        let pool = &mut self.pool;
        self.retired.retain(|(when, pair)| {
            let done = when.elapsed() >= GRACE;
            if done {
                pool.free(pair.base, pair_blocks(pair.size));
            }
            !done
        });
    }

    /// A copy of the live table of a service (empty if it has none; tests and status).
    pub(in crate::dataplane) fn live_table(&self, service_id: u32) -> Vec<u32> {
        let Some(pair) = self.pair(service_id) else {
            return Vec::new();
        };
        let offset = table_offset(pair, self.live_generation(service_id));
        let mut out = vec![0u32; pair.size as usize];
        // SAFETY: reading inside the mapping.
        unsafe {
            ptr::copy_nonoverlapping(
                self.tables.addr.cast::<u32>().add(offset),
                out.as_mut_ptr(),
                out.len(),
            );
        }
        out
    }

    /// Blocks of the pool not allocated (retired pairs count as allocated).
    pub(in crate::dataplane) fn free_blocks(&self) -> u64 {
        self.pool.free_blocks()
    }
}

/// The pool and per-service pairs rebuilt from the pairs the live VIP slots name.
fn recover(live: impl IntoIterator<Item = (u32, Pair)>) -> (Pool, Vec<Option<Pair>>) {
    let mut pool = Pool::new(MAGLEV_BLOCKS);
    let mut pairs = vec![None; MAX_SERVICES as usize];
    for (service_id, pair) in live {
        if pair.size == 0 {
            continue;
        }
        let taken = match pairs.get(service_id as usize) {
            Some(None) => pool
                .reserve(pair.base, pair.size)
                .map_err(|e| e.to_string()),
            Some(Some(_)) => Err("a second slot with the same service id".to_string()),
            None => Err("service id outside the maps".to_string()),
        };
        match taken {
            Ok(()) => pairs[service_id as usize] = Some(pair),
            Err(why) => tracing::warn!(
                service_id,
                base = pair.base,
                size = pair.size,
                %why,
                "adopted Maglev table pair not kept; the service gets a new pair at its next publish"
            ),
        }
    }
    (pool, pairs)
}

/// Offset in `u32`s of slot 0 of half `generation` of `pair` in the mapping.
fn table_offset(pair: Pair, generation: u64) -> usize {
    debug_assert_eq!(
        maglev_block_index(pair.base, pair.size, 1, 0) - pair.base,
        maglev_table_blocks(pair.size)
    );
    maglev_block_index(pair.base, pair.size, generation, 0) as usize * size_of::<MaglevBlock>() / 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_keeps_live_pairs_and_skips_conflicting_ones() {
        let a = Pair {
            base: 0,
            size: 4099,
        };
        let b = Pair {
            base: pair_blocks(4099),
            size: 65537,
        };
        let overlapping = Pair {
            base: 10,
            size: 4099,
        };
        let bad_size = Pair {
            base: 500_000,
            size: 4100,
        };
        let (pool, pairs) = recover([(3, a), (7, b), (9, overlapping), (11, bad_size)]);
        assert_eq!(pairs[3], Some(a));
        assert_eq!(pairs[7], Some(b));
        assert_eq!(pairs[9], None, "overlaps service 3's pair");
        assert_eq!(pairs[11], None, "no table size");
        assert_eq!(
            pool.free_blocks(),
            u64::from(MAGLEV_BLOCKS - pair_blocks(4099) - pair_blocks(65537))
        );
        // A new allocation never lands on a recovered pair.
        let mut pool = pool;
        let next = pool.alloc(pair_blocks(4099)).unwrap();
        assert!(next >= b.base + pair_blocks(65537));
    }
}
