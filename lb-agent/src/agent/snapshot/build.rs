//! Builds the operator's [`Snapshot`] from the agent's state and data-plane counters,
//! incrementally: each server's status record is kept between builds and rebuilt only
//! when what it is made of changed (docs/internals/snapshot.md, *Built incrementally*).

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, SystemTime},
};

use lb_common::counters;
use tokio::time::Instant;

use super::super::{
    Environment, ServiceRt, announcing::Announcement, faults::Faults, publishing::Publishing,
    server::Configured, server::ServerRt, server_table::ServerTable,
};
use crate::{
    dataplane::Dataplane,
    health::ProbeStats,
    membership::{Admin, SpareStatus},
    publish::Role,
    view::{HealthStatus, ProbeStatus, ServerStatus, ServiceStatus, Snapshot, Stats},
};

/// The server records kept between builds, and the clock reading their timestamps were
/// written with.
#[derive(Default)]
pub(super) struct Records {
    anchor: Option<WallAnchor>,
    /// By service name: one entry per server, in address order (as `ServiceRt::servers`).
    services: HashMap<String, Vec<Entry>>,
    /// Records the last build made anew (the others were reused).
    pub rebuilt: usize,
}

/// One server's record and what it was made of.
struct Entry {
    addr: SocketAddr,
    /// `None`: never built (a server new since the last build).
    inputs: Option<Inputs>,
    record: Arc<ServerStatus>,
}

/// Everything a server's record is made of: equal inputs make an equal record, so a
/// record whose inputs did not change since it was built is reused as it is.
#[derive(PartialEq)]
struct Inputs {
    scalar: Scalar,
    probes: Vec<(String, ProbeStats)>,
}

/// The inputs held in place (no allocation to compare them).
#[derive(Clone, Copy, PartialEq)]
struct Scalar {
    weight: u32,
    spare: bool,
    backup: u32,
    configured: Option<Configured>,
    admin: Admin,
    state: &'static str,
    /// `idle` or `running` when it shows, see [`ServerStatus::spare`].
    spare_status: Option<&'static str>,
    active: bool,
    slots: u32,
    mac: Option<[u8; 6]>,
    fails: u64,
    /// Milliseconds, as shown (grows while the server is not usable).
    downtime_ms: u64,
    downstart: Option<Instant>,
    stats: Stats,
    active_flows: Option<u64>,
}

impl Inputs {
    /// Whether `s` with `scalar` still makes the record these inputs made.
    fn same(&self, scalar: &Scalar, s: &ServerRt) -> bool {
        if self.scalar != *scalar {
            return false;
        }
        let mut kept = self.probes.iter();
        s.health
            .probes()
            .all(|(name, p)| kept.next().is_some_and(|(n, k)| n == name && k == p))
            && kept.next().is_none()
    }

    /// Becomes the inputs of `s` with `scalar` again, reusing its vector and strings (a
    /// record is rebuilt at every build under steady probing: no allocation here then).
    fn refresh(&mut self, scalar: Scalar, s: &ServerRt) {
        self.scalar = scalar;
        let mut n = 0;
        for (name, p) in s.health.probes() {
            match self.probes.get_mut(n) {
                Some((kept_name, kept)) => {
                    if kept_name != name {
                        name.clone_into(kept_name);
                    }
                    copy_stats(kept, p);
                }
                None => self.probes.push((name.to_string(), p.clone())),
            }
            n += 1;
        }
        self.probes.truncate(n);
    }

    fn of(scalar: Scalar, s: &ServerRt) -> Self {
        Inputs {
            scalar,
            probes: s
                .health
                .probes()
                .map(|(n, p)| (n.to_string(), p.clone()))
                .collect(),
        }
    }
}

/// `*dst = src.clone()` keeping `dst`'s detail buffer (every field named, so a new field
/// cannot be left out).
fn copy_stats(dst: &mut ProbeStats, src: &ProbeStats) {
    let ProbeStats {
        count,
        fails,
        failures,
        passes,
        last,
        last_result,
        last_detail,
        last_duration,
        local_faults,
    } = src;
    dst.count = *count;
    dst.fails = *fails;
    dst.failures = *failures;
    dst.passes = *passes;
    dst.last = *last;
    dst.last_result = *last_result;
    dst.last_detail.clone_from(last_detail);
    dst.last_duration = *last_duration;
    dst.local_faults = *local_faults;
}

/// Wall-clock time of one monotonic instant: every timestamp is written from it, so a
/// record kept from an earlier build shows what a build now would. Taken again (and every
/// record rebuilt) when the wall clock moved against the monotonic one by more than
/// [`ANCHOR_DRIFT`] (a clock step, or slewing adding up).
#[derive(Clone, Copy)]
struct WallAnchor {
    wall: SystemTime,
    at: Instant,
    /// The real monotonic clock when `wall` was read (the agent's `Instant` may be a
    /// test's paused one: drift is measured on the real clocks).
    real: std::time::Instant,
}

