//! The text `lb-agent check-config` prints for a valid config: each service with its
//! probes' TR7 bounds, its passive checks and its combined bound, then every warning
//! (docs/check-config.md). Facts about the host are passed in ([`HostFacts`]) so that the
//! same config always gives the same text (the golden tests in `examples/` rely on it).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::path::Path;

use super::bounds::{Bounds, detection_bounds};
use super::failures::{Failure, blind_because, seen_within};
use super::passive::{PassiveCoverage, passive_coverage};
use super::values::human;
use super::warnings::warnings;
use super::{
    BackupLevel, BackupSwitch, Config, ProbeConfig, ProbeKind, ProbeMode, ServiceConfig, TcpCheck,
};

/// What `check-config` needs to know about the host it runs on.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// This host's addresses; `Err` says why they could not be listed.
    pub local_addresses: Option<Result<BTreeSet<IpAddr>, String>>,
    /// The kernel's ephemeral port range (`net.ipv4.ip_local_port_range`), if readable.
    pub ephemeral_ports: Option<RangeInclusive<u16>>,
    /// Whether a raw TCP socket opens here (the SYN check of tcp probes); `Err` says why
    /// not; `None`: not asked.
    pub raw_tcp_socket: Option<Result<(), String>>,
    /// This host's physical memory in bytes, if known (the default `agent.max_flows`).
    pub memory: Option<u64>,
}

/// The lines `check-config` prints for `cfg`, loaded from `path`.
pub fn render(cfg: &Config, path: &Path, host: &HostFacts) -> Vec<String> {
    let mut out = vec![format!(
        "{}: valid, {}",
        path.display(),
        count(cfg.services.len(), "service", "services")
    )];
    for svc in &cfg.services {
        service_lines(svc, &mut out);
    }
    out.extend(capacity_line(cfg));
    out.push(tables_line(cfg, host));
    out.extend(announce_line(cfg));
    out.extend(tcp_check_line(cfg, host));
    if let Some(warning) = super::non_loopback_api(&cfg.agent) {
        out.push(format!("warning: {warning}"));
    }
    match &host.local_addresses {
        Some(Ok(local)) => {
            if let Err(why) = crate::host::snat_ips_refusal(cfg, local) {
                out.push(format!(
                    "warning: {why} (lb-agent run refuses this config on this host)"
                ));
            }
        }
        Some(Err(why)) => out.push(format!(
            "warning: listing this host's addresses: {why} (snat_ip not checked)"
        )),
        None => {}
    }
    out.extend(warnings(cfg).into_iter().map(|w| format!("warning: {w}")));
    if let Some(range) = &host.ephemeral_ports {
        out.extend(
            crate::host::snat_port_overlaps(cfg, range)
                .into_iter()
                .map(|w| format!("warning: {w}")),
        );
    }
    out
}

/// Which check the plain tcp probes (no `send`/`expect`/`test`) use: the SYN check or a
/// connect (docs/probes.md, "SYN check").
fn tcp_check_line(cfg: &Config, host: &HostFacts) -> Option<String> {
    let plain: Vec<&ProbeConfig> = cfg
        .services
        .iter()
        .flat_map(|s| &s.probes)
        .filter(|p| p.kind == ProbeKind::Tcp && crate::probe::syn::plain(p))
        .collect();
    let names = |check: TcpCheck| {
        let mut n: Vec<String> = plain
            .iter()
            .filter(|p| p.tcp_check == check)
            .map(|p| format!("{:?}", p.name))
            .collect();
        n.dedup();
        (!n.is_empty()).then(|| n.join(", "))
    };
    let mut parts = Vec::new();
    if let Some(n) = names(TcpCheck::Auto) {
        parts.push(match &host.raw_tcp_socket {
            Some(Ok(())) => format!("{n}: SYN check (this host opens raw sockets)"),
            Some(Err(why)) => format!("{n}: connect (no SYN check here: {why})"),
            None => format!("{n}: SYN check with CAP_NET_RAW, else connect"),
        });
    }
    if let Some(n) = names(TcpCheck::Syn) {
        parts.push(match &host.raw_tcp_socket {
            Some(Err(why)) => format!(
                "{n}: SYN check (tcp_check = \"syn\"), which cannot run here ({why}): no verdicts"
            ),
            _ => format!("{n}: SYN check (tcp_check = \"syn\")"),
        });
    }
    if let Some(n) = names(TcpCheck::Connect) {
        parts.push(format!("{n}: connect (tcp_check = \"connect\")"));
    }
    (!parts.is_empty()).then(|| format!("tcp probes without data: {}", parts.join("; ")))
}

