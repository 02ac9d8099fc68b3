//! `check-config` helpers: the TR7 detection/recovery bounds of a probe and warnings about
//! configs that are valid but probably not what was meant.

use std::time::Duration;

use super::passive::{passive_coverage, passive_gap};
use super::report::human;
use super::{BackupLevel, Config, Forwarding, ProbeConfig, ProbeKind, ProbeMode};

/// How long a probe takes to notice a failure and a recovery (DESIGN.md §5, TR7), not
/// counting propagation (< 1 ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// A server that stops answering is out of traffic within this:
    /// `fails × (interval + jitter + timeout)`.
    pub detect_worst: Duration,
    /// A refused port or a wrong answer fails without waiting for the timeout:
    /// `fails × (interval + jitter)`.
    pub detect_fast: Duration,
    /// Recovery takes at least `(passes − 1) × interval` ...
    pub recover_min: Duration,
    /// ... and at most `passes × (interval + jitter)`.
    pub recover_max: Duration,
}

/// The bounds of one probe. With `jitter = 0` (the default) these are exactly the TR7
/// formulas; jitter only lengthens waits (each is `interval + random(0..=jitter)`).
/// A probe in `onfail` mode does not run while the server is healthy, so its detection
/// bounds only hold for failures that passive checks report first.
pub fn detection_bounds(p: &ProbeConfig) -> Bounds {
    let period = p.interval.saturating_add(p.jitter);
    Bounds {
        detect_worst: period.saturating_add(p.timeout).saturating_mul(p.fails),
        detect_fast: period.saturating_mul(p.fails),
        recover_min: p.interval.saturating_mul(p.passes.saturating_sub(1)),
        recover_max: period.saturating_mul(p.passes),
    }
}

/// The MTU a tunnel service costs (docs/tunnel.md, "MTU"): said for every `ipip` /
/// `gue` service, since check-config cannot see the path to the servers.
fn tunnel_mtu_warning(at: &str, forwarding: Forwarding) -> String {
    let gue = if forwarding == Forwarding::Gue { 8 } else { 0 };
    format!(
        "{at}: forwarding = \"{forwarding}\" adds {} bytes to every packet toward an IPv4 server \
         ({} toward IPv6): a client packet that no longer fits the interface's MTU once \
         encapsulated is answered with ICMP fragmentation-needed / packet-too-big (counted \
         tx_icmp_too_big), which shrinks TCP's segments through path MTU discovery; raise the \
         MTU of the path to the servers by that much to avoid it (docs/tunnel.md)",
        20 + gue,
        40 + gue
    )
}

/// Things that are allowed but look like mistakes, one line each, prefixed with the key
/// path (`service[0].probe[1]`) and the service or probe name.
pub fn warnings(cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if cfg.services.is_empty() {
        out.push("no [[service]] is configured: the agent will balance nothing".to_string());
    }
    for (si, s) in cfg.services.iter().enumerate() {
        let at = format!("service[{si}] ({:?})", s.name);
        let coverage = passive_coverage(s.protocol, s.forwarding);
        let no_passive = if s.max_fails == 0 {
            Some("max_fails = 0".to_string())
        } else if !coverage.any() {
            Some(format!(
                "passive checks see nothing ({} with forwarding = \"{}\")",
                s.protocol, s.forwarding
            ))
        } else {
            None
        };
        if let Some(why) = no_passive {
            if s.probes.is_empty() {
                out.push(format!(
                    "{at}: no probe and {why}: nothing checks the servers' health"
                ));
            } else if s.probes.iter().all(|p| p.mode == ProbeMode::Onfail) {
                out.push(format!(
                    "{at}: every probe is mode = \"onfail\" and {why}: nothing notices a server failing"
                ));
            }
        }
        if let Some(gap) = passive_gap(s) {
            out.push(format!("{at}: {gap}"));
        }
        if s.forwarding.is_tunnel() {
            out.push(tunnel_mtu_warning(&at, s.forwarding));
        }
        if s.max_unhealthy_percent == 0 {
            out.push(format!(
                "{at}: max_unhealthy_percent = 0: health checks can never remove a server"
            ));
        }
        let primaries: Vec<_> = s
            .servers
            .iter()
            .filter(|v| v.backup == BackupLevel::Level(0))
            .collect();
        let srv_prio = s.servers.iter().any(|v| v.service.is_some());
        if !primaries.is_empty() && primaries.iter().all(|v| v.spare) && !srv_prio {
            out.push(format!(
                "{at}: every primary server is a spare; spares run only when primaries fail, so they never run"
            ));
        }
        if primaries.is_empty() && !srv_prio {
            out.push(format!(
                "{at}: no primary server (backup = 0): traffic always goes to a backup level"
            ));
        }
        for (oi, o) in cfg.services.iter().enumerate().skip(si + 1) {
            if s.forwarding == Forwarding::Nat
                && o.forwarding == Forwarding::Nat
                && s.snat_ips.iter().any(|ip| o.snat_ips.contains(ip))
                && s.protocol == o.protocol
                && s.snat_ports.start() <= o.snat_ports.end()
                && o.snat_ports.start() <= s.snat_ports.end()
            {
                out.push(format!(
                    "{at}: shares snat_ip {} and overlapping snat_ports with service[{oi}] ({:?}); \
                     flows to a server both services use may collide",
                    s.snat_ips
                        .iter()
                        .find(|ip| o.snat_ips.contains(ip))
                        .map(|ip| ip.to_string())
                        .unwrap_or_default(),
                    o.name
                ));
            }
        }
        for (pi, p) in s.probes.iter().enumerate() {
            let at = format!("service[{si}].probe[{pi}] ({:?})", p.name);
            if p.timeout >= p.interval {
                out.push(format!(
                    "{at}: timeout {} >= interval {}: a server that stops answering is probed less often than \
                     every interval (a probe never overlaps the previous one)",
                    human(p.timeout),
                    human(p.interval)
                ));
            }
            if p.jitter >= p.interval {
                out.push(format!(
                    "{at}: jitter {} >= interval {}: probes may come up to twice as far apart",
                    human(p.jitter),
                    human(p.interval)
                ));
            }
            if p.kind == ProbeKind::Icmp && p.port.is_some() {
                out.push(format!("{at}: port is ignored by icmp probes"));
            }
            if p.kind == ProbeKind::Http && !p.http.tls && p.http.sni.is_some() {
                out.push(format!("{at}: sni is ignored without tls = true"));
            }
            if p.kind == ProbeKind::Udp && p.expect.is_none() && p.test.is_none() {
                out.push(format!(
                    "{at}: a udp probe without expect passes on silence: only an ICMP port-unreachable fails it"
                ));
            }
        }
    }
    out
}
