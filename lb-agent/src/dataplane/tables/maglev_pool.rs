//! The `LB_MAGLEV` pool's allocator: which runs of blocks hold a service's pair of
//! Maglev tables, and which are free.
//!
//! Every service owns one contiguous run of `2 * maglev_table_blocks(size)` blocks (its
//! live and next table). Free space is a set of free runs kept coalesced; an allocation
//! takes the lowest run that fits (first fit) and gives the rest back. Services of one
//! size class take runs of one length, so a freed run is reused exactly by the next
//! service of that size and the rest merges with its neighbours: the pool fragments only
//! when services of many sizes come and go, and then an allocation fails with a clear
//! error (the service keeps its current table) rather than overlapping another.
//!
//! Nothing here is persisted: a restarted agent rebuilds the allocator from the bases
//! and sizes the live VIP slots hold ([`Pool::reserve`]), so it never hands a live
//! table's blocks to another service.

use std::collections::BTreeMap;

use lb_common::{MAGLEV_TABLES_PER_SERVICE, is_maglev_size, maglev_table_blocks};

/// Blocks one service's pair of `size`-slot tables takes.
pub fn pair_blocks(size: u32) -> u32 {
    MAGLEV_TABLES_PER_SERVICE * maglev_table_blocks(size)
}

/// Why a run could not be reserved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    #[error("{size} is not a Maglev table size")]
    BadSize { size: u32 },
    #[error("blocks {base}..{end} lie outside the pool of {total}")]
    OutOfPool { base: u32, end: u64, total: u32 },
    #[error("blocks {base}..{end} overlap a run already in use")]
    Overlap { base: u32, end: u64 },
}

/// Free runs of a pool of `total` blocks.
#[derive(Debug, Clone)]
pub struct Pool {
    total: u32,
    /// Start -> length of every free run; no two runs touch (they are merged).
    free: BTreeMap<u32, u32>,
}

impl Pool {
    /// A pool of `total` blocks, all free.
    pub fn new(total: u32) -> Self {
        let mut free = BTreeMap::new();
        if total > 0 {
            free.insert(0, total);
        }
        Self { total, free }
    }

    /// Blocks not allocated.
    pub fn free_blocks(&self) -> u64 {
        self.free.values().map(|&n| u64::from(n)).sum()
    }

    /// The longest run an allocation could get now.
    pub fn largest_free(&self) -> u32 {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// Takes the lowest free run of `len` blocks; its first block.
    pub fn alloc(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return None;
        }
        let (&start, &have) = self.free.iter().find(|(_, n)| **n >= len)?;
        self.free.remove(&start);
        if have > len {
            self.free.insert(start + len, have - len);
        }
        Some(start)
    }

    /// Gives back the run `base..base + len` (which `alloc` or `reserve` handed out),
    /// merging it with free neighbours.
    pub fn free(&mut self, base: u32, len: u32) {
        if len == 0 {
            return;
        }
        let (mut start, mut n) = (base, len);
        if let Some((&prev, &prev_len)) = self.free.range(..base).next_back()
            && prev + prev_len == base
        {
            self.free.remove(&prev);
            start = prev;
            n += prev_len;
        }
        if let Some(&next_len) = self.free.get(&(base + len)) {
            self.free.remove(&(base + len));
            n += next_len;
        }
        debug_assert!(
            self.free
                .range(..start + n)
                .next_back()
                .is_none_or(|(&s, &l)| s + l <= start),
            "freed a run that was partly free"
        );
        self.free.insert(start, n);
    }

