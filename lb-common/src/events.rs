//! Records the XDP program sends to the agent: passive-failure signals through
//! `LB_EVENTS`, and in cluster mode nat connections established and ended through
//! `LB_CONN_EVENTS`.
//!
//! At most one passive event per flow and kind (the flow carries `FLOW_F_REPORTED`), at
//! most one connection event per connection and kind; never one per packet. A full ring
//! buffer drops the event and counts `EVENTS_LOST` (`CONN_EVENTS_LOST`).

use core::mem::size_of;

use crate::{keys::FlowKey, maps::NatValue};

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

/// Connection event: a nat connection is established (TCP: the client acknowledged the
/// backend's SYN-ACK; UDP: the backend's first reply; `maps::nat_conn_established`).
pub const CONN_ESTABLISHED: u32 = 1;
/// Connection event: an established TCP connection ended (a reset, or both FINs;
/// `maps::nat_conn_ended`).
pub const CONN_ENDED: u32 = 2;

/// One nat connection as the node that carries it sees it, when it is established or
/// ends (cluster mode, `LB_CONN_EVENTS`): everything another node needs to forward its
/// packets in both directions as this one does.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnEvent {
    /// `CONN_*`.
    pub kind: u32,
    pub _pad: u32,
    /// The client's 5-tuple (client -> VIP): the `LB_FLOWS` and `LB_PEER_FLOWS` key.
    pub client: FlowKey,
    /// The reply's 5-tuple (backend -> SNAT address and port): the `LB_NAT` and
    /// `LB_PEER_NAT` key; its destination port is the connection's source port.
    pub reply: FlowKey,
    /// The reverse entry as it stands (its `backend_id` is the connection's backend).
    pub nat: NatValue,
}
const _: () = assert!(size_of::<ConnEvent>() == 144);

/// Human name of a connection event kind, for logs.
pub const fn conn_event_name(kind: u32) -> &'static str {
    match kind {
        CONN_ESTABLISHED => "established",
        CONN_ENDED => "ended",
        _ => "unknown",
    }
}
