//! Key and value types of the data plane's BPF maps.
//!
//! Addresses are `[u32; 4]` holding the bytes exactly as they appear on the wire
//! ("network order"); an IPv4 address uses word 0 and leaves words 1..3 zero.
//! Ports are `u16` in network order unless a field says otherwise.

use core::mem::size_of;

pub use crate::keys::{FlowKey, VipKey};

/// Service flag: full NAT forwarding (absent: L2 direct server return).
pub const SERVICE_F_NAT: u32 = 1 << 0;
/// Service flag: tunnel forwarding: each packet is encapsulated toward its backend's
/// address (IPv4-in-IPv4, IPv6-in-IPv6, or across families), the backend answers the
/// client directly (as dsr). Never with [`SERVICE_F_NAT`].
pub const SERVICE_F_TUNNEL: u32 = 1 << 1;
/// Service flag, with [`SERVICE_F_TUNNEL`]: GUE (an outer UDP header to
/// [`GUE_PORT`], the inner packet right after it) instead of plain IP-in-IP.
pub const SERVICE_F_GUE: u32 = 1 << 2;
/// GUE's destination port (host order): Katran's, and what `ip fou add port 6080` or
/// `lb-agent decap` listen on.
pub const GUE_PORT: u16 = 6080;
/// Bytes an IP-in-IP tunnel adds to a packet: an outer IPv4 header.
pub const TUNNEL_V4_OVERHEAD: u16 = 20;
/// Bytes an IPv6 outer header adds.
pub const TUNNEL_V6_OVERHEAD: u16 = 40;
/// Bytes GUE adds on top of the outer IP header (the UDP header).
pub const TUNNEL_GUE_OVERHEAD: u16 = 8;

/// A service's parameters, held in its `LB_VIP_INDEX` slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceMeta {
    /// Index into `LB_MAGLEV` and the per-service counters; `0..MAX_SERVICES`.
    pub service_id: u32,
    /// `SERVICE_F_*` bits.
    pub flags: u32,
    /// nat: source addresses toward the backends, network order, same family as the VIP;
    /// the first `snat_count` are used.
    pub snat_addrs: [[u32; 4]; MAX_SNAT_ADDRS],
    /// nat: how many of `snat_addrs` are in use (1..=`MAX_SNAT_ADDRS`).
    pub snat_count: u32,
    /// nat: first source port to allocate, host order.
    pub nat_port_min: u16,
    /// nat: last source port to allocate (inclusive), host order.
    pub nat_port_max: u16,
    /// nat: one client address may open a new flow every this many nanoseconds on
    /// average (`1e9 / rate`); 0 = no per-source limit. See [`SourceBucket`].
    pub source_interval_ns: u32,
    /// nat: how many new flows a client address may open at once (at least 1).
    pub source_burst: u32,
    /// First `LB_MAGLEV` block of the service's two Maglev tables (allocated by the
    /// agent's data plane from the pool; see `lb_common::maglev_block_index`).
    pub maglev_base: u32,
    /// Slots of each of the two tables: one of `lb_common::MAGLEV_SIZES`; 0 = no table
    /// yet (every packet is `DROP_NO_BACKEND`).
    pub maglev_size: u32,
}
const _: () = assert!(size_of::<ServiceMeta>() == 96);

/// `LB_VIP_INDEX` slot kind: free. Ways of a bucket fill from 0, so the first free
/// way ends a search.
pub const VIP_SLOT_EMPTY: u32 = 0;
/// `LB_VIP_INDEX` slot kind: a service (`vip` is its key, `meta` its parameters).
pub const VIP_SLOT_SERVICE: u32 = 1;
/// `LB_VIP_INDEX` slot kind: a nat source address (`vip` is [`snat_key`]; `meta` unused).
/// Only a packet to one of these may be a nat reply worth an `LB_NAT` lookup.
pub const VIP_SLOT_SNAT: u32 = 2;

/// `LB_VIP_INDEX` value: one way of one bucket of one of the two tables.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipSlot {
    pub vip: VipKey,
    /// `VIP_SLOT_*`.
    pub kind: u32,
    pub meta: ServiceMeta,
}
const _: () = assert!(size_of::<VipSlot>() == 120);

