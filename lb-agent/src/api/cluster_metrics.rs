//! `/metrics` for the cluster component (with `[cluster]`): each peer's state, records
//! and lag, the refusals by reason, the datagrams no connection took, the next-hop moves
//! followed.

use super::metrics::{header, line};
use crate::cluster::{ClusterStatus, PeerState, PeerStatus};

/// A per-peer family: name, type, help, the value of a peer.
type PeerFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&PeerStatus) -> f64,
);

pub(super) fn render(o: &mut String, c: &ClusterStatus) {
    header(
        o,
        "lb_cluster_resync_complete",
        "gauge",
        "1 once the starting bulk resync completed or timed out (announcing may begin)",
    );
    line(
        o,
        "lb_cluster_resync_complete",
        &[],
        f64::from(u8::from(c.resync_complete)),
    );
    header(
        o,
        "lb_cluster_connections",
        "gauge",
        "nat connections known to the cluster component, own and replicated",
    );
    line(o, "lb_cluster_connections", &[], c.connections as f64);
    header(
        o,
        "lb_cluster_peer_up",
        "gauge",
        "1 while this node's connection to the peer is up; state says which",
    );
    for p in &c.peers {
        line(
            o,
            "lb_cluster_peer_up",
            &[("peer", &p.name), ("state", p.state.as_str())],
            f64::from(u8::from(p.state == PeerState::Up)),
        );
    }
    let per_peer: [PeerFamily; 5] = [
        (
            "lb_cluster_records_sent_total",
            "counter",
            "records sent to the peer (bulk resync included)",
            |p| p.sent as f64,
        ),
        (
            "lb_cluster_records_resent_total",
            "counter",
            "records sent to the peer again after a reconnect",
            |p| p.resent as f64,
        ),
        (
            "lb_cluster_records_received_total",
            "counter",
            "records received from the peer and applied",
            |p| p.received as f64,
        ),
        (
            "lb_cluster_lag_records",
            "gauge",
            "records published and not yet acknowledged by the peer",
            |p| p.lag_records as f64,
        ),
        (
            "lb_cluster_lag_seconds",
            "gauge",
            "age of the oldest record the peer has not acknowledged",
            |p| p.lag_ms as f64 / 1000.0,
        ),
    ];
    for (name, kind, help, value) in per_peer {
        header(o, name, kind, help);
        for p in &c.peers {
            line(o, name, &[("peer", &p.name)], value(p));
        }
    }
    header(
        o,
        "lb_cluster_refused_total",
        "counter",
        "what peers sent that was refused, by reason",
    );
    let r = &c.refused;
    for (reason, n) in [
        ("wrong_key", r.wrong_key),
        ("foreign_node", r.foreign_node),
        ("fingerprint", r.fingerprint),
        ("version", r.version),
        ("malformed", r.malformed),
        ("replayed", r.replayed),
    ] {
        line(
            o,
            "lb_cluster_refused_total",
            &[("reason", reason)],
            n as f64,
        );
    }
    header(
        o,
        "lb_cluster_stray_datagrams_total",
        "counter",
        "datagrams on the sync socket that no connection took (forged, replayed late, failed handshakes)",
    );
    line(
        o,
        "lb_cluster_stray_datagrams_total",
        &[],
        c.stray_datagrams as f64,
    );
    header(
        o,
        "lb_cluster_next_hop_moves_total",
        "counter",
        "neighbours on the attached interface seen answering from another MAC, whose move replies follow",
    );
    line(
        o,
        "lb_cluster_next_hop_moves_total",
        &[],
        c.next_hop_moves_followed as f64,
    );
    header(
        o,
        "lb_cluster_peer_table_full_total",
        "counter",
        "other nodes' connections the peer tables had no room for (not installed)",
    );
    line(
        o,
        "lb_cluster_peer_table_full_total",
        &[],
        c.peer_table_full as f64,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::RefusedStatus;

    #[test]
    fn every_peer_and_every_refusal_reason_has_its_series() {
        let status = ClusterStatus {
            node: "lb-a".into(),
            index: 0,
            members: 2,
            resync_complete: true,
            connections: 7,
            peers: vec![PeerStatus {
                name: "lb-b".into(),
                address: "10.0.9.2:7946".into(),
                state: PeerState::Up,
                receiving: true,
                bulk_received: true,
                connects: 1,
                sent: 10,
                resent: 2,
                received: 5,
                lag_records: 3,
                lag_ms: 1500,
            }],
            refused: RefusedStatus {
                wrong_key: 1,
                foreign_node: 0,
                fingerprint: 0,
                version: 0,
                malformed: 4,
                replayed: 0,
            },
            stray_datagrams: 9,
            next_hop_moves: Vec::new(),
            next_hop_moves_followed: 2,
            peer_table_full: 3,
        };
        let mut text = String::new();
        render(&mut text, &status);
        for want in [
            "lb_cluster_resync_complete 1",
            "lb_cluster_connections 7",
            "lb_cluster_peer_up{peer=\"lb-b\",state=\"up\"} 1",
            "lb_cluster_records_sent_total{peer=\"lb-b\"} 10",
            "lb_cluster_records_resent_total{peer=\"lb-b\"} 2",
            "lb_cluster_records_received_total{peer=\"lb-b\"} 5",
            "lb_cluster_lag_records{peer=\"lb-b\"} 3",
            "lb_cluster_lag_seconds{peer=\"lb-b\"} 1.5",
            "lb_cluster_refused_total{reason=\"wrong_key\"} 1",
            "lb_cluster_refused_total{reason=\"malformed\"} 4",
            "lb_cluster_stray_datagrams_total 9",
            "lb_cluster_next_hop_moves_total 2",
            "lb_cluster_peer_table_full_total 3",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }
}
