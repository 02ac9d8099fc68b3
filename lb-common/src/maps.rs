//! Key and value types of the data plane's BPF maps.
//!
//! Addresses are `[u32; 4]` holding the bytes exactly as they appear on the wire
//! ("network order"); an IPv4 address uses word 0 and leaves words 1..3 zero.
//! Ports are `u16` in network order unless a field says otherwise.

use core::mem::size_of;

/// `LB_SERVICES` key: one virtual service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VipKey {
    /// VIP address, network order.
    pub addr: [u32; 4],
    /// VIP port, network order.
    pub port: u16,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
}
const _: () = assert!(size_of::<VipKey>() == 20);

/// Service flag: full NAT forwarding (absent: L2 direct server return).
pub const SERVICE_F_NAT: u32 = 1 << 0;

/// `LB_SERVICES` value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceMeta {
    /// Index into `LB_MAGLEV` and the per-service counters; `0..MAX_SERVICES`.
    pub service_id: u32,
    /// `SERVICE_F_*` bits.
    pub flags: u32,
    /// nat: source address toward the backends, network order, same family as the VIP.
    pub snat_addr: [u32; 4],
    /// nat: first source port to allocate, host order.
    pub nat_port_min: u16,
    /// nat: last source port to allocate (inclusive), host order.
    pub nat_port_max: u16,
}
const _: () = assert!(size_of::<ServiceMeta>() == 28);

/// Backend flag: the backend may keep its pinned flows. Cleared when it is removed for
/// failure or from the configuration; pinned flows then re-hash through Maglev.
pub const BACKEND_F_LIVE: u8 = 1 << 0;

/// `LB_BACKENDS` value, indexed by backend id (`1..MAX_BACKENDS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backend {
    /// Backend address, network order.
    pub addr: [u32; 4],
    /// Backend port, network order (dsr: equal to the VIP port).
    pub port: u16,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// `BACKEND_F_*` bits.
    pub flags: u8,
    /// MAC of the backend (or of the next hop toward it) on the attached segment.
    pub mac: [u8; 6],
    pub _pad: [u8; 2],
    /// Owning service id (for per-service accounting of events).
    pub service_id: u32,
}
const _: () = assert!(size_of::<Backend>() == 32);

/// `LB_FLOWS` and `LB_NAT` key: a 5-tuple as seen on the wire in one direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// Source address, network order.
    pub src: [u32; 4],
    /// Destination address, network order.
    pub dst: [u32; 4],
    /// Source port, network order.
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<FlowKey>() == 40);

/// Flow flag: a TCP SYN was forwarded and the handshake has not been seen to complete.
pub const FLOW_F_SYN_PENDING: u32 = 1 << 0;
/// Flow flag: a passive-failure event was already sent for this flow.
pub const FLOW_F_REPORTED: u32 = 1 << 1;

/// `LB_FLOWS` value: where an established client flow goes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowValue {
    /// Backend id the flow is pinned to.
    pub backend_id: u32,
    /// `FLOW_F_*` bits.
    pub flags: u32,
    /// nat: source port allocated toward the backend, network order (0 in dsr).
    pub nat_port: u16,
    pub _pad: [u8; 2],
    /// nat: the tick (low 32 bits of `jiffies`) in which the flow's reverse entry in
    /// `LB_NAT` was last verified; later packets of the same tick skip the check.
    pub nat_tick: u32,
    /// CLOCK_MONOTONIC nanoseconds (good to one tick, see `TickClock`) when the flow was
    /// last refreshed (at most once a second).
    pub last_seen_ns: u64,
}
const _: () = assert!(size_of::<FlowValue>() == 24);

/// `LB_NAT` value, keyed by the reply's 5-tuple (`backend:port -> snat:nat_port`):
/// what to write back so the client sees the VIP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatValue {
    /// Client address, network order.
    pub client_addr: [u32; 4],
    /// VIP address, network order.
    pub vip_addr: [u32; 4],
    /// Client port, network order.
    pub client_port: u16,
    /// VIP port, network order.
    pub vip_port: u16,
    /// Backend id of the flow.
    pub backend_id: u32,
    /// Source MAC of the client's packets (the previous hop): replies go back to it.
    pub client_mac: [u8; 6],
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<NatValue>() == 48);

/// `LB_BACKEND_STATS` value (per CPU), indexed by backend id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// Packets forwarded to the backend (client -> backend direction).
    pub packets: u64,
    /// Bytes forwarded to the backend (whole frames).
    pub bytes: u64,
    /// New flows assigned to the backend.
    pub new_flows: u64,
    /// Connections seen to succeed: SYN-ACK (nat) or handshake-completing ACK (dsr).
    pub conn_ok: u64,
}
const _: () = assert!(size_of::<BackendStats>() == 32);

/// `LB_SERVICE_STATS` value (per CPU), indexed by service id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceStats {
    /// Packets for the service (client -> VIP direction).
    pub packets: u64,
    /// Bytes for the service (whole frames).
    pub bytes: u64,
    /// New flows of the service.
    pub new_flows: u64,
    /// Packets dropped because the service had no backend.
    pub no_backend: u64,
}
const _: () = assert!(size_of::<ServiceStats>() == 32);

/// `LB_CLOCK` value (per CPU, one entry): the data plane's cached flow clock. Only the
/// XDP program reads and writes it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickClock {
    /// `jiffies` when `ns` was read.
    pub jiffies: u64,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) read at that jiffy.
    pub ns: u64,
}
const _: () = assert!(size_of::<TickClock>() == 16);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for VipKey {}
    unsafe impl aya::Pod for ServiceMeta {}
    unsafe impl aya::Pod for Backend {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowValue {}
    unsafe impl aya::Pod for NatValue {}
    unsafe impl aya::Pod for BackendStats {}
    unsafe impl aya::Pod for ServiceStats {}
    unsafe impl aya::Pod for TickClock {}
    unsafe impl aya::Pod for crate::events::PassiveEvent {}
}
