//! The agent's published view of itself: what the REST API, `/metrics` and
//! `lb-agent status` show (DESIGN.md §9). Built by the agent loop, read by the API.

use std::{collections::BTreeMap, sync::Arc};

use serde::{Deserialize, Serialize};

/// Everything the operator surface shows, as of one moment.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Version, commit and XDP object hash of the agent that made it.
    #[serde(default)]
    pub build: crate::build_info::BuildInfo,
    pub interface: String,
    pub xdp_mode: String,
    pub services: Vec<ServiceStatus>,
    /// Global data-plane counters by name (`lb_common::counters::NAMES`).
    pub counters: BTreeMap<String, u64>,
    /// Verdict-to-maps-written latency.
    pub propagation: Histogram,
    /// State transitions so far.
    pub transitions: u64,
    /// Passive events received, by kind.
    pub passive_events: BTreeMap<String, u64>,
    /// Probes that could not run for a local reason (docs/local-faults.md).
    #[serde(default)]
    pub local_faults: LocalFaultStatus,
    /// VIP announcement to the routers (docs/multi-node.md).
    #[serde(default)]
    pub announce: AnnounceStatus,
    /// Failed publishes and their retry (docs/internals/publish.md, *A publish that fails*).
    #[serde(default)]
    pub publish: PublishStatus,
    /// The flow, nat and source tables' sizes (docs/capacity.md).
    #[serde(default)]
    pub tables: TablesStatus,
    /// The flow and nat tables' occupancy as last sampled; `None` before the first
    /// sample (or without a kernel data plane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupancy: Option<TablesOccupancy>,
    /// The connections shared with the cluster's peers; `None` without `[cluster]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::cluster::ClusterStatus>,
}

/// The flow, nat and source tables as loaded (`agent.max_flows`, docs/capacity.md).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TablesStatus {
    /// Live flows the flow table is sized for (one bucket of four ways each).
    pub max_flows: u32,
    /// Buckets of `LB_FLOWS` and `LB_NAT` (four ways each), entries of `LB_SOURCES`.
    pub flow_buckets: u32,
    pub nat_buckets: u32,
    pub source_entries: u32,
    /// Kernel memory of the three, in bytes.
    pub memory_bytes: u64,
}

/// The flow and nat tables' occupancy, sampled by a scan every few seconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TablesOccupancy {
    /// Flows held (live, neither idle nor failed).
    pub flow_entries: u64,
    /// Ways of the flow table.
    pub flow_capacity: u64,
    /// nat entries holding their source port (not reclaimable).
    pub nat_entries: u64,
    /// Ways of the nat table.
    pub nat_capacity: u64,
    /// How long the scan took.
    pub scan_seconds: f64,
    /// How old the figures are.
    pub age_seconds: f64,
}

/// Publishes to the data plane that failed, and the services waiting for the retry.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PublishStatus {
    /// Failed publishes so far.
    pub failures: u64,
    /// Services whose last publish failed (their verdicts wait for the retry).
    pub held: Vec<String>,
    /// Seconds until the retry, when one waits.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub retry_in_seconds: Option<f64>,
    /// The last failure's error.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last_error: Option<String>,
}

/// Local faults of the agent's host seen by probes: never counted against a server.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LocalFaultStatus {
    /// Probe runs without a verdict because of a local fault, so far.
    pub total: u64,
    /// The last one is at most 30 s old: verdicts are frozen by a local problem.
    pub active: bool,
    /// When the last one happened (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last: Option<String>,
    /// e.g. "local fault: out of file descriptors (EMFILE): connect: ...".
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last_detail: Option<String>,
}

/// VIP announcement and the routing daemon's sessions.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AnnounceStatus {
    /// `announce_interface` is set and announcing has started.
    pub enabled: bool,
    /// Where announced VIPs live (the interface name).
    pub interface: String,
    /// `lb-agent node drain`: every VIP withdrawn.
    pub drained: bool,
    /// Seconds since a service counter last moved (how long the node has been quiet,
    /// for a drain); absent before the first reading.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub quiet_seconds: Option<f64>,
    pub vips: Vec<VipStatus>,
    /// `birdc show protocols` as last read (`agent.bird_socket`).
    pub bgp: Vec<crate::announce::bird_sessions::Protocol>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub bgp_error: Option<String>,
}

/// One VIP address.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VipStatus {
    pub vip: String,
    pub announced: bool,
    /// `serving`, `fail-open`, `no usable server`, `node drained`.
    pub reason: String,
    /// The last route change failed (retried at the next change).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}

