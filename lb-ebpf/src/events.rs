//! Passive-failure events to the agent through the `LB_EVENTS` ring buffer (never blocks).

use aya_ebpf::helpers::bpf_ktime_get_ns;
use lb_common::{
    counters::{EVENTS_LOST, EVENTS_SENT},
    events::PassiveEvent,
};

use crate::{counters::count, maps::LB_EVENTS};

/// Sends one event; a full ring buffer drops it and counts `EVENTS_LOST`.
///
/// Callers send at most one event per flow (`FLOW_F_REPORTED`).
#[inline(always)]
pub fn emit(kind: u32, backend_id: u32, service_id: u32) {
    let event = PassiveEvent {
        kind,
        backend_id,
        service_id,
        _pad: 0,
        // SAFETY: a helper without preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
    };
    match LB_EVENTS.output(&event, 0) {
        Ok(()) => count(EVENTS_SENT),
        Err(_) => count(EVENTS_LOST),
    }
}
