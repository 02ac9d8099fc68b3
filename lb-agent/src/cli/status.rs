//! `lb-agent status`: services and servers as a table (or JSON), read from the API.

use std::process::ExitCode;

use hyper::Method;
use lb_agent::view::ServiceStatus;

use super::http;

pub async fn status(api: &http::Target, json: bool) -> anyhow::Result<ExitCode> {
    let body = http::request_ok(api, Method::GET, "/api/v1/services", None).await?;
    if json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let services: Vec<ServiceStatus> = serde_json::from_str(&body)?;
    // An agent older than `/api/v1/agent` answers 404: its services are shown all the same.
    if let Ok(agent) = http::request_ok(api, Method::GET, "/api/v1/agent", None).await
        && let Ok(agent) = serde_json::from_str::<AgentView>(&agent)
    {
        println!(
            "agent {} (commit {}, bpf {}) on {} ({})",
            agent.build.version,
            agent.build.commit,
            agent.build.bpf,
            agent.interface,
            agent.xdp_mode
        );
        // An agent from before sized tables says nothing of them.
        if let Some(t) = agent.tables.filter(|t| t.max_flows > 0) {
            println!(
                "flow tables: {} live flows: LB_FLOWS {} buckets, LB_NAT {} buckets (4 ways \
                 each), LB_SOURCES {} entries; {:.1} MiB",
                t.max_flows,
                t.flow_buckets,
                t.nat_buckets,
                t.source_entries,
                t.memory_bytes as f64 / (1024.0 * 1024.0)
            );
        }
        if let Some(c) = &agent.cluster {
            print!("{}", render_cluster(c));
        }
    }
    print!("{}", render(&services));
    Ok(ExitCode::SUCCESS)
}

/// `GET /api/v1/agent`.
#[derive(serde::Deserialize)]
struct AgentView {
    build: lb_agent::build_info::BuildInfo,
    interface: String,
    xdp_mode: String,
    #[serde(default)]
    tables: Option<lb_agent::view::TablesStatus>,
    #[serde(default)]
    cluster: Option<lb_agent::cluster::ClusterStatus>,
}

/// The cluster lines: this node, then one line per peer.
fn render_cluster(c: &lb_agent::cluster::ClusterStatus) -> String {
    use std::fmt::Write;
    let r = &c.refused;
    let mut out = format!(
        "cluster node {} ({} of {})  resync {}  connections {}  refused: wrong key {}, \
         foreign node {}, fingerprint {}, version {}, malformed {}, replayed {}; stray \
         datagrams {}\n",
        c.node,
        c.index + 1,
        c.members,
        if c.resync_complete {
            "complete"
        } else {
            "waiting"
        },
        c.connections,
        r.wrong_key,
        r.foreign_node,
        r.fingerprint,
        r.version,
        r.malformed,
        r.replayed,
        c.stray_datagrams
    );
    for p in &c.peers {
        let _ = writeln!(
            out,
            "  peer {} {}  {}{}  sent {}  resent {}  received {}  lag {} records / {} ms",
            p.name,
            p.address,
            p.state.as_str(),
            if p.receiving { ", receiving" } else { "" },
            p.sent,
            p.resent,
            p.received,
            p.lag_records,
            p.lag_ms
        );
    }
    for m in &c.next_hop_moves {
        let _ = writeln!(out, "  next hop moved {} -> {}", m.old, m.new);
    }
    out
}

/// The narrowest the address column gets (an `IPv4:port` fits in 21).
const MIN_ADDRESS_WIDTH: usize = 21;

