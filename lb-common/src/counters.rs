//! Indices of the global per-CPU outcome counters in `LB_COUNTERS`, and their names.
//!
//! Every packet the program sees moves exactly one outcome counter ([`OUTCOMES`], as
//! [`derive`] returns them); the flow and event counters count alongside. Some figures are not counted by the
//! program as such but derived by [`derive`] when `LB_COUNTERS` is read (its
//! [`RAW_COUNT`] slots become the [`COUNT`] figures every reader sees): `RX` is the sum
//! of the outcomes, and a packet forwarded from the per-CPU flow cache increments one
//! raw counter ([`TX_DSR_CACHED`], [`TX_NAT_FORWARD_CACHED`]) that counts both as its
//! transmit outcome and as a `FLOW_HIT` — one counter update per packet fewer on the
//! established path.

/// Every packet the program saw (derived: see [`derive`]).
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
/// Transmitted: dsr, MAC rewritten toward the backend (with [`TX_DSR_CACHED`]).
pub const TX_DSR: u32 = 9;
/// Transmitted: nat, client -> backend (with [`TX_NAT_FORWARD_CACHED`]).
pub const TX_NAT_FORWARD: u32 = 10;
/// Transmitted: nat, backend reply -> client.
pub const TX_NAT_REPLY: u32 = 11;
/// Flow table hit (flow kept its backend; with the packets forwarded from the per-CPU
/// flow cache, [`TX_DSR_CACHED`] and [`TX_NAT_FORWARD_CACHED`]).
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
/// Passed untouched: the frame's destination MAC is not the interface's (flooded unknown
/// unicast, a promiscuous NIC, a standby peer's traffic) or is broadcast/multicast.
pub const PASS_NOT_FOR_HOST: u32 = 18;
/// Passed to the kernel: IPv4 TTL or IPv6 hop limit <= 1 (the kernel answers with
/// ICMP time-exceeded; forwarding it would be wrong).
pub const PASS_TTL_EXPIRED: u32 = 19;
/// Dropped: addressed to a VIP from a source that cannot be a client (the VIP itself,
/// broadcast, multicast, unspecified, loopback).
pub const DROP_BAD_SOURCE: u32 = 20;
/// Dropped: a TCP flag combination that cannot open a connection (SYN+FIN, SYN+RST, no
/// flags) on a packet that would open a flow.
pub const DROP_BAD_FLAGS: u32 = 21;
/// Dropped: a new flow refused because its client source used up its budget of new
/// nat flows (per-source fairness of the source-port range).
pub const DROP_SOURCE_LIMIT: u32 = 22;
/// Transmitted: an ICMP/ICMPv6 error about a nat flow (unreachable, fragmentation
/// needed, packet too big), translated back to the client.
pub const TX_ICMP_NAT: u32 = 23;
/// ICMP error about a nat flow that was not believed: its outer source is not the
/// flow's backend, or the embedded packet does not match the flow's state (side
/// counter, not an outcome).
pub const ICMP_IGNORED: u32 = 24;
/// nat port allocation: the first (address, port) tried was free (side counter).
pub const NAT_PORT_FIRST: u32 = 25;
/// nat port allocation: a free (address, port) found after one or more taken ones
/// (side counter; rising share = port pressure).
pub const NAT_PORT_RETRIED: u32 = 26;
/// nat port allocation: no candidate was free, and a reclaimable one (its connection
/// closed or idle long enough, docs/nat-ports.md) was taken over (side counter).
/// Failures are `DROP_NAT_PORTS`.
pub const NAT_PORT_RECLAIMED: u32 = 27;
/// A new flow found its `LB_FLOWS` bucket full of flows active within the flow idle
/// timeout and took the way of the one idle longest (side counter: that flow's next
/// packet chooses again through Maglev).
pub const FLOW_EVICTED: u32 = 28;
/// Dropped: `lb_xdp` could not hand a packet that needs the whole path to
/// `lb_xdp_full` (its tail call failed: `LB_PROGRAMS` empty). The loader fills it
/// before attaching, so this stays zero unless something is broken; dropped rather than
/// passed, so that the host stack never answers for a VIP (docs/internals/fast-path.md).
pub const DROP_NO_FULL_PATH: u32 = 29;
/// Transmitted: tunnel (ipip/gue), encapsulated toward the backend's address.
pub const TX_TUNNEL: u32 = 30;
/// Transmitted: an ICMP fragmentation-needed (IPv4 with DF) or packet-too-big (IPv6)
/// answer to the client: its packet to a tunnel service would not fit the interface's
/// MTU once encapsulated.
pub const TX_ICMP_TOO_BIG: u32 = 31;
/// Dropped: a tunnel packet that could not be encapsulated: too big for the MTU
/// without DF (IPv4), VLAN-tagged, no outer source address for the backend's family,
/// or no headroom.
pub const DROP_TUNNEL: u32 = 32;
/// Dropped: a nat SYN whose `LB_FLOWS` bucket is full of established flows that all
/// talked within the last 10 s (none idle, none waiting for a handshake). The new
/// connection is refused rather than an established one evicted, as conntrack drops a
/// new connection when its table is full of assured ones (docs/internals/fast-path.md, "Floods");
/// its client resends the SYN. In dsr such a SYN is forwarded unpinned (its first ACK
/// pins it).
pub const DROP_FLOWS_FULL: u32 = 33;
/// Cluster mode: a client packet that missed `LB_FLOWS` found its connection in
/// `LB_PEER_FLOWS` (another node made it) and the flow was pinned as that node pinned it
/// (side counter).
pub const PEER_FLOW_ADOPTED: u32 = 34;
/// Cluster mode: a reverse entry missing from `LB_NAT` was taken from `LB_PEER_NAT`
/// (side counter): a backend's reply, or a client packet of an adopted flow.
pub const PEER_NAT_ADOPTED: u32 = 35;
/// Cluster mode: connection events sent through `LB_CONN_EVENTS` (established, ended).
pub const CONN_EVENTS_SENT: u32 = 36;
/// Cluster mode: connection events dropped because `LB_CONN_EVENTS` was full.
pub const CONN_EVENTS_LOST: u32 = 37;
/// Cluster mode: a nat allocation candidate skipped because its reply 5-tuple is in
/// `LB_PEER_NAT` (a connection another node made holds it; side counter).
pub const NAT_PORT_PEER_HELD: u32 = 38;
/// Transmitted, cluster mode: a backend's reply this node has no entry for, sent on to
/// the member whose port slice holds its destination port (the node that made the
/// connection and has not shared it yet), with only its Ethernet addresses rewritten.
pub const TX_PEER_BOUNCE: u32 = 39;
/// Dropped, nat: a TCP segment other than a SYN for a flow without an entry. It cannot
/// make a working connection (a new source port the backend never saw, which answers it
/// with a reset), and from a spoofed source it would take a flow entry and a port
/// (docs/capacity.md, "Spoofed packets of every kind").
pub const DROP_NO_FLOW: u32 = 40;
/// dsr and tunnel: a new flow forwarded by its Maglev choice without a flow entry, its
/// bucket having no way an unconfirmed flow may take (side counter: its next packet
/// chooses again, the same backend while the Maglev table is unchanged).
pub const FLOW_UNPINNED: u32 = 41;
/// Native mode: a TCP/UDP packet whose checksum field held only its pseudo-header's sum
/// (a partial checksum a sender on the same host left for the device to complete, which
/// a veth hands over) was given its full checksum before it was forwarded (side counter;
/// a complete checksum that equals that sum is left as it is, uncounted;
/// docs/internals/fast-path.md, "Partial checksums").
pub const CSUM_COMPLETED: u32 = 42;