/// `LB_VIP_HDR` value, one per table: how to find a key in it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipIndexHeader {
    /// Seed of [`crate::hash::vip_hash`] for this table, chosen by the agent so that
    /// no bucket holds more than `VIP_INDEX_WAYS` keys.
    pub seed: u32,
    /// Host order: the lowest and highest source port of every nat service together. A
    /// packet to no VIP whose destination port lies outside is no nat reply (no map
    /// read). `min > max`: no nat service.
    pub nat_port_min: u16,
    pub nat_port_max: u16,
}
const _: () = assert!(size_of::<VipIndexHeader>() == 8);

/// The `LB_VIP_INDEX` key of a nat source address (port and protocol 0: no service
/// has them).
#[inline(always)]
pub const fn snat_key(addr: [u32; 4], family: u8) -> VipKey {
    VipKey {
        addr,
        port: 0,
        proto: 0,
        family,
    }
}

/// Whether two VIP keys are equal, word by word (no `memcmp` in BPF).
#[inline(always)]
pub fn same_vip(a: &VipKey, b: &VipKey) -> bool {
    (a.addr[0] == b.addr[0])
        & (a.addr[1] == b.addr[1])
        & (a.addr[2] == b.addr[2])
        & (a.addr[3] == b.addr[3])
        & (a.port == b.port)
        & (a.proto == b.proto)
        & (a.family == b.family)
}

/// Source addresses a nat service can allocate (address, port) pairs from.
pub const MAX_SNAT_ADDRS: usize = 4;

/// `LB_SOURCES` key: one client address of one service (per-source fairness).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceKey {
    /// Client address, network order (IPv4: word 0).
    pub addr: [u32; 4],
    pub service_id: u32,
}
const _: () = assert!(size_of::<SourceKey>() == 20);

/// `LB_SOURCES` value: a GCRA token bucket (the "virtual scheduling" form). A new nat
/// flow from the source at `now` is allowed when `tat_ns <= now + interval * (burst - 1)`;
/// it then advances `tat_ns` to `max(tat_ns, now) + interval`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceBucket {
    /// Theoretical arrival time of the next flow (CLOCK_MONOTONIC ns).
    pub tat_ns: u64,
}
const _: () = assert!(size_of::<SourceBucket>() == 8);

/// Whether a GCRA bucket with theoretical arrival time `tat` admits one more flow at
/// `now`, and the bucket's next `tat` if it does.
#[inline(always)]
pub const fn source_admit(tat: u64, now: u64, interval: u32, burst: u32) -> Option<u64> {
    let tolerance = interval as u64 * burst.saturating_sub(1) as u64;
    if tat > now + tolerance {
        return None;
    }
    let base = if tat > now { tat } else { now };
    Some(base + interval as u64)
}

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

/// Flow flag: a TCP SYN was forwarded and the backend has not been seen to answer it
/// (nat: no packet from the backend; dsr: the client's ACK not seen yet).
pub const FLOW_F_SYN_PENDING: u32 = 1 << 0;
/// Flow flag: a passive-failure event was already sent for this flow.
pub const FLOW_F_REPORTED: u32 = 1 << 1;
/// Flow flag (nat): the next client packet must be noted in the reverse entry (TCP: the
/// backend sent its SYN-ACK and the client's ACK is awaited; UDP: the backend replied
/// and the client's next packet makes the entry assured). Only that packet pays a
/// lookup in `LB_NAT` for it.
pub const FLOW_F_NAT_AWAIT: u32 = 1 << 2;
/// Flow flag (dsr, tunnel): the flow was opened by a packet other than a SYN, and no
/// packet of it has come more than a second after that one yet: its source has not
/// proved itself (docs/capacity.md, "Spoofed packets of every kind").
pub const FLOW_F_UNPROVEN: u32 = 1 << 3;
/// Flow flag (nat): the flow was opened by a datagram and its backend has not answered
/// yet: its source has not proved itself (docs/capacity.md, "Spoofed packets of every
/// kind").
pub const FLOW_F_UNANSWERED: u32 = 1 << 4;
/// The flags of a flow that is not confirmed: waiting for its handshake
/// ([`FLOW_F_SYN_PENDING`]) or for its proof ([`FLOW_F_UNPROVEN`],
/// [`FLOW_F_UNANSWERED`]). Such a flow is admitted apart from confirmed ones and never
/// takes a busy confirmed flow's way (`lb_common::table::PENDING_WAYS_MAX`).
pub const FLOW_F_UNCONFIRMED: u32 = FLOW_F_SYN_PENDING | FLOW_F_UNPROVEN | FLOW_F_UNANSWERED;
/// The flags of a flow waiting for its proof (kept when the flow is re-hashed).
pub const FLOW_F_AWAITING_PROOF: u32 = FLOW_F_UNPROVEN | FLOW_F_UNANSWERED;

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
    /// nat: index into the service's `snat_addrs` of the flow's source address.
    pub nat_addr: u8,
    pub _pad: u8,
    /// nat: the tick (low 32 bits of `jiffies`) in which the flow's reverse entry in
    /// `LB_NAT` was last verified; later packets of the same tick skip the check.
    /// While `FLOW_F_SYN_PENDING` is set (dsr and nat) it is instead the initial
    /// sequence number of the SYN that started the wait, as on the wire: only a SYN with
    /// that ISN is a resend (docs/passive-signals.md); a nat flow's packets then verify
    /// the reverse entry every time (they read it anyway while the flow waits).
    pub nat_tick: u32,
    /// CLOCK_MONOTONIC nanoseconds (good to one tick, see `TickClock`) when the flow was
    /// last refreshed (at most once a second). While `FLOW_F_SYN_PENDING` is set it is
    /// the time of the SYN that started the wait (refreshes then skip it).
    pub last_seen_ns: u64,
}
const _: () = assert!(size_of::<FlowValue>() == 24);

