//! Each CPU's cache of settled flows in front of `LB_FLOWS`: a direct-mapped per-CPU
//! array (`LB_FLOW_CACHE`) whose lookup the verifier inlines, so that an established
//! packet costs a cheap hash, one inlined lookup and a key compare instead of a call
//! into the kernel's LRU hash table.
//!
//! `LB_FLOWS` stays the truth. An entry is a copy of a flow's pinned backend (and nat
//! source) that this CPU read or wrote in `LB_FLOWS` during the current tick (one
//! jiffy), taken only when the flow was settled (no `FLOW_F_*` flag: handshake done,
//! nothing awaited); it is used only in that same tick, only for packets that need no
//! flow state (TCP without SYN/FIN/RST; UDP in dsr), and only while the backend is in
//! traffic. So each CPU goes through `LB_FLOWS` at least once per tick per flow (there
//! it refreshes `last_seen_ns` and, for nat, verifies the reverse entry, as before), a
//! flow that moves to another CPU finds its entry in `LB_FLOWS`, and a change of table
//! or health reaches a cached flow within one tick at most (a backend leaving traffic:
//! at once). A collision simply replaces the slot's flow (it goes through `LB_FLOWS`
//! on its next packet). docs/internals/fast-path.md has the argument in full.

use lb_common::{
    NO_BACKEND,
    hash::flow_cache_slot,
    maps::{FlowCacheEntry, FlowKey},
    table::same_flow,
};

use crate::{maps::LB_FLOW_CACHE, nat::Source};

/// The cached flow `key` if this CPU cached it during tick `tick`.
#[inline(always)]
pub fn hit(key: &FlowKey, tick: u32) -> Option<&'static FlowCacheEntry> {
    let e = LB_FLOW_CACHE.get_ptr(flow_cache_slot(key))?;
    // SAFETY: a per-CPU slot; only this CPU (preemption off) writes it, not while
    // this reference lives.
    let e = unsafe { &*e };
    if e.backend_id == NO_BACKEND || e.tick != tick || !same_flow(&e.key, key) {
        return None;
    }
    Some(e)
}

/// Caches flow `key` as settled on `backend_id` (nat: from `src`) during `tick`,
/// replacing whatever flow held its slot.
#[inline(always)]
pub fn fill(key: &FlowKey, backend_id: u32, tick: u32, src: Source) {
    let Some(e) = LB_FLOW_CACHE.get_ptr_mut(flow_cache_slot(key)) else {
        return;
    };
    // SAFETY: as in `hit`.
    let e = unsafe { &mut *e };
    e.key = *key;
    e.backend_id = backend_id;
    e.tick = tick;
    e.nat_port = src.port;
    e.nat_addr = src.addr;
}

/// Drops flow `key` from this CPU's cache (it is no longer settled).
#[inline(always)]
pub fn forget(key: &FlowKey) {
    let Some(e) = LB_FLOW_CACHE.get_ptr_mut(flow_cache_slot(key)) else {
        return;
    };
    // SAFETY: as in `hit`.
    let e = unsafe { &mut *e };
    if e.backend_id != NO_BACKEND && same_flow(&e.key, key) {
        e.backend_id = NO_BACKEND;
    }
}
