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

/// Backend flag: the backend may keep its pinned TCP flows (it exists and was not set
/// `down` by the operator). Cleared only when it is removed outright; pinned flows then
/// re-hash through Maglev.
pub const BACKEND_F_LIVE: u8 = 1 << 0;
/// Backend flag: the backend is in traffic (it holds Maglev slots). A backend that left
/// traffic for a health or membership reason keeps `BACKEND_F_LIVE` without this flag:
/// its established TCP flows stay, a SYN reusing a pinned 5-tuple re-hashes, and pinned
/// UDP flows move.
pub const BACKEND_F_SERVING: u8 = 1 << 1;

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
    /// `NAT_S_*` bits: how far the TCP connection has closed.
    pub state: u8,
    pub _pad: u8,
    /// [`nat_seconds`] of the last packet the entry carried (refreshed when it changes).
    pub last_seen: u32,
    pub _pad2: u32,
}
const _: () = assert!(size_of::<NatValue>() == 56);

/// NAT state: the client sent FIN.
pub const NAT_S_FIN_CLIENT: u8 = 1 << 0;
/// NAT state: the backend sent FIN.
pub const NAT_S_FIN_BACKEND: u8 = 1 << 1;
/// NAT state: either side sent RST.
pub const NAT_S_RST: u8 = 1 << 2;
/// NAT state: the backend answered the SYN (SYN-ACK seen).
pub const NAT_S_ESTABLISHED: u8 = 1 << 3;
/// A closed TCP entry's source port may be taken by a new flow this long after its last
/// packet (in [`nat_seconds`]): long enough for the last ACK and retransmissions; a
/// backend still in TIME_WAIT accepts the new SYN when its sequence or timestamp is newer
/// (RFC 6191), else the client's retransmission gets through once TIME_WAIT is reset.
pub const NAT_CLOSED_REUSE: u32 = 2;
/// An open TCP entry idle this long may be reclaimed (IPVS's established timeout).
pub const NAT_TCP_IDLE_REUSE: u32 = 900;
/// A UDP entry idle this long may be reclaimed (IPVS's UDP timeout).
pub const NAT_UDP_IDLE_REUSE: u32 = 300;

/// Coarse seconds (2^30 ns, about 1.07 s) of a `CLOCK_MONOTONIC` reading, for NAT ages.
#[inline(always)]
pub const fn nat_seconds(ns: u64) -> u32 {
    (ns >> 30) as u32
}

/// Whether a NAT entry's source port may be given to a new flow at `now` (see
/// [`nat_seconds`]): a closed TCP connection, or one whose SYN was never answered, after
/// [`NAT_CLOSED_REUSE`] without packets (a client still retrying keeps it fresh); any
/// entry idle past its protocol's timeout.
#[inline(always)]
pub const fn nat_reclaimable(v: &NatValue, proto: u8, now: u32) -> bool {
    let idle = now.wrapping_sub(v.last_seen);
    let closed = v.state & NAT_S_RST != 0
        || v.state & NAT_S_ESTABLISHED == 0
        || v.state & (NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND)
            == (NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND);
    if proto == crate::IPPROTO_TCP {
        (closed && idle >= NAT_CLOSED_REUSE) || idle >= NAT_TCP_IDLE_REUSE
    } else {
        idle >= NAT_UDP_IDLE_REUSE
    }
}

/// `LB_CONFIG` value (one entry): what the data plane must know about the interface it
/// is attached to. Written by the agent when it loads and attaches the program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataplaneConfig {
    /// The interface's MAC address. A frame for a VIP (or a nat reply) whose destination
    /// MAC differs is passed untouched (`PASS_NOT_FOR_HOST`). All zero: not configured
    /// (the program is loaded but not attached, or the interface has no MAC): no check.
    pub mac: [u8; 6],
    pub _pad: [u8; 2],
    /// `CONFIG_F_*` bits (none defined yet; 0).
    pub flags: u32,
}
const _: () = assert!(size_of::<DataplaneConfig>() == 12);

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

/// Field-wise sums, so per-CPU values add up with `.sum()`.
macro_rules! add_fields {
    ($ty:ident { $($field:ident),+ }) => {
        impl core::ops::Add for $ty {
            type Output = Self;
            fn add(self, o: Self) -> Self {
                Self { $($field: self.$field + o.$field),+ }
            }
        }
        impl core::iter::Sum for $ty {
            fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
                iter.fold(Self::default(), core::ops::Add::add)
            }
        }
    };
}
add_fields!(BackendStats {
    packets,
    bytes,
    new_flows,
    conn_ok
});
add_fields!(ServiceStats {
    packets,
    bytes,
    new_flows,
    no_backend
});

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nat_entries_become_reclaimable_by_protocol_and_state() {
        let open = NatValue {
            last_seen: 100,
            state: NAT_S_ESTABLISHED,
            ..NatValue::default()
        };
        let unanswered = NatValue { state: 0, ..open };
        assert!(!nat_reclaimable(
            &unanswered,
            crate::IPPROTO_TCP,
            100 + NAT_CLOSED_REUSE - 1
        ));
        assert!(nat_reclaimable(
            &unanswered,
            crate::IPPROTO_TCP,
            100 + NAT_CLOSED_REUSE
        ));
        let tcp = crate::IPPROTO_TCP;
        assert!(!nat_reclaimable(&open, tcp, 101));
        assert!(!nat_reclaimable(&open, tcp, 100 + NAT_TCP_IDLE_REUSE - 1));
        assert!(nat_reclaimable(&open, tcp, 100 + NAT_TCP_IDLE_REUSE));
        let half = NatValue {
            state: NAT_S_ESTABLISHED | NAT_S_FIN_CLIENT,
            ..open
        };
        assert!(
            !nat_reclaimable(&half, tcp, 100 + NAT_CLOSED_REUSE),
            "half-closed"
        );
        let closed = NatValue {
            state: NAT_S_ESTABLISHED | NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND,
            ..open
        };
        assert!(!nat_reclaimable(&closed, tcp, 100 + NAT_CLOSED_REUSE - 1));
        assert!(nat_reclaimable(&closed, tcp, 100 + NAT_CLOSED_REUSE));
        let reset = NatValue {
            state: NAT_S_RST,
            ..open
        };
        assert!(nat_reclaimable(&reset, tcp, 100 + NAT_CLOSED_REUSE));
        let udp = crate::IPPROTO_UDP;
        assert!(!nat_reclaimable(&open, udp, 100 + NAT_UDP_IDLE_REUSE - 1));
        assert!(nat_reclaimable(&open, udp, 100 + NAT_UDP_IDLE_REUSE));
        assert!(nat_reclaimable(
            &open,
            udp,
            99u32.wrapping_add(NAT_UDP_IDLE_REUSE + 1)
        ));
    }
}

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
    unsafe impl aya::Pod for DataplaneConfig {}
    unsafe impl aya::Pod for crate::events::PassiveEvent {}
}