/// `LB_FLOW_CACHE` value (per CPU): a settled flow as this CPU last saw it in
/// `LB_FLOWS`, valid only during tick `tick` (see lb-ebpf's `cache`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowCacheEntry {
    pub key: FlowKey,
    /// The pinned backend; `NO_BACKEND` (0): the slot holds nothing.
    pub backend_id: u32,
    /// The tick (low 32 bits of `jiffies`) in which this CPU read or wrote the flow's
    /// `LB_FLOWS` entry.
    pub tick: u32,
    /// nat: the flow's source port (network order) and address index, as in `FlowValue`.
    pub nat_port: u16,
    pub nat_addr: u8,
    pub _pad: u8,
    pub _pad2: u32,
}
const _: () = assert!(size_of::<FlowCacheEntry>() == 56);

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
    /// `NAT_H_*` bits (TCP): the flow's handshake as the reply path needs it, so that a
    /// reply never reads `LB_FLOWS` (docs/passive-signals.md).
    pub handshake: u8,
    /// [`nat_seconds`] of the last packet the entry carried (refreshed when it changes).
    pub last_seen: u32,
    pub _pad2: u32,
}
const _: () = assert!(size_of::<NatValue>() == 56);

/// NAT handshake (TCP): a SYN opened or restarted the connection and no backend packet
/// has come since (the reverse entry's copy of `FLOW_F_SYN_PENDING`: the reply path
/// clears it, the client's next packet clears the flow's).
pub const NAT_H_PENDING: u8 = 1 << 0;
/// NAT handshake: the flow sent its one passive-failure event (`FLOW_F_REPORTED`,
/// whichever path sent it).
pub const NAT_H_REPORTED: u8 = 1 << 1;
/// NAT handshake bits, cluster mode: the entry was taken over from `LB_PEER_NAT` (another
/// node made the connection, whose port it owns). Once its port may be reused, or when a
/// SYN-ACK finds it past its handshake, a reply takes it as gone: the owner may have
/// given the pair to a new connection this node has not heard of.
pub const NAT_H_ADOPTED: u8 = 1 << 2;

/// NAT state (TCP): the client sent FIN.
pub const NAT_S_FIN_CLIENT: u8 = 1 << 0;
/// NAT state (TCP): the backend sent FIN.
pub const NAT_S_FIN_BACKEND: u8 = 1 << 1;
/// NAT state (TCP): either side sent RST, and not after a completed backend-first close
/// (the backend may then still hold TIME_WAIT, see [`nat_reclaimable`]).
pub const NAT_S_RST: u8 = 1 << 2;
/// NAT state (TCP): the backend answered the SYN (SYN-ACK seen).
pub const NAT_S_ESTABLISHED: u8 = 1 << 3;
/// NAT state (TCP): the client acknowledged the SYN-ACK (first client ACK after it).
pub const NAT_S_ACKED: u8 = 1 << 4;
/// NAT state (TCP): the backend's FIN came before the client's (the backend closed
/// first, so it holds the 4-tuple in TIME_WAIT once the client's FIN reached it).
pub const NAT_S_BACKEND_FIRST: u8 = 1 << 5;
/// NAT state (UDP): the backend replied.
pub const NAT_S_REPLIED: u8 = 1 << 6;
/// NAT state (UDP): the client sent again after a reply (a stream, conntrack's assured).
pub const NAT_S_ASSURED: u8 = 1 << 7;

