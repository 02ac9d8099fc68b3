//! Builds the operator's [`Snapshot`] from the agent's state and data-plane counters.

use std::{collections::BTreeMap, time::SystemTime};

use lb_common::counters;
use tokio::time::Instant;

use super::{Agent, Neighbors};
use crate::{
    dataplane::Dataplane,
    membership::SpareStatus,
    probe::Prober,
    publish::Role,
    status::{HealthStatus, ProbeStatus, ServerStatus, ServiceStatus, Snapshot, Stats},
};

pub(super) fn build<D: Dataplane, P: Prober, N: Neighbors>(agent: &Agent<D, P, N>) -> Snapshot {
    let now = Instant::now();
    let wall = SystemTime::now();
    let at = |i: Instant| {
        let ago = now.saturating_duration_since(i);
        humantime::format_rfc3339_millis(wall - ago).to_string()
    };
    let counters = agent
        .dp
        .counters()
        .map(|c| {
            counters::NAMES
                .iter()
                .zip(c)
                .map(|(n, v)| (n.to_string(), v))
                .collect()
        })
        .unwrap_or_default();

    let services = agent
        .services
        .iter()
        .map(|svc| {
            let outcome = svc.outcome.as_ref();
            // Roles follow the servers' order (membership keeps its input order); a map
            // is built only if they do not (an outcome older than the server set).
            let ordered_roles: &[(std::net::SocketAddr, Role)] =
                outcome.map_or(&[], |o| o.roles.as_slice());
            let aligned = ordered_roles.len() == svc.servers.len()
                && ordered_roles
                    .iter()
                    .zip(svc.servers.values())
                    .all(|((addr, _), s)| *addr == s.addr);
            let roles: std::collections::HashMap<_, _> = if aligned {
                std::collections::HashMap::new()
            } else {
                ordered_roles.iter().copied().collect()
            };
            let spares: std::collections::HashMap<_, _> = outcome
                .map(|o| o.spares.iter().copied().collect())
                .unwrap_or_default();
            let sid = agent.publisher.service_id(&svc.cfg.name);
            let stats = sid
                .and_then(|id| agent.dp.service_stats(id).ok())
                .map(|s| Stats {
                    packets: s.packets,
                    bytes: s.bytes,
                    flows: s.new_flows,
                })
                .unwrap_or_default();
            // Slots come with the servers in one ordered pass (no lookup per server).
            let published = agent.publisher.backends_in_order(&svc.cfg.name);
            let servers = super::ordered_join::join(svc.servers.iter(), published)
                .enumerate()
                .map(|(i, (s, backend))| {
                    // As read by the last `poll_stats` (no syscall per server here).
                    let bstats = s.last_stats;
                    let mac = agent.macs.get(&s.addr.ip()).map(mac_text);
                    let role = if aligned {
                        Some(ordered_roles[i].1)
                    } else {
                        roles.get(&s.addr).copied()
                    };
                    let probes: BTreeMap<String, ProbeStatus> = s
                        .health
                        .probes()
                        .map(|(name, p)| {
                            (
                                name.to_string(),
                                ProbeStatus {
                                    count: p.count,
                                    fails: u64::from(p.fails),
                                    failures: p.failures,
                                    last: p.last.map(at),
                                    last_result: match p.last_result {
                                        None => "none".into(),
                                        Some(true) => "passed".into(),
                                        Some(false) => format!("failed: {}", p.last_detail),
                                    },
                                    last_duration_ms: p
                                        .last_duration
                                        .map_or(0.0, |d| d.as_secs_f64() * 1000.0),
                                    local_faults: p.local_faults,
                                },
                            )
                        })
                        .collect();
                    ServerStatus {
                        address: s.addr_text.clone(),
                        weight: s.weight,
                        state: s.state_name().to_string(),
                        spare: if s.spare && s.backup == 0 {
                            Some(
                                match spares.get(&s.addr) {
                                    Some(SpareStatus::Running) => "running",
                                    _ => "idle",
                                }
                                .to_string(),
                            )
                        } else {
                            None
                        },
                        backup: s.backup,
                        active: role == Some(Role::Active) && mac.is_some(),
                        slots: backend.map_or(0, |(_, slots)| slots),
                        mac,
                        health: HealthStatus {
                            fails: s.health.fails(),
                            downtime: s.health.downtime(now).as_millis() as u64,
                            downstart: s.health.downstart().map(at),
                            probes,
                        },
                        stats: Stats {
                            packets: bstats.packets,
                            bytes: bstats.bytes,
                            flows: bstats.new_flows,
                        },
                        differs_from_config: s.differs_from_config(),
                    }
                })
                .collect();
            ServiceStatus {
                name: svc.cfg.name.clone(),
                vip: svc.cfg.vip.to_string(),
                protocol: svc.cfg.protocol.as_str().to_string(),
                forwarding: svc.cfg.forwarding.as_str().to_string(),
                main_weight: outcome.map_or(0, |o| o.main_weight),
                active_weight: outcome.map_or(0, |o| o.active_weight),
                spare_num: outcome.map_or(0, |o| o.spare_num),
                active_backup_level: outcome.map_or(0, |o| o.active_backup_level),
                fail_open: outcome.is_some_and(|o| o.fail_open),
                passive_signals: crate::config::passive_coverage(
                    svc.cfg.protocol,
                    svc.cfg.forwarding,
                )
                .signals()
                .iter()
                .map(|s| s.to_string())
                .collect(),
                fail_open_tier: outcome.map_or(0, |o| o.fail_open_tier),
                local_faults: svc.local_faults.status(now, at),
                table_fingerprint: table_fingerprint(agent, &svc.cfg.name),
                maglev_size: agent
                    .publisher
                    .live_table(&svc.cfg.name)
                    .map_or(0, |(t, _)| t.len() as u32),
                stats,
                servers,
            }
        })
        .collect();

    Snapshot {
        interface: agent.env.interface.clone(),
        xdp_mode: agent.env.xdp_mode.clone(),
        services,
        counters,
        propagation: agent.propagation.clone(),
        transitions: agent.transitions,
        passive_events: agent.passive.clone(),
        local_faults: agent.local_faults.status(now, at),
        publish: agent.publish_retry.status(now),
        announce: {
            let mut a = agent.announcer.status();
            a.quiet_seconds = agent
                .traffic_moved
                .map(|t| now.saturating_duration_since(t).as_secs_f64());
            a
        },
    }
}

