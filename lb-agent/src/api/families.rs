//! The data plane's global counters regrouped into Prometheus families: every packet
//! the program sees lands in exactly one of `lb_packets_forwarded_total`,
//! `lb_packets_passed_total` and `lb_packets_dropped_total` (by `reason`), so their sum
//! is every packet; the counters that count alongside (flow-table events, nat port
//! allocations, passive events, disbelieved ICMP errors) are families of their own.

/// A family and the counters (by `lb_common::counters::NAMES` name) it shows, each
/// under its label value.
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub label: &'static str,
    pub members: &'static [(&'static str, &'static str)],
}

/// Every counter but `rx` (the sum of the outcome families), once.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "lb_packets_forwarded_total",
        help: "packets the XDP program sent back out (XDP_TX), by reason: dsr, nat_forward (client to backend), nat_reply (backend to client), icmp_nat (an ICMP error about a nat flow, translated), tunnel (ipip/gue, encapsulated), icmp_too_big (a too-big answer to a client whose packet would not fit once encapsulated), peer_bounce (cluster mode: a backend's reply sent on to the node that made its connection)",
        label: "reason",
        members: &[
            ("tx_dsr", "dsr"),
            ("tx_nat_forward", "nat_forward"),
            ("tx_nat_reply", "nat_reply"),
            ("tx_icmp_nat", "icmp_nat"),
            ("tx_tunnel", "tunnel"),
            ("tx_icmp_too_big", "icmp_too_big"),
            ("tx_peer_bounce", "peer_bounce"),
        ],
    },
    Family {
        name: "lb_packets_passed_total",
        help: "packets the XDP program passed to the kernel untouched (XDP_PASS), by reason",
        label: "reason",
        members: &[
            ("pass_not_ip", "not_ip"),
            ("pass_not_vip", "not_vip"),
            ("pass_not_for_host", "not_for_host"),
            ("pass_malformed", "malformed"),
            ("pass_fragment", "fragment"),
            ("pass_unsupported_l4", "unsupported_l4"),
            ("pass_ttl_expired", "ttl_expired"),
        ],
    },
    Family {
        name: "lb_packets_dropped_total",
        help: "packets the XDP program dropped (XDP_DROP), by reason",
        label: "reason",
        members: &[
            ("drop_malformed", "malformed"),
            ("drop_no_backend", "no_backend"),
            ("drop_nat_ports", "nat_ports"),
            ("drop_source_limit", "source_limit"),
            ("drop_bad_source", "bad_source"),
            ("drop_bad_flags", "bad_flags"),
            ("drop_bad_backend", "bad_backend"),
            ("drop_no_full_path", "no_full_path"),
            ("drop_flows_full", "flows_full"),
            ("drop_no_flow", "no_flow"),
            ("drop_tunnel", "tunnel"),
        ],
    },
    Family {
        name: "lb_flow_events_total",
        help: "flow-table events (not packet outcomes): hit (a packet of a pinned flow), new (a flow chose its backend through Maglev), rehash (its pinned backend was gone), evicted (a new flow took a full bucket's longest-idle way), unpinned (dsr, tunnel: a new flow forwarded by its Maglev choice without an entry, its bucket having no way an unconfirmed flow may take)",
        label: "event",
        members: &[
            ("flow_hit", "hit"),
            ("flow_new", "new"),
            ("flow_rehash", "rehash"),
            ("flow_evicted", "evicted"),
            ("flow_unpinned", "unpinned"),
        ],
    },
    Family {
        name: "lb_nat_port_allocations_total",
        help: "nat source-port allocations of new flows by result: first (the first candidate was free), retried (a later one), reclaimed (a reclaimable pair was taken over); failures are lb_packets_dropped_total{reason=\"nat_ports\"}",
        label: "result",
        members: &[
            ("nat_port_first", "first"),
            ("nat_port_retried", "retried"),
            ("nat_port_reclaimed", "reclaimed"),
        ],
    },
    Family {
        name: "lb_dataplane_events_total",
        help: "passive-failure events the XDP program sent to the agent (sent) or lost because the ring buffer was full (lost)",
        label: "result",
        members: &[("events_sent", "sent"), ("events_lost", "lost")],
    },
    Family {
        name: "lb_cluster_adoptions_total",
        help: "cluster mode: connections another node made, taken over from the peer tables when their packets reached this node: flow (a client packet pinned as that node pinned it), nat (a reverse entry taken for a reply or an adopted flow)",
        label: "table",
        members: &[("peer_flow_adopted", "flow"), ("peer_nat_adopted", "nat")],
    },
    Family {
        name: "lb_conn_events_total",
        help: "cluster mode: connection events (established, ended) the XDP program sent to the agent (sent) or lost because their ring buffer was full (lost)",
        label: "result",
        members: &[("conn_events_sent", "sent"), ("conn_events_lost", "lost")],
    },
    Family {
        name: "lb_nat_port_peer_held_total",
        help: "cluster mode: nat allocation candidates skipped because a connection another node made holds them",
        label: "",
        members: &[("nat_port_peer_held", "")],
    },
    Family {
        name: "lb_checksums_completed_total",
        help: "native mode: forwarded TCP/UDP packets whose partial checksum (the pseudo-header's sum a sender on the same host left to the device, which a veth hands over) the XDP program completed",
        label: "",
        members: &[("csum_completed", "")],
    },
    Family {
        name: "lb_icmp_ignored_total",
        help: "ICMP errors about nat flows not believed (outer source not the flow's backend, or the quoted packet does not match the flow)",
        label: "",
        members: &[("icmp_ignored", "")],
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::counters::{NAMES, OUTCOMES};

    #[test]
    fn every_counter_is_in_one_family_and_the_outcomes_in_the_packet_families() {
        let mut seen: Vec<&str> = FAMILIES
            .iter()
            .flat_map(|f| f.members.iter().map(|(c, _)| *c))
            .collect();
        seen.sort();
        let before = seen.len();
        seen.dedup();
        assert_eq!(seen.len(), before, "a counter in two families");
        let mut all: Vec<&str> = NAMES.iter().copied().filter(|n| *n != "rx").collect();
        all.sort();
        assert_eq!(seen, all);
        let packets: Vec<&str> = FAMILIES
            .iter()
            .filter(|f| f.name.starts_with("lb_packets_"))
            .flat_map(|f| f.members.iter().map(|(c, _)| *c))
            .collect();
        let mut outcomes: Vec<&str> = OUTCOMES.iter().map(|&i| NAMES[i as usize]).collect();
        outcomes.sort();
        let mut packets_sorted = packets.clone();
        packets_sorted.sort();
        assert_eq!(
            packets_sorted, outcomes,
            "outcomes are exactly the packet families"
        );
    }
}