fn service_lines(svc: &ServiceConfig, out: &mut Vec<String>) {
    let spares = svc.servers.iter().filter(|s| s.spare).count();
    let srv = svc.servers.iter().filter(|s| s.service.is_some()).count();
    let backups = svc
        .servers
        .iter()
        .filter(|s| s.service.is_none() && s.backup != BackupLevel::Level(0))
        .count();
    let mut roles = Vec::new();
    if spares > 0 {
        roles.push(format!("{spares} spare"));
    }
    if backups > 0 {
        roles.push(format!("{backups} backup"));
    }
    if srv > 0 {
        roles.push(format!(
            "{} with levels from priorities",
            count(srv, "SRV name", "SRV names")
        ));
    }
    let roles = if roles.is_empty() {
        String::new()
    } else {
        format!(" ({})", roles.join(", "))
    };
    out.push(format!(
        "service {:?}: {} {}, forwarding {}: {}{roles}, {}",
        svc.name,
        svc.protocol,
        svc.vip,
        svc.forwarding,
        count(svc.servers.len(), "server", "servers"),
        count(svc.probes.len(), "probe", "probes"),
    ));
    let passive = svc.max_fails > 0 && passive_coverage(svc.protocol, svc.forwarding).any();
    for probe in &svc.probes {
        out.push(format!("  {}", probe_line(probe, passive)));
    }
    out.push(format!("  {}", passive_line(svc)));
    out.push(format!("  {}", service_bound_line(svc)));
    out.extend(spare_line(svc).map(|l| format!("  {l}")));
    out.extend(backup_line(svc).map(|l| format!("  {l}")));
    out.extend(cap_line(svc).map(|l| format!("  {l}")));
    out.push(format!("  {}", maglev_line(svc)));
}

/// With spares and probes: a spare takes traffic only once every probe has passed.
fn spare_line(svc: &ServiceConfig) -> Option<String> {
    let spares = svc.servers.iter().filter(|s| s.spare).count();
    if spares == 0 || svc.probes.is_empty() {
        return None;
    }
    Some(format!(
        "spares: {} only after every probe has passed ({}), also at start",
        if spares == 1 {
            "the spare may run"
        } else {
            "a spare may run"
        },
        if svc.probes.iter().all(|p| p.essential) {
            "all are essential"
        } else {
            "essential or not"
        }
    ))
}

/// The removal cap's groups among the configured servers (membership rule 2): per
/// level, the servers that carry its traffic (spares left out); servers from SRV names
/// are not counted (their levels come from the records).
pub(super) fn cap_groups(svc: &ServiceConfig) -> BTreeMap<u32, usize> {
    let mut groups = BTreeMap::new();
    for s in svc
        .servers
        .iter()
        .filter(|s| s.service.is_none() && !s.spare)
    {
        let BackupLevel::Level(level) = s.backup else {
            continue;
        };
        *groups.entry(level).or_default() += 1;
    }
    groups
}