    /// Marks the pair of `size`-slot tables at `base` as in use (recovery from the VIP
    /// slots of a previous run). Refuses a size that is no table size, a run outside the
    /// pool, or one overlapping a run already in use.
    pub fn reserve(&mut self, base: u32, size: u32) -> Result<(), ReserveError> {
        if !is_maglev_size(size) {
            return Err(ReserveError::BadSize { size });
        }
        let len = pair_blocks(size);
        let end = u64::from(base) + u64::from(len);
        if end > u64::from(self.total) {
            return Err(ReserveError::OutOfPool {
                base,
                end,
                total: self.total,
            });
        }
        let Some((&start, &have)) = self.free.range(..=base).next_back() else {
            return Err(ReserveError::Overlap { base, end });
        };
        if u64::from(start) + u64::from(have) < end {
            return Err(ReserveError::Overlap { base, end });
        }
        self.free.remove(&start);
        if base > start {
            self.free.insert(start, base - start);
        }
        let tail = (u64::from(start) + u64::from(have) - end) as u32;
        if tail > 0 {
            self.free.insert(base + len, tail);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use lb_common::{MAGLEV_BLOCKS, MAGLEV_SIZES, MAX_SERVICES};

    use super::*;

    #[test]
    fn first_fit_and_reuse_of_a_freed_run() {
        let mut pool = Pool::new(100);
        assert_eq!(pool.alloc(30), Some(0));
        assert_eq!(pool.alloc(30), Some(30));
        assert_eq!(pool.alloc(30), Some(60));
        assert_eq!(pool.alloc(30), None, "10 blocks left");
        pool.free(30, 30);
        assert_eq!(pool.alloc(20), Some(30), "lowest run that fits");
        assert_eq!(pool.alloc(20), None, "10 + 10 free, not contiguous");
        assert_eq!(pool.free_blocks(), 20);
    }

    #[test]
    fn freed_neighbours_merge() {
        let mut pool = Pool::new(90);
        let runs: Vec<u32> = (0..3).map(|_| pool.alloc(30).unwrap()).collect();
        pool.free(runs[0], 30);
        pool.free(runs[2], 30);
        assert_eq!(pool.largest_free(), 30);
        pool.free(runs[1], 30);
        assert_eq!(pool.largest_free(), 90, "all three merged");
        assert_eq!(pool.alloc(90), Some(0));
    }

    #[test]
    fn reserve_splits_the_free_run_and_refuses_overlaps() {
        let size = MAGLEV_SIZES[0];
        let len = pair_blocks(size);
        let mut pool = Pool::new(10 * len);
        pool.reserve(3 * len, size).unwrap();
        assert_eq!(pool.free_blocks(), u64::from(9 * len));
        assert_eq!(
            pool.reserve(3 * len + 1, size),
            Err(ReserveError::Overlap {
                base: 3 * len + 1,
                end: u64::from(4 * len + 1)
            })
        );
        assert_eq!(
            pool.reserve(0, 4100),
            Err(ReserveError::BadSize { size: 4100 })
        );
        assert!(matches!(
            pool.reserve(9 * len + 1, size),
            Err(ReserveError::OutOfPool { .. })
        ));
        // Allocation goes around the reserved run.
        assert_eq!(pool.alloc(3 * len), Some(0));
        assert_eq!(pool.alloc(len), Some(4 * len));
    }

    #[test]
    fn the_pool_holds_the_largest_service_count_at_the_smallest_size() {
        let mut pool = Pool::new(MAGLEV_BLOCKS);
        for _ in 0..MAX_SERVICES {
            pool.alloc(pair_blocks(MAGLEV_SIZES[0]))
                .expect("room for every service at 4,099 slots");
        }
        // And the rest still takes services of 65,537 slots.
        assert!(pool.largest_free() >= pair_blocks(65537));
    }

    #[test]
    fn recovery_then_churn_never_overlaps() {
        // Services of every size come and go; every run handed out is checked against
        // every run in use.
        let mut pool = Pool::new(MAGLEV_BLOCKS);
        let mut used: Vec<(u32, u32)> = Vec::new();
        let mut seed = 0x1234_5678u32;
        for step in 0..4000 {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            if !used.is_empty() && (seed.is_multiple_of(3) || step % 500 == 499) {
                let (base, len) = used.swap_remove(seed as usize % used.len());
                pool.free(base, len);
                continue;
            }
            let len = pair_blocks(MAGLEV_SIZES[seed as usize % MAGLEV_SIZES.len()]);
            if let Some(base) = pool.alloc(len) {
                for &(b, l) in &used {
                    assert!(base + len <= b || b + l <= base, "overlap at step {step}");
                }
                used.push((base, len));
            }
        }
        // A restart: rebuild from what is in use; the free space is the same.
        let mut again = Pool::new(MAGLEV_BLOCKS);
        for &(base, len) in &used {
            let size = *MAGLEV_SIZES
                .iter()
                .find(|&&s| pair_blocks(s) == len)
                .unwrap();
            again.reserve(base, size).unwrap();
        }
        assert_eq!(again.free_blocks(), pool.free_blocks());
        assert_eq!(again.free, pool.free);
    }
}
