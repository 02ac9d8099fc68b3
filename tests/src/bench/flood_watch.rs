//! What a flood scenario watches and sets up around the agent: the flow-table counters
//! and occupancy from its `/metrics` (read as an operator's scraper does), and an
//! nftables rule that keeps the backends' kernels from answering spoofed traffic.

use std::{
    thread,
    time::{Duration, Instant},
};

use crate::{
    agent::api::{self, Api},
    net::topology::{HOST_IF, Topology},
    util::{cmd, error::Error},
};

/// The flow-table counters of `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowCounters {
    /// `lb_flow_events_total{event="evicted"}`.
    pub evicted: u64,
    /// `lb_flow_events_total{event="new"}`.
    pub new: u64,
    /// `lb_packets_dropped_total{reason="flows_full"}`.
    pub flows_full: u64,
    /// `lb_flow_events_total{event="unpinned"}`.
    pub unpinned: u64,
}

/// The sample `family{label="value"}` of `text`.
fn sample(text: &str, family: &str, label: &str, value: &str) -> Result<u64, Error> {
    api::metric(text, family, &[(label, value)])
        .map(|v| v as u64)
        .ok_or_else(|| Error::Unexpected(format!("no {family}{{{label}=\"{value}\"}} in /metrics")))
}

impl FlowCounters {
    /// The counters now.
    pub fn read(api: &Api) -> Result<FlowCounters, Error> {
        let text = api.metrics()?;
        Ok(FlowCounters {
            evicted: sample(&text, "lb_flow_events_total", "event", "evicted")?,
            new: sample(&text, "lb_flow_events_total", "event", "new")?,
            flows_full: sample(&text, "lb_packets_dropped_total", "reason", "flows_full")?,
            unpinned: sample(&text, "lb_flow_events_total", "event", "unpinned")?,
        })
    }

    /// The counters once they stopped moving (the agent reads the data plane's twice a
    /// second; traffic still in queues keeps them moving), within about 14 s.
    pub fn settled(api: &Api) -> Result<FlowCounters, Error> {
        let mut last = FlowCounters::read(api)?;
        for _ in 0..20 {
            thread::sleep(Duration::from_millis(700));
            let now = FlowCounters::read(api)?;
            if now == last {
                return Ok(now);
            }
            last = now;
        }
        Ok(last)
    }
}

/// `lb_flow_table_entries` once it is at least `want`, or its last value after `limit`
/// (the agent counts the tables every 5 s).
pub fn table_entries_at_least(api: &Api, want: u64, limit: Duration) -> Result<u64, Error> {
    let started = Instant::now();
    loop {
        let text = api.metrics()?;
        let n = api::metric(&text, "lb_flow_table_entries", &[])
            .ok_or_else(|| Error::Unexpected("no lb_flow_table_entries in /metrics".into()))?
            as u64;
        if n >= want || started.elapsed() > limit {
            return Ok(n);
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// Drops IPv4 packets from `cidr` on `eth0` of every backend, at the ingress hook
/// (before the IP stack: no reset, no SYN-ACK, no backlog). The rule goes with the
/// backend's namespace.
pub fn drop_on_backends(topo: &Topology, cidr: &str) -> Result<(), Error> {
    let rules = format!(
        "table netdev spoofed {{\n  chain ingress {{\n    type filter hook ingress device \
         \"{HOST_IF}\" priority -500; policy accept;\n    ip saddr {cidr} drop\n  }}\n}}\n"
    );
    for b in topo.backends() {
        let args = ["netns", "exec", b.ns.name(), "nft", "-f", "-"];
        cmd::run_with_input("ip", &args, Some(&rules))?;
    }
    Ok(())
}