const ANCHOR_DRIFT: Duration = Duration::from_millis(100);

impl WallAnchor {
    fn now() -> Self {
        WallAnchor {
            wall: SystemTime::now(),
            at: Instant::now(),
            real: std::time::Instant::now(),
        }
    }

    fn drifted(&self) -> bool {
        let Ok(wall) = SystemTime::now().duration_since(self.wall) else {
            return true;
        };
        let real = self.real.elapsed();
        wall.abs_diff(real) > ANCHOR_DRIFT
    }

    /// RFC 3339 with milliseconds.
    fn format(&self, i: Instant) -> String {
        let wall = if i >= self.at {
            self.wall + (i - self.at)
        } else {
            self.wall - (self.at - i)
        };
        humantime::format_rfc3339_millis(wall).to_string()
    }
}

/// What a snapshot is made of: the rest of the agent, read-only.
pub(in crate::agent) struct Sources<'a, D> {
    pub dp: &'a D,
    pub env: &'a Environment,
    pub services: &'a [ServiceRt],
    pub publishing: &'a Publishing,
    pub macs: &'a HashMap<IpAddr, [u8; 6]>,
    pub transitions: u64,
    pub faults: &'a Faults,
    pub announcement: &'a Announcement,
    pub cluster: Option<&'a crate::agent::ClusterNode>,
}

/// Builds the snapshot, reusing every server record in `records` whose inputs did not
/// change.
pub(super) fn build<D: Dataplane>(
    sources: &Sources<'_, D>,
    records: &mut Records,
    fingerprints: &mut Fingerprints,
) -> Snapshot {
    if records.anchor.is_none_or(|a| a.drifted()) {
        records.anchor = Some(WallAnchor::now());
        records.services.clear();
    }
    build_with(sources, records, fingerprints)
}

/// Builds the snapshot with every record made anew (what [`build`] must equal), with
/// the timestamps of the last [`build`]; leaves the kept records alone.
pub(super) fn build_from_scratch<D: Dataplane>(
    sources: &Sources<'_, D>,
    records: &Records,
    fingerprints: &mut Fingerprints,
) -> Snapshot {
    let mut fresh = Records {
        anchor: Some(records.anchor.unwrap_or_else(WallAnchor::now)),
        ..Records::default()
    };
    build_with(sources, &mut fresh, fingerprints)
}

fn build_with<D: Dataplane>(
    sources: &Sources<'_, D>,
    records: &mut Records,
    fingerprints: &mut Fingerprints,
) -> Snapshot {
    let now = Instant::now();
    let anchor = records.anchor.expect("the caller set the anchor");
    let at = |i: Instant| anchor.format(i);
    records.rebuilt = 0;
    records
        .services
        .retain(|name, _| sources.services.iter().any(|s| s.cfg.name == *name));
    let counters = sources
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

    let census = sources.dp.table_census();
    let mut rebuilt = 0;
    let services = sources
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
            let roles: HashMap<_, _> = if aligned {
                HashMap::new()
            } else {
                ordered_roles.iter().copied().collect()
            };
            let spares: HashMap<_, _> = outcome
                .map(|o| o.spares.iter().copied().collect())
                .unwrap_or_default();
            let publisher = sources.publishing.publisher();
            let sid = publisher.service_id(&svc.cfg.name);
            let stats = sid
                .and_then(|id| sources.dp.service_stats(id).ok())
                .map(|s| Stats {
                    packets: s.packets,
                    bytes: s.bytes,
                    flows: s.new_flows,
                })
                .unwrap_or_default();
            let entries = records.services.entry(svc.cfg.name.clone()).or_default();
            align(entries, &svc.servers);
            // Slots come with the servers in one ordered pass (no lookup per server).
            let published = publisher.backends_in_order(&svc.cfg.name);
            let servers = crate::util::ordered_join::join(svc.servers.iter(), published)
                .zip(entries.iter_mut())
                .enumerate()
                .map(|(i, ((s, backend), entry))| {
                    // As read by the last `poll_stats` (no syscall per server here).
                    let bstats = s.last_stats;
                    let mac = sources.macs.get(&s.addr.ip()).copied();
                    let role = if aligned {
                        Some(ordered_roles[i].1)
                    } else {
                        roles.get(&s.addr).copied()
                    };
                    let scalar = Scalar {
                        weight: s.weight,
                        spare: s.spare,
                        backup: s.backup,
                        configured: s.configured,
                        admin: s.admin,
                        state: s.state_name(),
                        spare_status: (s.spare && s.backup == 0).then(|| {
                            match spares.get(&s.addr) {
                                Some(SpareStatus::Running) => "running",
                                _ => "idle",
                            }
                        }),
                        active: role == Some(Role::Active) && mac.is_some(),
                        slots: backend.map_or(0, |(_, slots)| slots),
                        mac,
                        fails: s.health.fails(),
                        downtime_ms: s.health.downtime(now).as_millis() as u64,
                        downstart: s.health.downstart(),
                        stats: Stats {
                            packets: bstats.packets,
                            bytes: bstats.bytes,
                            flows: bstats.new_flows,
                        },
                        active_flows: census.as_ref().map(|c| {
                            let by = match svc.cfg.forwarding {
                                crate::config::Forwarding::Nat => &c.nat_by_backend,
                                // dsr and the tunnels see the client's side only.
                                crate::config::Forwarding::Dsr
                                | crate::config::Forwarding::Ipip
                                | crate::config::Forwarding::Gue => &c.flows_by_backend,
                            };
                            backend.map_or(0, |(id, _)| by.get(&id).copied().unwrap_or(0))
                        }),
                    };
                    if !entry.inputs.as_ref().is_some_and(|k| k.same(&scalar, s)) {
                        entry.record = Arc::new(record(&scalar, s, &at));
                        match &mut entry.inputs {
                            Some(kept) => kept.refresh(scalar, s),
                            None => entry.inputs = Some(Inputs::of(scalar, s)),
                        }
                        rebuilt += 1;
                    }
                    entry.record.clone()
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
                table_fingerprint: table_fingerprint(publisher, fingerprints, &svc.cfg.name),
                maglev_size: publisher
                    .live_table(&svc.cfg.name)
                    .map_or(0, |(t, _)| t.len() as u32),
                stats,
                probe_durations: svc.probe_durations.status(),
                servers,
            }
        })
        .collect();
    records.rebuilt = rebuilt;

    Snapshot {
        build: crate::build_info::current(),
        interface: sources.env.interface.clone(),
        xdp_mode: sources.env.xdp_mode.clone(),
        tables: sources.env.tables.clone(),
        services,
        counters,
        propagation: sources.publishing.propagation().clone(),
        transitions: sources.transitions,
        passive_events: sources.faults.passive_events().clone(),
        local_faults: sources.faults.local_status(now, at),
        publish: sources.publishing.retry().status(now),
        occupancy: census.map(|c| crate::view::TablesOccupancy {
            flow_entries: c.flow_entries,
            flow_capacity: c.flow_capacity,
            nat_entries: c.nat_entries,
            nat_capacity: c.nat_capacity,
            scan_seconds: c.scan.as_secs_f64(),
            age_seconds: c.taken.elapsed().as_secs_f64(),
        }),
        announce: sources.announcement.status(now),
        cluster: sources.cluster.map(crate::agent::ClusterNode::status),
    }
}