/// One virtual service.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ServiceStatus {
    pub name: String,
    pub vip: String,
    pub protocol: String,
    pub forwarding: String,
    /// Total weight of the primary group's non-spare servers.
    pub main_weight: u32,
    /// Weight of the usable non-spare primaries.
    pub active_weight: u32,
    /// Spares running right now.
    pub spare_num: usize,
    /// 0 = primary group.
    pub active_backup_level: u32,
    /// Every server unusable and traffic spread over all of them.
    pub fail_open: bool,
    /// The passive signals this service's protocol and forwarding can produce
    /// (`rst_on_syn`, `icmp_unreachable`, `syn_retransmit`); empty: passive checks are
    /// unavailable (udp with dsr), whatever `max_fails` says (docs/passive-signals.md).
    #[serde(default)]
    pub passive_signals: Vec<String>,
    /// 0 = not failing open; 1 = over suspect servers (passive, held by the cap,
    /// drained); 2 = over every server not down, probe-failing ones included.
    #[serde(default)]
    pub fail_open_tier: u8,
    /// Probe runs of this service without a verdict because the agent's host failed.
    #[serde(default)]
    pub local_faults: LocalFaultStatus,
    /// Fingerprint of the live Maglev table by backend address (equal on two nodes =
    /// same backend for every flow hash); empty before the first publish.
    #[serde(default)]
    pub table_fingerprint: String,
    /// Slots of its Maglev table (one of `lb_common::MAGLEV_SIZES`); 0 before the first
    /// publish.
    #[serde(default)]
    pub maglev_size: u32,
    pub stats: Stats,
    /// Probe durations of all the service's servers, by probe name (`/metrics`'
    /// `lb_probe_duration_seconds`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub probe_durations: BTreeMap<String, Histogram>,
    /// Shared with the snapshots before and after this one while a server's record does
    /// not change (built incrementally: `agent/snapshot/build.rs`).
    pub servers: Vec<Arc<ServerStatus>>,
}

/// One backend of a service.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerStatus {
    pub address: String,
    pub weight: u32,
    /// `up`, `checking`, `unhealthy`, `unavailable`, `draining`, `down`.
    pub state: String,
    /// `idle` or `running` for spare servers; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub spare: Option<String>,
    /// Backup level (0 = primary group).
    pub backup: u32,
    /// In the Maglev table right now.
    pub active: bool,
    /// Slots of the live Maglev table (of the service's `maglev_size`) that send new
    /// flows to it.
    #[serde(default)]
    pub slots: u32,
    /// Link-layer address used toward it; absent while unknown (not selectable).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mac: Option<String>,
    pub health: HealthStatus,
    pub stats: Stats,
    /// Flows pinned to the server that are still open (nat: the connection has not
    /// closed; dsr: a packet within the flow idle timeout), as last sampled; `None`
    /// before the first sample. 0 after a drain: the server is free.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub active_flows: Option<u64>,
    /// Settings changed at runtime that differ from the config file.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub differs_from_config: Vec<String>,
}

/// Health details of a server.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HealthStatus {
    /// Failures counted so far (probes and passive).
    pub fails: u64,
    /// Total time spent not usable, in milliseconds.
    pub downtime: u64,
    /// When the current down period started (RFC 3339), if down.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub downstart: Option<String>,
    pub probes: BTreeMap<String, ProbeStatus>,
}

/// One probe of a server.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProbeStatus {
    /// Probes run.
    pub count: u64,
    /// Consecutive failures right now.
    pub fails: u64,
    /// Failures in total.
    #[serde(default)]
    pub failures: u64,
    /// When the last probe finished (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last: Option<String>,
    /// `passed`, `failed: <reason>`, or `none`.
    pub last_result: String,
    pub last_duration_ms: f64,
    /// Runs without a verdict because of a local fault (not in `count`).
    #[serde(default)]
    pub local_faults: u64,
}

/// Packet counters.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stats {
    pub packets: u64,
    pub bytes: u64,
    pub flows: u64,
}

/// One state transition, as logged.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Event {
    /// RFC 3339 UTC.
    pub time: String,
    pub service: String,
    pub server: String,
    pub from: String,
    pub to: String,
    pub cause: String,
}

/// A latency histogram with fixed bucket bounds (seconds), Prometheus style.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Histogram {
    /// Upper bounds in seconds, ascending.
    pub bounds: Vec<f64>,
    /// Cumulative-free counts per bucket; one more than `bounds` (the +Inf bucket).
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new(&[
            10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 100e-3,
        ])
    }
}

/// Bucket bounds of probe durations (seconds): 0.5 ms to 10 s, around the probe
/// timeouts (1 s by default).
pub const PROBE_DURATION_BOUNDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation in seconds.
    pub fn observe(&mut self, seconds: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += seconds;
        self.count += 1;
    }

    /// The smallest bucket bound below which at least `q` of the observations fall
    /// (`f64::INFINITY` when they fall in the last bucket); `None` when empty.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let want = (q * self.count as f64).ceil() as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(self.bounds.get(i).copied().unwrap_or(f64::INFINITY));
            }
        }
        Some(f64::INFINITY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_quantiles() {
        let mut h = Histogram::new(&[1e-3, 1e-2]);
        for _ in 0..99 {
            h.observe(0.5e-3);
        }
        h.observe(5e-3);
        assert_eq!(h.counts, vec![99, 1, 0]);
        assert_eq!(h.quantile_bound(0.99), Some(1e-3));
        assert_eq!(h.quantile_bound(1.0), Some(1e-2));
        h.observe(1.0);
        assert_eq!(h.quantile_bound(1.0), Some(f64::INFINITY));
    }
}
