//! `/metrics`: the snapshot in Prometheus text format, every name prefixed `lb_`.

use std::fmt::Write;

use crate::view::{Histogram, Snapshot};

const STATES: [&str; 6] = [
    "up",
    "checking",
    "unhealthy",
    "unavailable",
    "draining",
    "down",
];

/// Renders `snap` in the Prometheus text exposition format (version 0.0.4).
pub fn render(snap: &Snapshot) -> String {
    let mut out = String::new();
    let o = &mut out;

    header(
        o,
        "lb_build_info",
        "gauge",
        "the agent's build: version, commit and the XDP object's hash (always 1)",
    );
    line(
        o,
        "lb_build_info",
        &[
            ("version", &snap.build.version),
            ("commit", &snap.build.commit),
            ("bpf", &snap.build.bpf),
        ],
        1.0,
    );
    header(
        o,
        "lb_interface_info",
        "gauge",
        "the interface the XDP program is attached to and its mode (always 1)",
    );
    line(
        o,
        "lb_interface_info",
        &[("interface", &snap.interface), ("xdp_mode", &snap.xdp_mode)],
        1.0,
    );

    for f in super::families::FAMILIES {
        family(o, f, &snap.counters);
    }
    header(
        o,
        "lb_dataplane_packets_total",
        "counter",
        "DEPRECATED, removed in the next release: the same counters by name in one family (use lb_packets_{forwarded,passed,dropped}_total and the event families)",
    );
    for (name, value) in &snap.counters {
        line(
            o,
            "lb_dataplane_packets_total",
            &[("counter", name)],
            *value as f64,
        );
    }
    tables(o, snap.occupancy.as_ref());

    header(
        o,
        "lb_passive_events_total",
        "counter",
        "passive failure events from the data plane",
    );
    for (kind, value) in &snap.passive_events {
        line(
            o,
            "lb_passive_events_total",
            &[("kind", kind)],
            *value as f64,
        );
    }

    header(
        o,
        "lb_transitions_total",
        "counter",
        "server state transitions",
    );
    line(o, "lb_transitions_total", &[], snap.transitions as f64);

    header(
        o,
        "lb_agent_local_faults_total",
        "counter",
        "probe runs without a verdict because this host failed (never counted against a server)",
    );
    line(
        o,
        "lb_agent_local_faults_total",
        &[],
        snap.local_faults.total as f64,
    );
    header(
        o,
        "lb_agent_local_fault",
        "gauge",
        "1 while a local fault is at most 30 s old: verdicts are frozen",
    );
    line(
        o,
        "lb_agent_local_fault",
        &[],
        u8::from(snap.local_faults.active) as f64,
    );

    header(
        o,
        "lb_agent_publish_failures_total",
        "counter",
        "publishes to the data plane that failed (retried on a backoff, docs/internals/publish.md)",
    );
    line(
        o,
        "lb_agent_publish_failures_total",
        &[],
        snap.publish.failures as f64,
    );
    header(
        o,
        "lb_agent_publish_retry_services",
        "gauge",
        "services whose last publish failed, waiting for the retry",
    );
    line(
        o,
        "lb_agent_publish_retry_services",
        &[],
        snap.publish.held.len() as f64,
    );

    syn_check(o);

    histogram(
        o,
        "lb_propagation_seconds",
        "verdict to maps written",
        &snap.propagation,
    );

    type SvcGauge = (
        &'static str,
        &'static str,
        fn(&crate::view::ServiceStatus) -> f64,
    );
    let service_gauges: [SvcGauge; 9] = [
        (
            "lb_service_main_weight",
            "total weight of the primary group",
            |s| s.main_weight as f64,
        ),
        (
            "lb_service_active_weight",
            "weight of the usable primaries",
            |s| s.active_weight as f64,
        ),
        ("lb_service_spare_running", "spare servers running", |s| {
            s.spare_num as f64
        }),
        (
            "lb_service_active_backup_level",
            "backup level carrying traffic (0 = primary)",
            |s| s.active_backup_level as f64,
        ),
        (
            "lb_service_fail_open",
            "1 while every server is unusable and traffic spreads over all",
            |s| u8::from(s.fail_open) as f64,
        ),
        (
            "lb_service_fail_open_tier",
            "0; 1 = fail-open over suspect servers; 2 = over every server not down",
            |s| f64::from(s.fail_open_tier),
        ),
        ("lb_service_packets_total", "packets to the service", |s| {
            s.stats.packets as f64
        }),
        ("lb_service_bytes_total", "bytes to the service", |s| {
            s.stats.bytes as f64
        }),
        ("lb_service_flows_total", "new flows of the service", |s| {
            s.stats.flows as f64
        }),
    ];
    for (name, help, get) in service_gauges {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        header(o, name, kind, help);
        for s in &snap.services {
            line(o, name, &[("service", &s.name)], get(s));
        }
    }

    header(
        o,
        "lb_server_state",
        "gauge",
        "1 for the server's current state",
    );
    header(o, "lb_server_weight", "gauge", "configured weight");
    header(
        o,
        "lb_server_active",
        "gauge",
        "1 while in the Maglev table",
    );
    header(
        o,
        "lb_server_packets_total",
        "counter",
        "packets forwarded to the server",
    );
    header(
        o,
        "lb_server_bytes_total",
        "counter",
        "bytes forwarded to the server",
    );
    header(
        o,
        "lb_server_flows_total",
        "counter",
        "new flows assigned to the server",
    );
    header(o, "lb_probe_runs_total", "counter", "probes run");
    header(o, "lb_probe_failures_total", "counter", "probes failed");
    header(
        o,
        "lb_probe_consecutive_failures",
        "gauge",
        "current run of failures",
    );
    header(
        o,
        "lb_probe_last_duration_seconds",
        "gauge",
        "duration of the server's last probe",
    );
    header(
        o,
        "lb_server_active_flows",
        "gauge",
        "flows pinned to the server that are still open (nat: its connection has not closed; dsr: a packet within the flow idle timeout), sampled every few seconds; 0 after a drain means the server is free",
    );
    for s in &snap.services {
        for srv in &s.servers {
            let l = [
                ("service", s.name.as_str()),
                ("server", srv.address.as_str()),
            ];
            for st in STATES {
                let labels = [l[0], l[1], ("state", st)];
                line(
                    o,
                    "lb_server_state",
                    &labels,
                    u8::from(srv.state == st) as f64,
                );
            }
            line(o, "lb_server_weight", &l, srv.weight as f64);
            line(o, "lb_server_active", &l, u8::from(srv.active) as f64);
            line(o, "lb_server_packets_total", &l, srv.stats.packets as f64);
            line(o, "lb_server_bytes_total", &l, srv.stats.bytes as f64);
            line(o, "lb_server_flows_total", &l, srv.stats.flows as f64);
            for (probe, p) in &srv.health.probes {
                let pl = [l[0], l[1], ("probe", probe.as_str())];
                line(o, "lb_probe_runs_total", &pl, p.count as f64);
                line(o, "lb_probe_failures_total", &pl, p.failures as f64);
                line(o, "lb_probe_consecutive_failures", &pl, p.fails as f64);
                line(
                    o,
                    "lb_probe_last_duration_seconds",
                    &pl,
                    p.last_duration_ms / 1000.0,
                );
            }
            if let Some(n) = srv.active_flows {
                line(o, "lb_server_active_flows", &l, n as f64);
            }
        }
    }
    probe_durations(o, &snap.services);
    if snap.announce.enabled {
        announce(o, &snap.announce);
    }
    if let Some(cluster) = &snap.cluster {
        super::cluster_metrics::render(o, cluster);
    }
    out
}

