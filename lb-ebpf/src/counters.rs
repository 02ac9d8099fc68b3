//! Per-CPU counter increments: global outcomes, per service and per backend.
//!
//! Each CPU owns its slot, so plain read-modify-write through the map pointer is exact
//! without atomics; the agent sums the CPUs.

use crate::maps::{LB_BACKEND_STATS, LB_COUNTERS, LB_SERVICE_STATS};

/// Adds one to the global counter `idx` (`lb_common::counters::*`).
#[inline(always)]
pub fn count(idx: u32) {
    if let Some(p) = LB_COUNTERS.get_ptr_mut(idx) {
        // SAFETY: a per-CPU array slot, only this CPU writes it.
        unsafe { *p += 1 }
    }
}

/// A packet of `bytes` for the service; `new_flow` when it opened a flow.
#[inline(always)]
pub fn service_packet(service_id: u32, bytes: u32, new_flow: bool) {
    if let Some(s) = LB_SERVICE_STATS.get_ptr_mut(service_id) {
        // SAFETY: as in `count`.
        unsafe {
            (*s).packets += 1;
            (*s).bytes += bytes as u64;
            if new_flow {
                (*s).new_flows += 1;
            }
        }
    }
}

/// A service packet dropped for lack of a backend.
#[inline(always)]
pub fn service_no_backend(service_id: u32) {
    if let Some(s) = LB_SERVICE_STATS.get_ptr_mut(service_id) {
        // SAFETY: as in `count`.
        unsafe { (*s).no_backend += 1 }
    }
}

/// A packet of `bytes` forwarded to the backend; `new_flow` when the flow was (re)pinned.
#[inline(always)]
pub fn backend_packet(backend_id: u32, bytes: u32, new_flow: bool) {
    if let Some(b) = LB_BACKEND_STATS.get_ptr_mut(backend_id) {
        // SAFETY: as in `count`.
        unsafe {
            (*b).packets += 1;
            (*b).bytes += bytes as u64;
            if new_flow {
                (*b).new_flows += 1;
            }
        }
    }
}

/// A connection to the backend was seen to succeed.
#[inline(always)]
pub fn backend_conn_ok(backend_id: u32) {
    if let Some(b) = LB_BACKEND_STATS.get_ptr_mut(backend_id) {
        // SAFETY: as in `count`.
        unsafe { (*b).conn_ok += 1 }
    }
}