/// TCP: a connection closed both ways with the client first, or reset, may give its
/// source port to a new flow this long after its last packet (in [`nat_seconds`], about
/// 2.1 s): the last ACK and its retransmissions are through, and the backend holds no
/// TIME_WAIT (the client, which closed first, does; its 4-tuple toward the VIP is not
/// the one the backend sees).
pub const NAT_CLOSED_REUSE: u32 = 2;
/// TCP: a SYN the backend never answered frees its port this long after the client's
/// last SYN (about 4.3 s; the client's retransmissions at 1 s and 3 s keep it).
pub const NAT_UNANSWERED_REUSE: u32 = 4;
/// TCP: half-open (SYN-ACK sent, the client never acknowledged it): the port comes back
/// this long after the client's last packet (about 8.6 s). The backend's SYN-ACK
/// retransmissions do not refresh it: a spoofed SYN cannot hold a port for the minute
/// the backend keeps retrying.
pub const NAT_HALF_OPEN_REUSE: u32 = 8;
/// Linux's `TCP_TIMEWAIT_LEN`: a socket that closed first holds its 4-tuple this long.
pub const TCP_TIMEWAIT_SECS: u32 = 60;
/// TCP, backend closed first: the port comes back only after the backend's TIME_WAIT
/// ended: [`TCP_TIMEWAIT_SECS`] plus a margin for clock granularity and the last
/// ACK's flight, in [`nat_seconds`] (64 = 68.7 s).
pub const NAT_TIME_WAIT_REUSE: u32 = 64;
/// TCP: an established entry idle this long may be reclaimed (IPVS's established timeout).
pub const NAT_TCP_IDLE_REUSE: u32 = 900;
/// UDP, not assured (no reply, or no client packet after the reply): about 10.7 s, the
/// short end of conntrack's unreplied timeout (30 s): a request/response exchange (DNS)
/// is over by then, and one source's one-datagram flows cannot pile up.
pub const NAT_UDP_REUSE: u32 = 10;
/// UDP, assured: conntrack's stream timeout (120 s; 112 [`nat_seconds`] = 120.3 s).
pub const NAT_UDP_ASSURED_REUSE: u32 = 112;

/// Coarse seconds (2^30 ns, about 1.07 s) of a `CLOCK_MONOTONIC` reading, for NAT ages.
#[inline(always)]
pub const fn nat_seconds(ns: u64) -> u32 {
    (ns >> 30) as u32
}

/// How long a NAT entry in `state` must sit without packets before its source port may
/// be given to a new flow (in [`nat_seconds`]). The port lifecycle: docs/nat-ports.md.
#[inline(always)]
pub const fn nat_reuse_after(state: u8, proto: u8) -> u32 {
    if proto != crate::IPPROTO_TCP {
        return if state & NAT_S_ASSURED != 0 {
            NAT_UDP_ASSURED_REUSE
        } else {
            NAT_UDP_REUSE
        };
    }
    if state & NAT_S_RST != 0 {
        return NAT_CLOSED_REUSE;
    }
    let fins = NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND;
    if state & fins == fins {
        return if state & NAT_S_BACKEND_FIRST != 0 {
            NAT_TIME_WAIT_REUSE
        } else {
            NAT_CLOSED_REUSE
        };
    }
    if state & NAT_S_ESTABLISHED == 0 {
        return NAT_UNANSWERED_REUSE;
    }
    if state & NAT_S_ACKED == 0 {
        return NAT_HALF_OPEN_REUSE;
    }
    NAT_TCP_IDLE_REUSE
}