/// One family of the regrouped data-plane counters.
fn family(
    o: &mut String,
    f: &super::families::Family,
    counters: &std::collections::BTreeMap<String, u64>,
) {
    header(o, f.name, "counter", f.help);
    for (counter, value) in f.members {
        let v = counters.get(*counter).copied().unwrap_or(0) as f64;
        if f.label.is_empty() {
            line(o, f.name, &[], v);
        } else {
            line(o, f.name, &[(f.label, value)], v);
        }
    }
}

/// The flow and nat tables' occupancy, as last sampled (docs/metrics.md).
fn tables(o: &mut String, t: Option<&crate::view::TablesOccupancy>) {
    let Some(t) = t else {
        return;
    };
    for (name, help, v) in [
        (
            "lb_flow_table_entries",
            "flows held in the flow table (not yet idle or failed), sampled",
            t.flow_entries,
        ),
        (
            "lb_flow_table_capacity",
            "ways of the flow table (sized for a quarter of them live)",
            t.flow_capacity,
        ),
        (
            "lb_nat_table_entries",
            "nat entries whose source port is held (not yet reclaimable), sampled",
            t.nat_entries,
        ),
        (
            "lb_nat_table_capacity",
            "ways of the nat table",
            t.nat_capacity,
        ),
    ] {
        header(o, name, "gauge", help);
        line(o, name, &[], v as f64);
    }
    header(
        o,
        "lb_table_sample_duration_seconds",
        "gauge",
        "how long the last scan of the flow and nat tables took",
    );
    line(o, "lb_table_sample_duration_seconds", &[], t.scan_seconds);
    header(
        o,
        "lb_table_sample_age_seconds",
        "gauge",
        "age of the table figures (sampled every few seconds)",
    );
    line(o, "lb_table_sample_age_seconds", &[], t.age_seconds);
}