/// The counters of which every packet increments exactly one.
pub const OUTCOMES: [u32; 25] = [
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
    PASS_NOT_FOR_HOST,
    PASS_TTL_EXPIRED,
    DROP_BAD_SOURCE,
    DROP_BAD_FLAGS,
    DROP_SOURCE_LIMIT,
    TX_ICMP_NAT,
    DROP_NO_FULL_PATH,
    TX_TUNNEL,
    TX_ICMP_TOO_BIG,
    DROP_TUNNEL,
    DROP_FLOWS_FULL,
    TX_PEER_BOUNCE,
    DROP_NO_FLOW,
];

/// Raw only (never in [`derive`]'s figures): transmitted in dsr from the per-CPU flow
/// cache — a `TX_DSR` outcome and a `FLOW_HIT` in one update.
pub const TX_DSR_CACHED: u32 = 43;
/// Raw only: transmitted in nat (client -> backend) from the per-CPU flow cache — a
/// `TX_NAT_FORWARD` outcome and a `FLOW_HIT` in one update.
pub const TX_NAT_FORWARD_CACHED: u32 = 44;

/// Number of counters the readers see (the figures [`derive`] returns, [`NAMES`]).
pub const COUNT: u32 = 43;
/// Number of slots of `LB_COUNTERS`: the [`COUNT`] figures' own slots (`RX`'s stays
/// zero) and the raw-only cache outcomes.
pub const RAW_COUNT: u32 = 45;