/// A TCP entry in `state` whose backend closed first, both FINs seen and no reset
/// before: the backend holds the 4-tuple in TIME_WAIT (row 6 of docs/nat-ports.md).
#[inline(always)]
pub const fn nat_backend_time_wait(state: u8) -> bool {
    let closed = NAT_S_BACKEND_FIRST | NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND;
    state & (closed | NAT_S_RST) == closed
}

/// Whether a nat connection in `state` (of protocol `proto`) is established in the sense
/// of the connection events (`events::CONN_ESTABLISHED`): TCP, the client acknowledged the
/// backend's SYN-ACK; UDP, the backend replied.
#[inline(always)]
pub const fn nat_conn_established(state: u8, proto: u8) -> bool {
    let bit = if proto == crate::IPPROTO_TCP {
        NAT_S_ACKED
    } else {
        NAT_S_REPLIED
    };
    state & bit != 0
}

/// Whether an established TCP connection in `state` has ended (`events::CONN_ENDED`): a
/// reset, or both FINs. UDP connections only age out.
#[inline(always)]
pub const fn nat_conn_ended(state: u8, proto: u8) -> bool {
    let fins = NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND;
    proto == crate::IPPROTO_TCP
        && state & NAT_S_ACKED != 0
        && (state & NAT_S_RST != 0 || state & fins == fins)
}

/// Whether reverse entry `v` belongs to the client flow `client` (its 5-tuple).
#[inline(always)]
pub fn nat_owned_by(v: &NatValue, client: &FlowKey) -> bool {
    v.client_port == client.sport
        && v.vip_port == client.dport
        && v.client_addr == client.src
        && v.vip_addr == client.dst
}

/// Whether a NAT entry's source port may be given to a new flow at `now` (see
/// [`nat_seconds`] and [`nat_reuse_after`]).
#[inline(always)]
pub const fn nat_reclaimable(v: &NatValue, proto: u8, now: u32) -> bool {
    now.wrapping_sub(v.last_seen) >= nat_reuse_after(v.state, proto)
}

/// `DataplaneConfig::flags` bit: cluster mode. The nodes of a cluster share nat
/// connections: a client packet or a backend reply of a connection another node made is
/// forwarded as that node forwards it (`LB_PEER_FLOWS`, `LB_PEER_NAT`, written by the
/// agent), the allocation skips pairs those connections hold, and the program reports
/// each connection's establishment and end (`LB_CONN_EVENTS`). Set at load, like the
/// table layout: without it none of this runs (docs/internals/fast-path.md, "Cluster
/// mode").
pub const CONFIG_F_CLUSTER: u32 = 1 << 0;

/// `DataplaneConfig::flags` bit: the program is attached in native (driver) mode, where
/// the frames it sends lose the socket buffer's checksum state, so a partial TCP/UDP
/// checksum (the pseudo-header's sum a sender on the same host left for the device to
/// complete) is completed before forwarding; in generic mode the kernel completes it.
/// Unlike [`CONFIG_F_CLUSTER`] it is not set at load but written into `LB_CONFIG` by the
/// agent at attach (`auto` learns the mode from the attach), and the program reads it
/// there (docs/internals/fast-path.md, "Partial checksums").
pub const CONFIG_F_NATIVE: u32 = 1 << 1;

/// `LB_PEER_FLOWS` value, keyed by the client's 5-tuple (client -> VIP): how the node
/// that made the connection pinned it, in this node's terms (its backend id here).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerFlow {
    /// Backend id (this node's) the connection goes to.
    pub backend_id: u32,
    /// Source port toward the backend, network order (`FlowValue::nat_port`).
    pub nat_port: u16,
    /// Index into the service's `snat_addrs` of the source address
    /// (`FlowValue::nat_addr`).
    pub nat_addr: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<PeerFlow>() == 8);

/// Most members of a cluster (this node and its peers); `LB_CLUSTER` has room for each.
pub const CLUSTER_MEMBERS_MAX: usize = 16;
/// Most shared SNAT addresses `LB_CLUSTER` names (check-config refuses more in a cluster).
pub const CLUSTER_SNAT_MAX: usize = 16;

/// Most next-hop MAC moves `LB_CLUSTER` carries (the latest; a new one pushes out the
/// oldest).
pub const CLUSTER_HOP_MOVES_MAX: usize = 4;

