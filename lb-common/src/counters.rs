//! Indices of the global per-CPU outcome counters in `LB_COUNTERS`, and their names.
//!
//! Every packet the program sees increments exactly one outcome counter ([`OUTCOMES`]);
//! the flow and event counters count alongside. `RX` is not counted by the program: it
//! is the sum of the outcomes, filled in by [`fill_rx`] when the counters are read.

/// Every packet the program saw (derived: see [`fill_rx`]).
pub const RX: u32 = 0;
/// Passed: not IPv4/IPv6 (ARP, LLDP, ...).
pub const PASS_NOT_IP: u32 = 1;
/// Passed: IP but not addressed to a VIP nor a NAT reply.
pub const PASS_NOT_VIP: u32 = 2;
/// Passed: headers too short or invalid before a VIP could be recognised
/// (truncated Ethernet/VLAN/IP header, IPv4 IHL < 5, wrong version).
pub const PASS_MALFORMED: u32 = 3;
/// Passed: an IP fragment (lb does not reassemble; the kernel decides).
pub const PASS_FRAGMENT: u32 = 4;
/// Passed: an L4 protocol lb does not balance (not TCP/UDP, IPv6 extension headers).
pub const PASS_UNSUPPORTED_L4: u32 = 5;
/// Dropped: addressed to a VIP port but the TCP/UDP header is truncated or invalid.
pub const DROP_MALFORMED: u32 = 6;
/// Dropped: the service has no backend (fail-closed, or nothing configured).
pub const DROP_NO_BACKEND: u32 = 7;
/// Dropped: nat could not allocate a source port (all attempts collided).
pub const DROP_NAT_PORTS: u32 = 8;
/// Transmitted: dsr, MAC rewritten toward the backend.
pub const TX_DSR: u32 = 9;
/// Transmitted: nat, client -> backend.
pub const TX_NAT_FORWARD: u32 = 10;
/// Transmitted: nat, backend reply -> client.
pub const TX_NAT_REPLY: u32 = 11;
/// Flow table hit (flow kept its backend).
pub const FLOW_HIT: u32 = 12;
/// Flow table miss: a new flow chose a backend through Maglev.
pub const FLOW_NEW: u32 = 13;
/// Pinned backend no longer live: the flow was re-hashed.
pub const FLOW_REHASH: u32 = 14;
/// Passive event dropped because the ring buffer was full.
pub const EVENTS_LOST: u32 = 15;
/// Passive events sent.
pub const EVENTS_SENT: u32 = 16;
/// Dropped: the backend id in a table slot or flow has no backend entry.
pub const DROP_BAD_BACKEND: u32 = 17;

/// The counters of which every packet increments exactly one.
pub const OUTCOMES: [u32; 12] = [
    PASS_NOT_IP,
    PASS_NOT_VIP,
    PASS_MALFORMED,
    PASS_FRAGMENT,
    PASS_UNSUPPORTED_L4,
    DROP_MALFORMED,
    DROP_NO_BACKEND,
    DROP_NAT_PORTS,
    DROP_BAD_BACKEND,
    TX_DSR,
    TX_NAT_FORWARD,
    TX_NAT_REPLY,
];

/// Sets `RX` of counters read from `LB_COUNTERS` to the sum of the outcomes (the
/// program does not spend a counter update per packet on it).
pub fn fill_rx(counters: &mut [u64; COUNT as usize]) {
    counters[RX as usize] = OUTCOMES.iter().map(|&i| counters[i as usize]).sum();
}

/// Number of counters (size of `LB_COUNTERS`).
pub const COUNT: u32 = 18;

/// Counter names, indexed like the constants above; used for metrics and status.
pub const NAMES: [&str; COUNT as usize] = [
    "rx",
    "pass_not_ip",
    "pass_not_vip",
    "pass_malformed",
    "pass_fragment",
    "pass_unsupported_l4",
    "drop_malformed",
    "drop_no_backend",
    "drop_nat_ports",
    "tx_dsr",
    "tx_nat_forward",
    "tx_nat_reply",
    "flow_hit",
    "flow_new",
    "flow_rehash",
    "events_lost",
    "events_sent",
    "drop_bad_backend",
];