/// With backup levels: when the primary group takes the traffic back (`backup_switch`),
/// and that a start or a reload switches no level before the probes have run
/// (membership rule 4).
fn backup_line(svc: &ServiceConfig) -> Option<String> {
    let levels = svc
        .servers
        .iter()
        .any(|s| s.service.is_some() || s.backup != BackupLevel::Level(0));
    if !levels {
        return None;
    }
    let switch = match svc.backup_switch {
        BackupSwitch::TryPrimaryEachFlow => {
            "the primary group takes new flows again as soon as one of its servers is healthy"
                .to_string()
        }
        BackupSwitch::RetryAfter(d) => format!(
            "a backup level keeps the traffic while it is usable; the primary group is tried \
             again every {}",
            human(d)
        ),
        BackupSwitch::Permanent => {
            "a backup level keeps the traffic until it fails, also after the primary group \
             recovers"
                .to_string()
        }
    };
    let gated = svc.probes.iter().any(|p| p.essential);
    Some(format!(
        "backup levels: {switch}{}",
        if gated {
            "; at a start, or a reload that checks servers again, no level is left before \
             its probes reach a verdict"
        } else {
            ""
        }
    ))
}

/// With a removal cap (`max_unhealthy_percent` below 100): what it removes at most, per
/// group of configured servers, and Azure's all-unhealthy rule with what a backup level
/// or a spare changes about it.
fn cap_line(svc: &ServiceConfig) -> Option<String> {
    let pct = svc.max_unhealthy_percent.min(100);
    if pct >= 100 {
        return None;
    }
    if pct == 0 {
        return Some("removal cap: 0%: health never removes a server".to_string());
    }
    let spares = svc.servers.iter().any(|s| s.spare);
    let parts: Vec<String> = cap_groups(svc)
        .iter()
        .map(|(&level, &n)| {
            let removable = n * usize::from(pct) / 100;
            match level {
                0 if spares => {
                    format!("primary group: {removable} of {n}, one more per running spare")
                }
                0 => format!("primary group: {removable} of {n}"),
                l => format!("backup level {l}: {removable} of {n}"),
            }
        })
        .collect();
    let srv = svc.servers.iter().any(|s| s.service.is_some());
    let levels = srv
        || svc
            .servers
            .iter()
            .any(|s| s.backup != BackupLevel::Level(0));
    let instead = if spares { " and no spare runs" } else { "" };
    let all_unhealthy = if levels {
        let with_none = if svc.fail_open {
            "they stay in traffic (fail-open)"
        } else {
            "those of the active level stay in traffic"
        };
        format!(
            "a group whose servers are all unhealthy{instead} has none removed (Azure), yet \
             takes no new flow while another level has a healthy server (that level takes over); \
             with none, {with_none}"
        )
    } else {
        format!(
            "a group whose servers are all unhealthy{instead} keeps them all in traffic (Azure)"
        )
    };
    Some(format!(
        "removal cap: health removes at most {pct}% of a group at once ({}); {all_unhealthy}",
        if parts.is_empty() {
            "servers from SRV names counted as they resolve".to_string()
        } else {
            parts.join("; ")
        }
    ))
}

/// `maglev table 4099 slots (chosen for 3 servers: at least 100 per server)`.
fn maglev_line(svc: &ServiceConfig) -> String {
    if let Some(size) = svc.maglev_size {
        return format!("maglev table {size} slots (maglev_size)");
    }
    let servers = u32::try_from(svc.servers.len()).unwrap_or(u32::MAX);
    let names = if svc.servers.iter().any(|s| s.resolve) {
        "; re-chosen as names resolve to more or fewer"
    } else {
        ""
    };
    format!(
        "maglev table {} slots (chosen for {}: at least {} per server{names})",
        lb_common::maglev_size_for(servers),
        count(svc.servers.len(), "server", "servers"),
        lb_common::MAGLEV_SLOTS_PER_BACKEND
    )
}