/// Probe durations per service and probe (all servers together).
fn probe_durations(o: &mut String, services: &[crate::view::ServiceStatus]) {
    let name = "lb_probe_duration_seconds";
    header(
        o,
        name,
        "histogram",
        "probe durations of the service's servers, by probe",
    );
    for s in services {
        for (probe, h) in &s.probe_durations {
            let l = [("service", s.name.as_str()), ("probe", probe.as_str())];
            histogram_series(o, name, &l, h);
        }
    }
}

/// VIP announcement (docs/multi-node.md): one series per VIP and BGP protocol.
fn announce(o: &mut String, a: &crate::view::AnnounceStatus) {
    header(
        o,
        "lb_node_drained",
        "gauge",
        "1 while the node is drained (every VIP withdrawn)",
    );
    line(o, "lb_node_drained", &[], if a.drained { 1.0 } else { 0.0 });
    header(
        o,
        "lb_vip_announced",
        "gauge",
        "1 while the VIP is announced to the routers; reason says why (not)",
    );
    for v in &a.vips {
        line(
            o,
            "lb_vip_announced",
            &[("vip", &v.vip), ("reason", &v.reason)],
            if v.announced { 1.0 } else { 0.0 },
        );
    }
    header(
        o,
        "lb_bgp_protocol_up",
        "gauge",
        "1 while BIRD reports the protocol up (birdc show protocols)",
    );
    for p in &a.bgp {
        line(
            o,
            "lb_bgp_protocol_up",
            &[("name", &p.name), ("proto", &p.proto), ("info", &p.info)],
            if p.state == "up" { 1.0 } else { 0.0 },
        );
    }
}

pub(super) fn header(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}");
    let _ = writeln!(o, "# TYPE {name} {kind}");
}

pub(super) fn line(o: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    o.push_str(name);
    if !labels.is_empty() {
        o.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            let _ = write!(o, "{k}=\"{}\"", escape(v));
        }
        o.push('}');
    }
    let _ = writeln!(o, " {value}");
}

fn histogram(o: &mut String, name: &str, help: &str, h: &Histogram) {
    header(o, name, "histogram", help);
    histogram_series(o, name, &[], h);
}

