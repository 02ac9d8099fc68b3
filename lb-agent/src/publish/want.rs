//! What the agent asks the publisher for: each service with its VIP, forwarding and
//! backends, each backend with its weight, MAC and [`Role`] (the flags its entry carries).

use std::{
    net::{IpAddr, SocketAddr},
    ops::RangeInclusive,
};

use lb_common::maps::{BACKEND_F_LIVE, BACKEND_F_SERVING};

/// What a backend does in the data plane, and the flags its entry carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// In the Maglev table: receives new flows and keeps its pinned flows
    /// (`BACKEND_F_LIVE | BACKEND_F_SERVING`).
    Active,
    /// Not in the table, but its established TCP flows stay until they end; a SYN reusing
    /// a pinned 5-tuple re-hashes, pinned UDP flows move (`BACKEND_F_LIVE`): left traffic
    /// for a health or membership reason (unhealthy, unavailable, draining, idle spare,
    /// inactive backup level, removed from the config during its grace period).
    Sticky,
    /// Out: not in the table, and its pinned flows are re-hashed (no flag): admin down,
    /// MAC unknown, never in traffic.
    Removed,
}

impl Role {
    /// The `Backend::flags` of a backend in this role (`mac_known`: selectable at all).
    pub fn flags(self, mac_known: bool) -> u8 {
        match (self, mac_known) {
            (_, false) | (Role::Removed, _) => 0,
            (Role::Sticky, true) => BACKEND_F_LIVE,
            (Role::Active, true) => BACKEND_F_LIVE | BACKEND_F_SERVING,
        }
    }
}

/// One backend as the agent wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredBackend {
    pub addr: SocketAddr,
    pub weight: u32,
    /// Link-layer address of the backend or of the next hop toward it; `None` = unknown.
    pub mac: Option<[u8; 6]>,
    pub role: Role,
}

/// How a tunnel service encapsulates (docs/tunnel.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tunnel {
    /// IP-in-IP (IPv4 protocol 4 / IPv6 next header 41).
    Ipip,
    /// The same inside UDP to `lb_common::maps::GUE_PORT`.
    Gue,
}

/// nat parameters of a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatSpec {
    /// Source addresses toward the backends (1..=`MAX_SNAT_ADDRS`, the VIP's family);
    /// flows are spread over (address, port).
    pub snat_ips: Vec<IpAddr>,
    pub ports: RangeInclusive<u16>,
    /// New nat flows per second one client address may open on average; 0 = no limit.
    pub source_rate: u32,
    /// New nat flows one client address may open at once.
    pub source_burst: u32,
}

/// One virtual service as the agent wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredService {
    pub name: String,
    pub vip: SocketAddr,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub proto: u8,
    /// `Some` for full NAT, `None` for direct server return.
    pub nat: Option<NatSpec>,
    /// `Some` for tunnel forwarding (with `nat` `None`): each packet encapsulated toward
    /// its backend's address.
    pub tunnel: Option<Tunnel>,
    pub backends: Vec<DesiredBackend>,
    /// Slots of its Maglev table (one of `lb_common::MAGLEV_SIZES`); `None`: chosen by
    /// its backend count ([`lb_common::maglev_size_for`]).
    pub maglev_size: Option<u32>,
}