/// `probe "health" (http every 2s, timeout 1s, fails 2, passes 2): ...`; `passive`: the
/// service's passive checks count something.
fn probe_line(p: &ProbeConfig, passive: bool) -> String {
    let b = detection_bounds(p);
    let mut head = format!(
        "probe {:?} ({} every {}, timeout {}, fails {}, passes {}",
        p.name,
        p.kind,
        human(p.interval),
        human(p.timeout),
        p.fails,
        p.passes
    );
    if !p.jitter.is_zero() {
        let _ = write!(head, ", jitter {}", human(p.jitter));
    }
    if let Some(t) = p.tunnel {
        let _ = write!(
            head,
            ", through the {} tunnel to {}",
            if t.gue { "gue" } else { "ipip" },
            t.vip
        );
    }
    if p.essential {
        head.push_str(if p.persistent {
            ", essential, persistent"
        } else {
            ", essential"
        });
    }
    head.push_str(match p.mode {
        ProbeMode::Always => ")",
        ProbeMode::Idle => ", mode idle)",
        ProbeMode::Onfail => ", mode onfail)",
    });
    let recovery = format!("a failed server returns {}", recovery(&b));
    match p.mode {
        ProbeMode::Always => format!("{head}: {}; {recovery}", detection(p, &b)),
        ProbeMode::Idle => format!(
            "{head}: runs only while the server had no client traffic for {} or is out; then {}; \
             under traffic {}; {recovery}",
            human(p.interval),
            detection(p, &b),
            if passive {
                "only passive checks notice a failure"
            } else {
                "nothing notices a failure (no passive checks)"
            }
        ),
        ProbeMode::Onfail => format!(
            "{head}: runs only while the server is out (unhealthy or unavailable), so it detects \
             nothing (no detection bound); {recovery}"
        ),
    }
}

/// What one probe takes a server out for, and how soon; what it cannot see, and why.
fn detection(p: &ProbeConfig, b: &Bounds) -> String {
    let mut seen = Vec::new();
    let mut blind = Vec::new();
    for f in Failure::ALL {
        match seen_within(p, b, f) {
            Some(d) => seen.push(format!("{} within {}", f.name(), human(d))),
            None => blind.push(f.name()),
        }
    }
    let mut text = if seen.is_empty() {
        "a server leaves traffic for nothing it sees".to_string()
    } else {
        format!("a server leaves traffic: {}", seen.join(", "))
    };
    if slow_wrong_answer(p, b) {
        text.push_str(
            " (a reply that may still match is read until the timeout, unless the server \
             closes: only an expect anchored with ^ is decided by its first bytes)",
        );
    }
    if !blind.is_empty() {
        let _ = write!(
            text,
            "; not seen: {} ({})",
            blind.join(", "),
            blind_because(p)
        );
    }
    text
}

/// A tcp probe that sees a wrong answer only at its timeout.
fn slow_wrong_answer(p: &ProbeConfig, b: &Bounds) -> bool {
    p.kind == ProbeKind::Tcp
        && b.detect_worst != b.detect_fast
        && seen_within(p, b, Failure::WrongAnswer) == Some(b.detect_worst)
}

fn recovery(b: &Bounds) -> String {
    if b.recover_min.is_zero() {
        format!("within {} of recovering", human(b.recover_max))
    } else {
        format!(
            "{} to {} after it recovers",
            human(b.recover_min),
            human(b.recover_max)
        )
    }
}

/// What passive checks count for this service, and what they do.
fn passive_line(svc: &ServiceConfig) -> String {
    if svc.max_fails == 0 {
        return "passive checks: off (max_fails = 0)".to_string();
    }
    let rule = format!(
        "{} within {} make a server unavailable; it returns {}",
        count(svc.max_fails as usize, "failure", "failures"),
        human(svc.fail_timeout),
        if svc.probes.is_empty() {
            format!("after {}", human(svc.fail_timeout))
        } else {
            format!(
                "after {} once every probe has passed again",
                human(svc.fail_timeout)
            )
        }
    );
    match passive_coverage(svc.protocol, svc.forwarding) {
        PassiveCoverage::Full => format!(
            "passive checks: {rule}; counted: RST answering a SYN, ICMP unreachable from the \
             server about a SYN, SYN resent after the server stayed silent"
        ),
        PassiveCoverage::SynResendOnly => format!(
            "passive checks: {rule}; counted: only a SYN resent after the server stayed silent \
             ({}: replies bypass lb)",
            svc.forwarding
        ),
        PassiveCoverage::IcmpOnly => format!(
            "passive checks: {rule}; counted: only ICMP unreachables from the server (udp has \
             no handshake: a server that goes silent is not counted)"
        ),
        PassiveCoverage::None => format!(
            "passive checks: unavailable (udp with {}: no handshake, and the server's ICMP \
             errors go straight to the client); max_fails = {} counts nothing",
            svc.forwarding, svc.max_fails
        ),
    }
}

