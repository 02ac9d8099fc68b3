//! The text `lb-agent check-config` prints for a valid config: each service with its
//! probes' TR7 bounds, its passive checks and its combined bound, then every warning
//! (docs/check-config.md). Facts about the host are passed in ([`HostFacts`]) so that the
//! same config always gives the same text (the golden tests in `examples/` rely on it).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::path::Path;

use super::bounds::{Bounds, detection_bounds};
use super::passive::{PassiveCoverage, passive_coverage};
use super::values::human;
use super::warnings::warnings;
use super::{BackupLevel, Config, ProbeConfig, ProbeKind, ProbeMode, ServiceConfig, TcpCheck};

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
    for probe in &svc.probes {
        out.push(format!("  {}", probe_line(probe)));
    }
    out.push(format!("  {}", passive_line(svc)));
    out.push(format!("  {}", service_bound_line(svc)));
    out.extend(spare_line(svc).map(|l| format!("  {l}")));
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

/// With a removal cap (`max_unhealthy_percent` below 100): what it removes at most, per
/// group of configured servers, and Azure's all-unhealthy rule.
fn cap_line(svc: &ServiceConfig) -> Option<String> {
    let pct = svc.max_unhealthy_percent.min(100);
    if pct >= 100 {
        return None;
    }
    if pct == 0 {
        return Some("removal cap: 0%: health never removes a server".to_string());
    }
    let mut groups: std::collections::BTreeMap<Option<u32>, usize> = Default::default();
    for s in &svc.servers {
        let level = match s.backup {
            BackupLevel::Level(n) if s.service.is_none() => Some(n),
            // SRV names: their levels come from the records.
            _ => None,
        };
        *groups.entry(level).or_default() += 1;
    }
    let parts: Vec<String> = groups
        .iter()
        .filter_map(|(level, &n)| {
            let name = match level {
                Some(0) => "primary group".to_string(),
                Some(l) => format!("backup level {l}"),
                None => return None,
            };
            Some(format!("{name}: {} of {n}", n * usize::from(pct) / 100))
        })
        .collect();
    Some(format!(
        "removal cap: health removes at most {pct}% of a group at once ({}); a group whose \
         servers are all unhealthy keeps them all in traffic (Azure)",
        if parts.is_empty() {
            "servers from SRV names counted as they resolve".to_string()
        } else {
            parts.join(", ")
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

/// `probe "health" (http every 2s, timeout 1s, fails 2, passes 2): ...`.
fn probe_line(p: &ProbeConfig) -> String {
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
             under traffic only passive checks notice a failure; {recovery}",
            human(p.interval),
            detection(p, &b)
        ),
        ProbeMode::Onfail => format!(
            "{head}: runs only while the server is out (unhealthy or unavailable), so it detects \
             nothing (no detection bound); {recovery}"
        ),
    }
}

/// The dead-server bound and, where one exists, the fast-fail bound of one probe.
fn detection(p: &ProbeConfig, b: &Bounds) -> String {
    let dead = if detects_silence(p) {
        format!(
            "a server that stops answering leaves traffic within {}",
            human(b.detect_worst)
        )
    } else {
        "a server that stops answering is not noticed (without expect or test, silence passes)"
            .to_string()
    };
    match fast_fail(p) {
        Some(what) => format!("{dead}, {what} within {}", human(b.detect_fast)),
        None => dead,
    }
}

/// Does a probe fail when the server says nothing? A udp probe fails on silence only
/// when it waits for a reply (`expect` or `test`, as `probe::execute` decides).
fn detects_silence(p: &ProbeConfig) -> bool {
    p.kind != ProbeKind::Udp || p.expect.is_some() || p.test.is_some()
}

/// Can a probe see a wrong answer? http always (status, body, test); tcp and udp only
/// when they check the reply (`expect` or `test`): a tcp probe without them (the SYN
/// check or a connect) sees only whether the port accepts, a udp one only a port
/// unreachable.
fn sees_wrong_answers(p: &ProbeConfig) -> bool {
    match p.kind {
        ProbeKind::Http => true,
        ProbeKind::Tcp | ProbeKind::Udp => p.expect.is_some() || p.test.is_some(),
        ProbeKind::Icmp => false,
    }
}

/// What makes a probe fail without waiting for its timeout.
fn fast_fail(p: &ProbeConfig) -> Option<&'static str> {
    let wrong = sees_wrong_answers(p);
    match p.kind {
        ProbeKind::Http | ProbeKind::Tcp if wrong => {
            Some("one that refuses the connection or answers wrongly")
        }
        ProbeKind::Http | ProbeKind::Tcp => Some("one that refuses the connection"),
        ProbeKind::Udp if wrong => Some("one that answers with ICMP port unreachable or wrongly"),
        ProbeKind::Udp => Some("one that answers with ICMP port unreachable"),
        ProbeKind::Icmp => None,
    }
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

/// The service's combined bound: the fastest probe that runs while a server is up, or
/// passive checks alone; and the slowest recovery, since every probe must pass again.
fn service_bound_line(svc: &ServiceConfig) -> String {
    let passive = svc.max_fails > 0 && passive_coverage(svc.protocol, svc.forwarding).any();
    let always: Vec<(&ProbeConfig, Bounds)> = svc
        .probes
        .iter()
        .filter(|p| p.mode == ProbeMode::Always)
        .map(|p| (p, detection_bounds(p)))
        .collect();
    let dead = always
        .iter()
        .filter(|(p, _)| detects_silence(p))
        .min_by_key(|(_, b)| b.detect_worst);
    let fast = always
        .iter()
        .filter(|(p, _)| fast_fail(p).is_some())
        .min_by_key(|(_, b)| b.detect_fast);
    // The fastest probe that sees a wrong answer: not always the fastest one that sees a
    // refusal (a SYN check sees no answer at all).
    let wrong = always
        .iter()
        .filter(|(p, _)| sees_wrong_answers(p))
        .min_by_key(|(_, b)| b.detect_fast);
    let fast_text = |(fp, fb): &(&ProbeConfig, Bounds)| match wrong {
        Some((wp, _)) if wp.name == fp.name => format!(
            "one that fails fast (refuses, answers wrongly) within {} (probe {:?})",
            human(fb.detect_fast),
            fp.name
        ),
        Some((wp, wb)) => format!(
            "one that refuses within {} (probe {:?}), one that answers wrongly within {} (probe {:?})",
            human(fb.detect_fast),
            fp.name,
            human(wb.detect_fast),
            wp.name
        ),
        None => format!(
            "one that refuses within {} (probe {:?}; no probe checks the answer)",
            human(fb.detect_fast),
            fp.name
        ),
    };
    let idle = svc.probes.iter().any(|p| p.mode == ProbeMode::Idle);
    let unwatched = if svc.probes.is_empty() {
        "no probe"
    } else if idle {
        "no probe runs while a server is up and carries client traffic"
    } else {
        "no probe runs while a server is up"
    };
    let mut parts = Vec::new();
    let detection = match (dead, fast) {
        (Some((dp, db)), fast) => {
            let mut s = format!(
                "a server that stops answering leaves traffic within {} (probe {:?})",
                human(db.detect_worst),
                dp.name
            );
            if let Some(f) = fast {
                let _ = write!(s, ", {}", fast_text(f));
            }
            s.push_str(", + propagation (< 1ms)");
            if passive {
                s.push_str("; sooner when passive checks count enough failures first");
            }
            s
        }
        (None, Some(f)) => format!(
            "a server that goes silent {}; {}, + propagation (< 1ms)",
            if passive {
                "leaves only when passive checks count enough failures under client traffic (no time bound)"
            } else {
                "is never noticed"
            },
            fast_text(f),
        ),
        (None, None) if passive => format!(
            "{unwatched}: only passive checks notice a failure, and only under client traffic \
             (no time bound)"
        ),
        (None, None) => {
            format!("{unwatched}: nothing notices a failing server (no detection bound)")
        }
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
            ", LB_PEER_FLOWS and LB_PEER_NAT {} ({} entries each)",
            mib_text(m.peers),
            sizes.peer_entries()
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
            cluster.contains("LB_PEER_FLOWS and LB_PEER_NAT 17.0 MiB (65536 entries each)"),
            "{cluster}"
        );
        assert!(cluster.ends_with("in all, 792 B per flow"), "{cluster}");
    }
}
