//! The data plane's clock read from userspace: `bpf_ktime_get_ns` is CLOCK_MONOTONIC.

/// CLOCK_MONOTONIC now in ns (the clock of `bpf_ktime_get_ns`).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec, and CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `lb_common::maps::nat_seconds` now: the coarse seconds of `LB_NAT`'s `last_seen`.
pub fn nat_seconds_now() -> u32 {
    lb_common::maps::nat_seconds(monotonic_ns())
}
