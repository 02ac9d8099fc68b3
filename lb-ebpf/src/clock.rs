//! The flow clock: `CLOCK_MONOTONIC` nanoseconds read at most once per jiffy per CPU.
//!
//! `bpf_ktime_get_ns` is a helper call into the timekeeping code (an indirect call to
//! the clocksource): about 30 ns per packet here, a quarter of an established packet's
//! cost. The flow table only needs a timestamp good to a tick (it refreshes
//! `last_seen_ns` once a second), so the value is cached per CPU and re-read only when
//! `jiffies` (one load: the verifier inlines `bpf_jiffies64`) has moved. The cached
//! value lags the true clock by less than one tick (1/`CONFIG_HZ` s).

use aya_ebpf::helpers::{bpf_jiffies64, bpf_ktime_get_ns};

use crate::maps::LB_CLOCK;

/// A reading of the flow clock.
#[derive(Clone, Copy)]
pub struct Now {
    /// `CLOCK_MONOTONIC` in nanoseconds, at most one tick old.
    pub ns: u64,
    /// The tick the reading belongs to (low 32 bits of `jiffies`).
    pub tick: u32,
}

/// The current tick (low 32 bits of `jiffies`), as in [`Now::tick`].
#[inline(always)]
pub fn tick() -> u32 {
    // SAFETY: a helper without preconditions.
    unsafe { bpf_jiffies64() as u32 }
}

/// Reads the flow clock.
#[inline(always)]
pub fn now() -> Now {
    // SAFETY: helpers without preconditions.
    let jiffies = unsafe { bpf_jiffies64() };
    let tick = jiffies as u32;
    let Some(c) = LB_CLOCK.get_ptr_mut(0) else {
        // SAFETY: as above.
        let ns = unsafe { bpf_ktime_get_ns() };
        return Now { ns, tick };
    };
    // SAFETY: a per-CPU slot; only this CPU (with preemption off) touches it.
    let c = unsafe { &mut *c };
    if c.jiffies != jiffies || c.ns == 0 {
        c.jiffies = jiffies;
        // SAFETY: as above.
        c.ns = unsafe { bpf_ktime_get_ns() };
    }
    Now { ns: c.ns, tick }
}