/// Puts `entries` in step with `servers` (same addresses, same order), keeping the
/// entries of servers still there; a pass of address comparisons when nothing changed.
fn align(entries: &mut Vec<Entry>, servers: &ServerTable) {
    if entries.len() == servers.len()
        && entries
            .iter()
            .zip(servers.keys())
            .all(|(e, a)| e.addr == *a)
    {
        return;
    }
    let mut old = std::mem::take(entries).into_iter().peekable();
    for addr in servers.keys() {
        while old.next_if(|e| e.addr < *addr).is_some() {}
        entries.push(old.next_if(|e| e.addr == *addr).unwrap_or_else(|| Entry {
            addr: *addr,
            inputs: None,
            record: Arc::default(),
        }));
    }
}

/// A server's record, made of `scalar` and the server's probes and settings (every one
/// of them in [`Inputs`]).
fn record(scalar: &Scalar, s: &ServerRt, at: &impl Fn(Instant) -> String) -> ServerStatus {
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
                    last_duration_ms: p.last_duration.map_or(0.0, |d| d.as_secs_f64() * 1000.0),
                    local_faults: p.local_faults,
                },
            )
        })
        .collect();
    ServerStatus {
        address: s.addr_text.clone(),
        weight: scalar.weight,
        state: scalar.state.to_string(),
        spare: scalar.spare_status.map(str::to_string),
        backup: scalar.backup,
        active: scalar.active,
        slots: scalar.slots,
        mac: scalar.mac.as_ref().map(mac_text),
        health: HealthStatus {
            fails: scalar.fails,
            downtime: scalar.downtime_ms,
            downstart: scalar.downstart.map(at),
            probes,
        },
        stats: scalar.stats,
        active_flows: scalar.active_flows,
        // Made of `configured`, `weight`, `spare` and `admin` (in `Scalar`).
        differs_from_config: s.differs_from_config(),
    }
}

/// Table fingerprints by service, with the table version they were computed for.
pub(super) type Fingerprints = HashMap<String, (u64, String)>;

/// The service's live-table fingerprint, recomputed only when the table changed.
fn table_fingerprint(
    publisher: &crate::publish::Publisher,
    cache: &mut Fingerprints,
    service: &str,
) -> String {
    let Some((table, version)) = publisher.live_table(service) else {
        return String::new();
    };
    if let Some((v, fp)) = cache.get(service)
        && *v == version
    {
        return fp.clone();
    }
    let fp = crate::announce::fingerprint::fingerprint(table, |id| publisher.backend_addr(id));
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