/// The figures every reader sees (indexed by the constants above, named by [`NAMES`])
/// from the per-CPU sums of `LB_COUNTERS`' slots: the cache outcomes folded into their
/// transmit outcome and `FLOW_HIT`, and `RX` the sum of the outcomes. Readers of the
/// raw map (the agent, the fixtures, the benchmarks) go through this one function.
pub fn derive(raw: &[u64; RAW_COUNT as usize]) -> [u64; COUNT as usize] {
    let mut out = [0u64; COUNT as usize];
    out.copy_from_slice(&raw[..COUNT as usize]);
    for (tx, cached) in [
        (TX_DSR, TX_DSR_CACHED),
        (TX_NAT_FORWARD, TX_NAT_FORWARD_CACHED),
    ] {
        out[tx as usize] += raw[cached as usize];
        out[FLOW_HIT as usize] += raw[cached as usize];
    }
    out[RX as usize] = OUTCOMES.iter().map(|&i| out[i as usize]).sum();
    out
}

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
    "pass_not_for_host",
    "pass_ttl_expired",
    "drop_bad_source",
    "drop_bad_flags",
    "drop_source_limit",
    "tx_icmp_nat",
    "icmp_ignored",
    "nat_port_first",
    "nat_port_retried",
    "nat_port_reclaimed",
    "flow_evicted",
    "drop_no_full_path",
    "tx_tunnel",
    "tx_icmp_too_big",
    "drop_tunnel",
    "drop_flows_full",
    "peer_flow_adopted",
    "peer_nat_adopted",
    "conn_events_sent",
    "conn_events_lost",
    "nat_port_peer_held",
    "tx_peer_bounce",
    "drop_no_flow",
    "flow_unpinned",
    "csum_completed",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_outcomes_count_as_their_tx_and_a_flow_hit() {
        let mut raw = [0u64; RAW_COUNT as usize];
        raw[TX_DSR as usize] = 2;
        raw[TX_DSR_CACHED as usize] = 5;
        raw[TX_NAT_FORWARD as usize] = 3;
        raw[TX_NAT_FORWARD_CACHED as usize] = 7;
        raw[FLOW_HIT as usize] = 1;
        raw[PASS_NOT_VIP as usize] = 11;
        let c = derive(&raw);
        assert_eq!(c[TX_DSR as usize], 7);
        assert_eq!(c[TX_NAT_FORWARD as usize], 10);
        assert_eq!(c[FLOW_HIT as usize], 13);
        assert_eq!(c[RX as usize], 7 + 10 + 11);
    }
}
