//! Passive-failure records the XDP program sends to the agent through `LB_EVENTS`.
//!
//! At most one event per flow and kind (the flow carries `FLOW_F_REPORTED`), never one
//! per packet. A full ring buffer drops the event and counts `EVENTS_LOST`.

use core::mem::size_of;

/// A backend answered a forwarded SYN with RST (nat: seen on the reply path).
pub const EVENT_RST_ON_SYN: u32 = 1;
/// A backend sent ICMP destination-unreachable for a forwarded packet (nat).
pub const EVENT_ICMP_UNREACH: u32 = 2;
/// The client retransmitted a SYN on a flow still waiting for its handshake.
pub const EVENT_SYN_RETRANSMIT: u32 = 3;

/// One passive-failure signal about a backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassiveEvent {
    /// `EVENT_*`.
    pub kind: u32,
    /// Backend the signal is about.
    pub backend_id: u32,
    /// Service of that backend.
    pub service_id: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the signal was seen.
    pub timestamp_ns: u64,
}
const _: () = assert!(size_of::<PassiveEvent>() == 24);

/// Human name of an event kind, for logs and metrics labels.
pub const fn event_name(kind: u32) -> &'static str {
    match kind {
        EVENT_RST_ON_SYN => "rst_on_syn",
        EVENT_ICMP_UNREACH => "icmp_unreachable",
        EVENT_SYN_RETRANSMIT => "syn_retransmit",
        _ => "unknown",
    }
}