/// A next hop's MAC that moved (a router's failover, a replaced card): a nat reply whose
/// entry names `old` as the client's previous hop goes to `new`, and the entry takes it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HopMove {
    pub old: [u8; 6],
    pub new: [u8; 6],
}
const _: () = assert!(size_of::<HopMove>() == 12);

impl HopMove {
    /// The MAC `mac` moved to, if one of `moves` names it.
    pub fn apply(moves: &[HopMove], mac: [u8; 6]) -> Option<[u8; 6]> {
        moves.iter().find(|m| m.old == mac).map(|m| m.new)
    }
}

/// A SNAT address the nodes of a cluster share and its source port range, split into
/// contiguous slices by member index (member `i` hands out
/// `[min + i*len/n, min + (i+1)*len/n)`, `len = max - min + 1`): a reply's destination
/// port names the node that made its connection.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterSnat {
    /// The address, network order, as in [`FlowKey::dst`].
    pub addr: [u32; 4],
    /// `FAMILY_V4` or `FAMILY_V6`; 0 for an unused entry.
    pub family: u8,
    pub _pad: u8,
    /// First source port, host order.
    pub port_min: u16,
    /// Last source port (inclusive), host order.
    pub port_max: u16,
    pub _pad2: u16,
}
const _: () = assert!(size_of::<ClusterSnat>() == 24);

/// `LB_CLUSTER` value (one entry, cluster mode): the members, this node's index among
/// them and where each one's frames go, and the shared SNAT addresses. A backend's reply
/// that reaches this node before the connection's owner shared it (the SYN-ACK of a new
/// connection, when the routers spread replies over the nodes) is sent on to the owner
/// unchanged but for its Ethernet addresses (`TX_PEER_BOUNCE`). Written by the agent;
/// all zero (no member) until it is, and then nothing is sent on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterMembers {
    /// How many members (this node included); 0: not known yet.
    pub count: u8,
    /// This node's index among them (members sorted by name).
    pub own: u8,
    /// How many of `snat` are in use.
    pub snat_count: u8,
    /// How many of `hop_moves` are in use.
    pub hop_move_count: u8,
    /// Each member's MAC on the attached interface's segment, by index; all zero for
    /// this node and for a member whose MAC is not known (its replies are not sent on).
    pub macs: [[u8; 6]; CLUSTER_MEMBERS_MAX],
    /// The shared SNAT addresses and their port ranges.
    pub snat: [ClusterSnat; CLUSTER_SNAT_MAX],
    /// The latest next-hop MAC moves the agent saw: in cluster mode a node may take a
    /// connection's replies without its client's packets, which bring the new MAC.
    pub hop_moves: [HopMove; CLUSTER_HOP_MOVES_MAX],
}
const _: () = assert!(size_of::<ClusterMembers>() == 532);

impl ClusterMembers {
    /// The shared SNAT address `addr` (network order, family `family`), if it is one.
    #[inline(always)]
    pub fn shared_snat(&self, addr: &[u32; 4], family: u8) -> Option<&ClusterSnat> {
        for snat in self.snat.iter().take(CLUSTER_SNAT_MAX) {
            if snat.family == 0 {
                break;
            }
            if snat.family == family && snat.addr == *addr {
                return Some(snat);
            }
        }
        None
    }
}

/// The index of the member whose slice of `port_min..=port_max` holds `port`, among
/// `count` members; `None` outside the range or without members. The agent's slices
/// (`[min + i*len/n, min + (i+1)*len/n)`) and this agree by construction.
#[inline(always)]
pub fn cluster_port_owner(port: u16, port_min: u16, port_max: u16, count: u8) -> Option<u8> {
    if count == 0 || port < port_min || port > port_max {
        return None;
    }
    let len = u32::from(port_max - port_min) + 1;
    let offset = u32::from(port - port_min);
    let n = u32::from(count);
    // The owner is the largest i with floor(i*len/n) <= offset: i = floor(((offset+1)*n
    // - 1) / len), which is exact (see the test) and needs no loop.
    Some((((offset + 1) * n - 1) / len) as u8)
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
    /// The interface's MTU, host order: tunnel packets that no longer fit once
    /// encapsulated are answered with ICMP fragmentation-needed / packet-too-big. 0:
    /// unknown, no check.
    pub mtu: u16,
    /// `CONFIG_F_*` bits: those the program was loaded with (its `.rodata` copy is what
    /// it reads, as for `tables`), and [`CONFIG_F_NATIVE`], which it reads here.
    pub flags: u32,
    /// The layout the program was loaded with (its `.rodata` copy is what it reads): kept
    /// here for the next agent, which adopts the tables only with the same seeds and
    /// sizes (all zero in a config written by a release without it).
    pub tables: crate::layout::TableLayout,
    /// Tunnel: outer source address toward IPv4 backends (network order; 0: none, such
    /// packets are dropped, `drop_tunnel`).
    pub tunnel_src4: u32,
    /// Tunnel: outer source address toward IPv6 backends (all zero: none).
    pub tunnel_src6: [u32; 4],
}
const _: () = assert!(size_of::<DataplaneConfig>() == 48);

