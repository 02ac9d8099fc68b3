//! A hint to the CPU to start loading a cache line now, for tables far larger than the
//! caches whose next few lookups are known ahead.

/// Bytes of a cache line on the machines lb runs on.
pub(crate) const CACHE_LINE: usize = 64;

/// Starts loading the cache line at `p` (nothing where the target has no such hint).
#[inline(always)]
pub(crate) fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch has no effect on memory and does not fault, whatever `p` is.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