/// The human table.
pub fn render(services: &[ServiceStatus]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for s in services {
        let _ = writeln!(
            out,
            "service {} {} {}/{}  weight {}/{}  spares running {}  backup level {}  table {}{}",
            s.name,
            s.vip,
            s.protocol,
            s.forwarding,
            s.active_weight,
            s.main_weight,
            s.spare_num,
            s.active_backup_level,
            if s.table_fingerprint.is_empty() {
                "-"
            } else {
                &s.table_fingerprint
            },
            match (s.fail_open, s.fail_open_tier) {
                (false, _) => String::new(),
                (true, 0) => "  FAIL-OPEN".to_string(),
                (true, tier) => format!("  FAIL-OPEN (tier {tier})"),
            }
        );
        if s.local_faults.active {
            let _ = writeln!(
                out,
                "  LOCAL FAULT: probes cannot run on this host, verdicts kept ({} so far; last: {})",
                s.local_faults.total,
                s.local_faults.last_detail.as_deref().unwrap_or("-")
            );
        }
        // Wide enough for the longest address (`[IPv6]:port` is up to 47 characters).
        let w = s
            .servers
            .iter()
            .map(|srv| srv.address.chars().count())
            .max()
            .unwrap_or(0)
            .max(MIN_ADDRESS_WIDTH);
        let _ = writeln!(
            out,
            "  {:<w$} {:>6} {:<12} {:<8} {:>6} {:>6} {:>10} {:>8} {:>6}  note",
            "server", "weight", "state", "spare", "backup", "active", "packets", "flows", "open"
        );
        for srv in &s.servers {
            let mut notes = srv.differs_from_config.clone();
            if srv.mac.is_none() {
                notes.push("MAC unknown".into());
            }
            let _ = writeln!(
                out,
                "  {:<w$} {:>6} {:<12} {:<8} {:>6} {:>6} {:>10} {:>8} {:>6}  {}",
                srv.address,
                srv.weight,
                srv.state,
                srv.spare.as_deref().unwrap_or("-"),
                srv.backup,
                if srv.active { "yes" } else { "no" },
                srv.stats.packets,
                srv.stats.flows,
                srv.active_flows
                    .map_or_else(|| "-".to_string(), |n| n.to_string()),
                notes.join(", ")
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use lb_agent::view::LocalFaultStatus;

    use super::*;

    #[test]
    fn columns_line_up_with_ipv6_addresses() {
        let srv = |a: &str| {
            std::sync::Arc::new(lb_agent::view::ServerStatus {
                address: a.into(),
                state: "up".into(),
                ..Default::default()
            })
        };
        let s = ServiceStatus {
            name: "web6".into(),
            servers: vec![
                srv("[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:65535"),
                srv("10.0.1.1:80"),
            ],
            ..Default::default()
        };
        let out = render(&[s]);
        let rows: Vec<&str> = out.lines().skip(1).collect();
        assert_eq!(rows.len(), 3, "{out}");
        // Every column starts at the same offset on the header and both rows.
        let weight_end = |l: &str| l.find(" up ").or_else(|| l.find(" state")).unwrap();
        assert_eq!(weight_end(rows[1]), weight_end(rows[2]), "{out}");
        assert_eq!(weight_end(rows[0]), weight_end(rows[1]), "{out}");
        assert!(rows[1].starts_with("  [2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:65535 "));
        // `open`: the server's active flows as last counted, `-` before the first count.
        assert!(rows[0].contains("   open  note"), "{out}");
        assert!(rows[1].ends_with("      -  MAC unknown"), "{out}");
    }

    #[test]
    fn open_shows_the_active_flows() {
        let s = ServiceStatus {
            name: "web".into(),
            servers: vec![std::sync::Arc::new(lb_agent::view::ServerStatus {
                address: "10.0.1.1:80".into(),
                state: "draining".into(),
                active_flows: Some(12345),
                mac: Some("02:00:00:00:00:01".into()),
                ..Default::default()
            })],
            ..Default::default()
        };
        let out = render(&[s]);
        assert!(out.lines().nth(2).unwrap().ends_with(" 12345  "), "{out}");
    }

    #[test]
    fn the_table_says_the_fail_open_tier_and_a_local_fault() {
        let s = ServiceStatus {
            name: "web".into(),
            fail_open: true,
            fail_open_tier: 1,
            local_faults: LocalFaultStatus {
                total: 7,
                active: true,
                last: None,
                last_detail: Some("local fault: out of file descriptors (EMFILE)".into()),
            },
            ..Default::default()
        };
        let out = render(&[s]);
        assert!(out.contains("FAIL-OPEN (tier 1)"), "{out}");
        assert!(
            out.contains("LOCAL FAULT: probes cannot run on this host, verdicts kept (7 so far"),
            "{out}"
        );
    }
}
