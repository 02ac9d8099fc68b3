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