/// One series of a histogram whose header is written: cumulative buckets (`labels`, then
/// `le`), sum and count.
fn histogram_series(o: &mut String, name: &str, labels: &[(&str, &str)], h: &Histogram) {
    let mut cumulative = 0;
    for (i, count) in h.counts.iter().enumerate() {
        cumulative += count;
        let le = h
            .bounds
            .get(i)
            .map(|b| b.to_string())
            .unwrap_or_else(|| "+Inf".into());
        let mut with_le = labels.to_vec();
        with_le.push(("le", &le));
        line(o, &format!("{name}_bucket"), &with_le, cumulative as f64);
    }
    line(o, &format!("{name}_sum"), labels, h.sum);
    line(o, &format!("{name}_count"), labels, h.count as f64);
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The SYN check of plain tcp probes (docs/probes.md): whether it runs, and what its
/// replies came to (forged or stale ones are counted here, never logged per packet).
fn syn_check(o: &mut String) {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(in_use) = crate::probe::syn::in_use() else {
        return;
    };
    header(
        o,
        "lb_probe_tcp_syn_check",
        "gauge",
        "1: tcp probes without send/expect/test use SYN checks; 0: they connect (no raw socket)",
    );
    line(o, "lb_probe_tcp_syn_check", &[], u8::from(in_use) as f64);
    header(
        o,
        "lb_probe_syn_packets_total",
        "counter",
        "SYN check packets by outcome (rejected: wrong ack; unmatched: no probe waiting; sent_late: SYNs sent after their probe timed out; unreachable: ICMP errors quoting a SYN in flight; icmp_rejected: quoting a probe in flight with a wrong sequence number; icmp_unmatched: quoting no probe in flight)",
    );
    let s = crate::probe::syn::stats();
    for (kind, n) in [
        ("sent", &s.sent),
        ("accepted", &s.accepted),
        ("refused", &s.refused),
        ("rejected", &s.rejected),
        ("unmatched", &s.unmatched),
        ("malformed", &s.malformed),
        ("sent_late", &s.sent_late),
        ("unreachable", &s.unreachable),
        ("icmp_rejected", &s.icmp_rejected),
        ("icmp_unmatched", &s.icmp_unmatched),
    ] {
        line(
            o,
            "lb_probe_syn_packets_total",
            &[("kind", kind)],
            n.load(Relaxed) as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{ServerStatus, ServiceStatus};

    #[test]
    fn renders_states_labels_and_histogram() {
        let mut snap = Snapshot::default();
        snap.propagation.observe(40e-6);
        snap.services.push(ServiceStatus {
            name: "web".into(),
            servers: vec![
                ServerStatus {
                    address: "10.0.1.1:80".into(),
                    state: "unhealthy".into(),
                    ..Default::default()
                }
                .into(),
            ],
            ..Default::default()
        });
        let text = render(&snap);
        assert!(text.contains(
            "lb_server_state{service=\"web\",server=\"10.0.1.1:80\",state=\"unhealthy\"} 1"
        ));
        assert!(
            text.contains("lb_server_state{service=\"web\",server=\"10.0.1.1:80\",state=\"up\"} 0")
        );
        assert!(text.contains("lb_propagation_seconds_bucket{le=\"0.00005\"} 1"));
        assert!(text.contains("lb_propagation_seconds_count 1"));
    }

    #[test]
    fn build_and_interface_info_are_one_with_their_labels() {
        let snap = Snapshot {
            build: crate::build_info::current(),
            interface: "eth0".into(),
            xdp_mode: "generic".into(),
            ..Default::default()
        };
        let text = render(&snap);
        let build = format!(
            "lb_build_info{{version=\"{}\",commit=\"{}\",bpf=\"{}\"}} 1",
            crate::build_info::VERSION,
            crate::build_info::COMMIT,
            crate::build_info::bpf_hash()
        );
        assert!(text.contains(&build), "{text}");
        assert!(text.contains("lb_interface_info{interface=\"eth0\",xdp_mode=\"generic\"} 1"));
    }
}