/// The service's combined bound, per kind of failure: the fastest probe that runs while
/// a server is up and sees it, or passive checks alone; and the slowest recovery, since
/// every probe must pass again.
fn service_bound_line(svc: &ServiceConfig) -> String {
    let passive = svc.max_fails > 0 && passive_coverage(svc.protocol, svc.forwarding).any();
    let always: Vec<(&ProbeConfig, Bounds)> = svc
        .probes
        .iter()
        .filter(|p| p.mode == ProbeMode::Always)
        .map(|p| (p, detection_bounds(p)))
        .collect();
    let idle = svc.probes.iter().any(|p| p.mode == ProbeMode::Idle);
    let unwatched = if svc.probes.is_empty() {
        "no probe"
    } else if idle {
        "no probe runs while a server is up and carries client traffic"
    } else {
        "no probe runs while a server is up"
    };
    let mut seen = Vec::new();
    let mut blind = Vec::new();
    for f in Failure::ALL {
        let best = always
            .iter()
            .filter_map(|(p, b)| seen_within(p, b, f).map(|d| (d, p.name.as_str())))
            .min_by_key(|&(d, _)| d);
        match best {
            Some((d, name)) => {
                seen.push(format!("{} within {} (probe {name:?})", f.name(), human(d)))
            }
            None => blind.push(f.name()),
        }
    }
    let mut parts = Vec::new();
    let detection = if seen.is_empty() && passive {
        format!(
            "{unwatched}: only passive checks notice a failure, and only under client traffic \
             (no time bound)"
        )
    } else if seen.is_empty() {
        format!("{unwatched}: nothing notices a failing server (no detection bound)")
    } else {
        let mut s = format!(
            "a server leaves traffic: {}, + propagation (< 1ms)",
            seen.join(", ")
        );
        if passive {
            s.push_str("; sooner when passive checks count enough failures first");
        }
        if !blind.is_empty() {
            let _ = write!(
                s,
                "; not seen by any probe: {}{}",
                blind.join(", "),
                if passive {
                    " (only passive checks, under client traffic, with no time bound)"
                } else {
                    " (never noticed)"
                }
            );
        }
        s
    };
    parts.push(detection);
    if let Some(slowest) = svc
        .probes
        .iter()
        .map(detection_bounds)
        .max_by_key(|b| b.recover_max)
    {
        parts.push(format!(
            "a failed server returns within {} of recovering (every probe must pass)",
            human(slowest.recover_max)
        ));
    }
    format!("service bound: {}", parts.join("; "))
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// When announcing: where the VIPs go and the dead-man switch's bound.
fn announce_line(cfg: &Config) -> Option<String> {
    let interface = cfg.agent.announce_interface.as_ref()?;
    Some(match cfg.agent.announce_lifetime {
        Some(lifetime) => format!(
            "announce: VIPs as host addresses on {interface}, lifetime {} refreshed every {}; \
             an agent dead for longer is withdrawn",
            human(lifetime),
            human(super::announce_refresh_every(lifetime))
        ),
        None => format!(
            "announce: VIPs as host addresses on {interface}, lifetime forever: an agent that \
             stays dead keeps the node announced"
        ),
    })
}

/// With a non-default `agent.max_backends`: the room and the kernel memory it takes
/// (32 B per entry in `LB_BACKENDS`, 32 B per entry per CPU in `LB_BACKEND_STATS`).
fn capacity_line(cfg: &Config) -> Option<String> {
    let max = cfg.agent.max_backends;
    if max == super::DEFAULT_MAX_BACKENDS {
        return None;
    }
    let servers: usize = cfg.services.iter().map(|s| s.servers.len()).sum();
    let mib = f64::from(max + 1) * 32.0 / (1024.0 * 1024.0);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Some(format!(
        "data plane: room for {max} backends ({servers} configured); backend maps {mib:.1} MiB \
         + {mib:.1} MiB per CPU ({:.1} MiB on this host's {cpus} CPUs)",
        mib * (1 + cpus) as f64
    ))
}

/// The flow, nat and source tables: how many flows, why that many, and their memory.
fn tables_line(cfg: &Config, host: &HostFacts) -> String {
    use crate::dataplane::sizing::{DEFAULT_MEMORY_DIVISOR, MapSizes, default_max_flows};
    let (flows, why) = match cfg.agent.max_flows {
        Some(n) => (n, "agent.max_flows".to_string()),
        None => match host.memory {
            Some(m) => (
                default_max_flows(m),
                format!(
                    "the default: 1/{DEFAULT_MEMORY_DIVISOR} of this host's {} of memory, at \
                     least {}",
                    mib_text(m),
                    crate::dataplane::sizing::DEFAULT_FLOWS_FLOOR
                ),
            ),
            None => (
                default_max_flows(0),
                "the default; this host's memory is unknown".to_string(),
            ),
        },
    };
    let Some(sizes) = MapSizes::default().with_flows(flows) else {
        return format!("flow tables: agent.max_flows {flows} is out of range");
    };
    sizes_text(&sizes, &why)
}

/// The tables `sizes` makes and the memory they take (`why`: where the size came from).
fn sizes_text(sizes: &crate::dataplane::MapSizes, why: &str) -> String {
    let m = sizes.table_memory();
    // Cluster mode: the peer tables (other nodes' connections), counted in the total.
    let peers = if sizes.cluster() {
        format!(
            ", LB_PEER_FLOWS and LB_PEER_NAT {} ({} buckets of 4 ways each)",
            mib_text(m.peers),
            sizes.peer_buckets()
        )
    } else {
        String::new()
    };
    format!(
        "flow tables: {} live flows ({why}): LB_FLOWS {} ({} buckets of 4 ways), \
         LB_NAT {} ({} buckets of 4 ways), LB_SOURCES {} ({} entries){peers}; {} in all, {} B \
         per flow",
        sizes.max_flows(),
        mib_text(m.flows),
        sizes.tables().flow_buckets,
        mib_text(m.nat),
        sizes.tables().nat_buckets,
        mib_text(m.sources),
        sizes.source_entries(),
        mib_text(m.total()),
        m.total() / u64::from(sizes.max_flows()),
    )
}

/// Bytes as MiB (or GiB past 10 GiB), one decimal.
fn mib_text(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let mib = bytes as f64 / MIB;
    if mib >= 10.0 * 1024.0 {
        format!("{:.1} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}

#[cfg(test)]
mod tests {
    use super::sizes_text;
    use crate::dataplane::MapSizes;

    #[test]
    fn the_tables_line_counts_the_peer_tables_in_cluster_mode() {
        let sizes = MapSizes::default().with_flows(1 << 16).expect("in range");
        let plain = sizes_text(&sizes, "agent.max_flows");
        assert!(!plain.contains("LB_PEER"), "{plain}");
        assert!(plain.ends_with("in all, 520 B per flow"), "{plain}");
        let cluster = sizes_text(&sizes.with_cluster(), "agent.max_flows");
        assert!(
            cluster
                .contains("LB_PEER_FLOWS and LB_PEER_NAT 20.0 MiB (32768 buckets of 4 ways each)"),
            "{cluster}"
        );
        assert!(cluster.ends_with("in all, 840 B per flow"), "{cluster}");
    }
}