/// The service's live-table fingerprint, recomputed only when the table changed.
fn table_fingerprint<D: Dataplane, P: Prober, N: Neighbors>(
    agent: &Agent<D, P, N>,
    service: &str,
) -> String {
    let Some((table, version)) = agent.publisher.live_table(service) else {
        return String::new();
    };
    let mut cache = agent.fingerprints.borrow_mut();
    if let Some((v, fp)) = cache.get(service)
        && *v == version
    {
        return fp.clone();
    }
    let fp =
        crate::announce::fingerprint::fingerprint(table, |id| agent.publisher.backend_addr(id));
    cache.insert(service.to_string(), (version, fp.clone()));
    fp
}

/// `aa:bb:cc:dd:ee:ff`, written without the formatting machinery (once per server per
/// build).
fn mac_text(m: &[u8; 6]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(17);
    for (i, b) in m.iter().enumerate() {
        if i > 0 {
            text.push(':');
        }
        text.push(char::from(HEX[usize::from(b >> 4)]));
        text.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn mac_text_is_lower_case_hex_pairs() {
        let m = [0x02, 0x00, 0xab, 0xcd, 0xef, 0x9f];
        assert_eq!(super::mac_text(&m), "02:00:ab:cd:ef:9f");
        assert_eq!(
            super::mac_text(&m),
            format!(
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            )
        );
    }
}
