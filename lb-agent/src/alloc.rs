//! The process's memory allocator: mimalloc instead of the C library's malloc.
//!
//! At 100,000 servers the agent allocates and frees millions of small objects a second
//! (the status snapshot's records, probe outcomes, report batches). glibc's malloc spends
//! over 40 % of a snapshot build in its own bookkeeping (`_int_malloc`, `unlink_chunk`,
//! `malloc_consolidate`, `_int_free`); mimalloc's per-thread free lists take that off. Declared in the
//! library so that every binary built on the agent (`lb-agent`, the benchmarks, the tests)
//! runs on the same allocator.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`, inherited by
/// its threads and children).
///
/// mimalloc asks for huge pages on its arenas (`MADV_HUGEPAGE`) and gives memory back
/// in 64 KiB parts a second after it was freed. With huge pages on, the next
/// allocation in a range given back faults in a whole 2 MiB page, which the kernel
/// zeroes first. Where tables grow and batches come and go, as in the sync thread
/// applying a peer's records, that zeroing took a third of the thread's time, and the
/// thread applied 40 % fewer records per CPU-second (`lb-sync-bench --only live-maps`,
/// with `MIMALLOC_ALLOW_THP=0` against without). Pages the process already has keep
/// their size; call this first thing.
pub fn no_transparent_huge_pages() -> std::io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes an integer flag and no pointers.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_process_runs_without_transparent_huge_pages_after_the_call() {
        super::no_transparent_huge_pages().expect("prctl");
        // SAFETY: PR_GET_THP_DISABLE takes no pointers.
        let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(disabled, 1);
    }
}
