//! Atomic Maglev table publication: two tables per service in one `mmap`ed array (16
//! slots per 64-byte value, so a table is one contiguous run of `u32`s), and a
//! per-service generation word saying which one is live.
//!
//! Publishing writes the table that is not live (one `memcpy` of 256 KiB through the
//! mapping, no syscall), then flips the generation with one aligned 64-bit `AtomicU64`
//! Release store, paired with the program's address-dependent read (see `publish`). A
//! packet reads the generation once and then its slot, so it sees the old table or the
//! new one, never a mix. The table a flip retires is overwritten only by
//! the publish after next, and never within [`GRACE`] of the flip, so a packet that read
//! the old generation just before the flip (a few nanoseconds of XDP work, in softirq
//! context that cannot sleep) has long finished with it.
//!
//! An array-of-maps swap would also be atomic, but the kernel ends every update of such
//! a map with `synchronize_rcu()` (about 10 ms measured here), far over the
//! sub-millisecond budget from verdict to maps written.

use std::{
    ptr,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use aya::maps::MapData;
use lb_common::{MAGLEV_BLOCKS, MAGLEV_RING_SIZE, MAX_SERVICES, MaglevBlock, maglev_block_index};

use super::{DataplaneError, mapping::Mapping};

/// Minimum time between a flip and the next write into the table it retired. A packet
/// holds the generation it read for the few nanoseconds until it reads its slot, in
/// softirq context that is not preempted (on non-RT kernels), so 100 µs is a margin of
/// three orders of magnitude. Even a reader stalled past it would read one whole `u32`
/// slot of a newer table (aligned stores are atomic): a valid backend id, or
/// `NO_BACKEND` (dropped and counted) — never a torn value.
pub const GRACE: Duration = Duration::from_micros(100);

/// `LB_MAGLEV` and `LB_MAGLEV_GEN`, mapped into the agent.
pub(super) struct MaglevTables {
    tables: Mapping,
    generations: Mapping,
    /// When each service's generation last flipped.
    last_flip: Vec<Instant>,
    /// Keep the maps open for as long as they are mapped.
    _maps: (MapData, MapData),
}

impl MaglevTables {
    pub(super) fn new(tables: MapData, generations: MapData) -> Result<Self, DataplaneError> {
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
        // A restarted agent does not know when the last flip happened: assume just now.
        let now = Instant::now();
        Ok(Self {
            tables: t,
            generations: g,
            last_flip: vec![now; MAX_SERVICES as usize],
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
    pub(super) fn live_generation(&self, service_id: u32) -> u64 {
        self.generation(service_id).load(Ordering::Acquire) & 1
    }

    /// Writes `table` as the service's next table and makes it live.
    pub(super) fn publish(&mut self, service_id: u32, table: &[u32]) -> Result<(), DataplaneError> {
        if table.len() != MAGLEV_RING_SIZE as usize || service_id >= MAX_SERVICES {
            return Err(DataplaneError::TableSize {
                service_id,
                len: table.len(),
                expected: MAGLEV_RING_SIZE,
            });
        }
        // Spin rather than sleep: the wait is at most GRACE, and a sleeping thread can
        // wait milliseconds for a busy CPU.
        let flipped = self.last_flip[service_id as usize];
        while flipped.elapsed() < GRACE {
            std::hint::spin_loop();
        }
        let next = self.live_generation(service_id) ^ 1;
        let offset = table_offset(service_id, next);
        // SAFETY: the table's slots lie inside the mapping (`table_offset`); no
        // packet reads this table until the generation flips below.
        unsafe {
            ptr::copy_nonoverlapping(
                table.as_ptr(),
                self.tables.addr.cast::<u32>().add(offset),
                table.len(),
            );
        }
        // The flip: a Release store. Every write of the table above happens-before it
        // for any reader that observes the new generation. The XDP program's side is a
        // plain load of the generation whose value forms the address of its slot load
        // (`maglev_block_index(service_id, generation, slot)` in lb-ebpf's flow.rs): an
        // address dependency, which every architecture the kernel JITs BPF for orders
        // like an Acquire/consume load (the kernel's rcu_dereference relies on the same
        // guarantee). So a packet that sees the new generation reads the new table's
        // slots, never bytes from before this copy, on arm64 as on x86 (whose TSO would
        // order even independent loads). docs/restarts.md explains the pairing.
        self.generation(service_id).store(next, Ordering::Release);
        self.last_flip[service_id as usize] = Instant::now();
        Ok(())
    }

    /// A copy of the live table of a service (for tests and status).
    pub(super) fn live_table(&self, service_id: u32) -> Vec<u32> {
        let offset = table_offset(service_id, self.live_generation(service_id));
        let mut out = vec![0u32; MAGLEV_RING_SIZE as usize];
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
}

/// Offset in `u32`s of slot 0 of a table in the mapping.
fn table_offset(service_id: u32, generation: u64) -> usize {
    maglev_block_index(service_id, generation, 0) as usize * size_of::<MaglevBlock>() / 4
}