/// `LB_DECAP_ADDRS` key: an address of the host `lb_decap` runs on (outer
/// destinations it strips), as in [`VipKey`] without port and protocol.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DecapAddr {
    /// Address, network order (IPv4 in word 0).
    pub addr: [u32; 4],
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<DecapAddr>() == 20);

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
    use crate::{IPPROTO_TCP as TCP, IPPROTO_UDP as UDP};

    #[test]
    fn the_port_owner_is_the_member_whose_slice_holds_the_port() {
        for (min, max) in [(20_000u16, 29_999u16), (1, 1), (10, 12), (40_000, 65_535)] {
            let len = u32::from(max - min) + 1;
            for count in 1..=CLUSTER_MEMBERS_MAX as u32 {
                if count > len {
                    continue;
                }
                for i in 0..count {
                    let first = u32::from(min) + i * len / count;
                    let end = u32::from(min) + (i + 1) * len / count;
                    for port in first..end {
                        assert_eq!(
                            cluster_port_owner(port as u16, min, max, count as u8),
                            Some(i as u8),
                            "port {port} of {min}..={max} among {count}"
                        );
                    }
                }
            }
            assert_eq!(cluster_port_owner(max, min, max, 0), None);
            if min > 0 {
                assert_eq!(cluster_port_owner(min - 1, min, max, 3), None);
            }
            if max < u16::MAX {
                assert_eq!(cluster_port_owner(max + 1, min, max, 3), None);
            }
        }
    }

    /// Every row of the port lifecycle (docs/nat-ports.md): the state, the protocol and
    /// how long the port is held after the entry's last packet.
    const LIFECYCLE: [(&str, u8, u8, u32); 14] = [
        ("tcp: SYN never answered", TCP, 0, NAT_UNANSWERED_REUSE),
        (
            "tcp: half-open (SYN-ACK, no client ACK)",
            TCP,
            NAT_S_ESTABLISHED,
            NAT_HALF_OPEN_REUSE,
        ),
        (
            "tcp: established",
            TCP,
            NAT_S_ESTABLISHED | NAT_S_ACKED,
            NAT_TCP_IDLE_REUSE,
        ),
        (
            "tcp: client half-closed",
            TCP,
            NAT_S_ESTABLISHED | NAT_S_ACKED | NAT_S_FIN_CLIENT,
            NAT_TCP_IDLE_REUSE,
        ),
        (
            "tcp: backend half-closed",
            TCP,
            NAT_S_ESTABLISHED | NAT_S_ACKED | NAT_S_FIN_BACKEND | NAT_S_BACKEND_FIRST,
            NAT_TCP_IDLE_REUSE,
        ),
        (
            "tcp: closed, client first",
            TCP,
            NAT_S_ESTABLISHED | NAT_S_ACKED | NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND,
            NAT_CLOSED_REUSE,
        ),
        (
            "tcp: closed, backend first (backend in TIME_WAIT)",
            TCP,
            NAT_S_ESTABLISHED
                | NAT_S_ACKED
                | NAT_S_FIN_CLIENT
                | NAT_S_FIN_BACKEND
                | NAT_S_BACKEND_FIRST,
            NAT_TIME_WAIT_REUSE,
        ),
        (
            "tcp: reset before the handshake",
            TCP,
            NAT_S_RST,
            NAT_CLOSED_REUSE,
        ),
        (
            "tcp: reset while established",
            TCP,
            NAT_S_ESTABLISHED | NAT_S_ACKED | NAT_S_RST,
            NAT_CLOSED_REUSE,
        ),
        (
            "tcp: reset after the backend's FIN, before the client's",
            TCP,
            NAT_S_ESTABLISHED | NAT_S_ACKED | NAT_S_FIN_BACKEND | NAT_S_BACKEND_FIRST | NAT_S_RST,
            NAT_CLOSED_REUSE,
        ),
        (
            "tcp: reset on a half-open entry",
            TCP,
            NAT_S_ESTABLISHED | NAT_S_RST,
            NAT_CLOSED_REUSE,
        ),
        ("udp: no reply", UDP, 0, NAT_UDP_REUSE),
        (
            "udp: replied, client silent since",
            UDP,
            NAT_S_REPLIED,
            NAT_UDP_REUSE,
        ),
        (
            "udp: assured",
            UDP,
            NAT_S_REPLIED | NAT_S_ASSURED,
            NAT_UDP_ASSURED_REUSE,
        ),
    ];

    #[test]
    fn nat_port_lifecycle_table() {
        for (row, proto, state, after) in LIFECYCLE {
            assert_eq!(nat_reuse_after(state, proto), after, "{row}");
            for last_seen in [100u32, u32::MAX - 3] {
                let v = NatValue {
                    state,
                    last_seen,
                    ..NatValue::default()
                };
                let at = |idle: u32| nat_reclaimable(&v, proto, last_seen.wrapping_add(idle));
                assert!(!at(0), "{row}: not reclaimable right after a packet");
                assert!(!at(after - 1), "{row}: held {} s", after - 1);
                assert!(at(after), "{row}: reclaimable after {after}");
            }
        }
    }

    #[test]
    fn a_connection_is_established_once_answered_and_ends_on_a_reset_or_both_fins() {
        let acked = NAT_S_ESTABLISHED | NAT_S_ACKED;
        assert!(!nat_conn_established(NAT_S_ESTABLISHED, TCP), "half-open");
        assert!(nat_conn_established(acked, TCP));
        assert!(!nat_conn_established(0, UDP));
        assert!(nat_conn_established(NAT_S_REPLIED, UDP));
        assert!(
            !nat_conn_ended(acked | NAT_S_FIN_CLIENT, TCP),
            "half-closed"
        );
        assert!(nat_conn_ended(
            acked | NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND,
            TCP
        ));
        assert!(nat_conn_ended(acked | NAT_S_RST, TCP));
        assert!(
            !nat_conn_ended(NAT_S_ESTABLISHED | NAT_S_RST, TCP),
            "never established: no end either"
        );
        assert!(!nat_conn_ended(NAT_S_REPLIED | NAT_S_ASSURED, UDP));
    }

    #[test]
    fn time_wait_margin_covers_linux_time_wait() {
        let held_ns = u64::from(NAT_TIME_WAIT_REUSE - 1) << 30;
        assert!(held_ns > u64::from(TCP_TIMEWAIT_SECS) * 1_000_000_000 + 5_000_000_000);
    }

    #[test]
    fn source_bucket_allows_the_burst_then_the_rate() {
        let interval = 10_000_000; // 100 flows/s
        let burst = 5;
        let now = 1_000_000_000_000;
        let mut tat = 0;
        let mut admitted = 0;
        while let Some(next) = source_admit(tat, now, interval, burst) {
            tat = next;
            admitted += 1;
        }
        assert_eq!(admitted, burst, "the whole burst at one instant, no more");
        assert_eq!(
            source_admit(tat, now + u64::from(interval) - 1, interval, burst),
            None
        );
        assert!(source_admit(tat, now + u64::from(interval), interval, burst).is_some());
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // Each is `#[repr(C)]` and `Copy`, made of integers, arrays of integers and other
    // types of this list, and its asserted size is the sum of its fields' sizes.
    impl_pod!(
        VipKey,
        ServiceMeta,
        VipSlot,
        VipIndexHeader,
        Backend,
        DecapAddr,
        FlowKey,
        FlowValue,
        NatValue,
        BackendStats,
        ServiceStats,
        TickClock,
        FlowCacheEntry,
        DataplaneConfig,
        crate::layout::TableLayout,
        SourceKey,
        SourceBucket,
        crate::events::PassiveEvent,
        crate::events::ConnEvent,
        PeerFlow,
        ClusterSnat,
        HopMove,
        ClusterMembers,
    );
}
