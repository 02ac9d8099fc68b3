//! Warnings about configs that are valid but probably not what was meant (`check-config`
//! prints them, `run` and `reload` log them).

use std::time::Duration;

use super::bounds::detection_bounds;
use super::passive::{passive_coverage, passive_gap};
use super::report::cap_groups;
use super::values::human;
use super::{BackupLevel, Config, Forwarding, ProbeConfig, ProbeKind, ProbeMode};
use crate::probe::MIN_INTERVAL;

/// From this value on, TR7 takes a probe's Period or Timeout for a mistake and applies
/// 1 s instead; lb uses what is written and warns (also for `fail_timeout`).
pub const LONG: Duration = Duration::from_secs(120);

/// More than this many `fails` (Azure's largest) is warned about.
pub const MANY_FAILS: u32 = 10;

/// Values that are valid but that a reference treats as a mistake, or that the
/// scheduler clamps: one warning each.
fn absurd_values(at: &str, p: &ProbeConfig, out: &mut Vec<String>) {
    let b = detection_bounds(p);
    for (key, d) in [("interval", p.interval), ("timeout", p.timeout)] {
        if d >= LONG {
            out.push(format!(
                "{at}: {key} {} is {} or more, which TR7 takes for a mistake (it applies 1s); \
                 lb uses it as written: a server that stops answering stays in traffic up to {}",
                human(d),
                human(LONG),
                human(b.detect_worst)
            ));
        }
    }
    if p.interval < MIN_INTERVAL {
        out.push(format!(
            "{at}: interval {} is below 1ms: the scheduler probes at most every 1ms; the bounds \
             above use 1ms",
            human(p.interval)
        ));
    }
    if p.timeout < MIN_INTERVAL {
        out.push(format!(
            "{at}: timeout {} is below 1ms: the timer counts whole milliseconds, so a probe may \
             run up to 1ms (the bounds above use 1ms) and a server farther than that always fails",
            human(p.timeout)
        ));
    }
    if p.fails > MANY_FAILS {
        out.push(format!(
            "{at}: fails = {} (Azure allows at most {MANY_FAILS}): a server that stops answering \
             stays in traffic up to {}",
            p.fails,
            human(b.detect_worst)
        ));
    }
    if p.passes > MANY_FAILS {
        out.push(format!(
            "{at}: passes = {}: a recovered server waits at least {} before it takes traffic again",
            p.passes,
            human(b.recover_min)
        ));
    }
}

/// Probes that can never pass, or never check what they seem to, although each key alone
/// is valid (the ones that can never pass at all are config errors in `probe.rs`).
fn hollow_probes(at: &str, p: &ProbeConfig, out: &mut Vec<String>) {
    if p.kind == ProbeKind::Udp && p.send.is_none() && (p.expect.is_some() || p.test.is_some()) {
        out.push(format!(
            "{at}: a udp probe with {} but no send sends an empty datagram, which few services \
             answer: the probe may never pass; set send",
            if p.expect.is_some() { "expect" } else { "test" }
        ));
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
            } else if s.probes.iter().all(|p| p.mode != ProbeMode::Always) {
                out.push(format!(
                    "{at}: every probe is mode = \"idle\" or \"onfail\" and {why}: nothing \
                     notices a server failing while it carries client traffic"
                ));
            }
        }
        if let Some(gap) = passive_gap(s) {
            out.push(format!("{at}: {gap}"));
        }
        if s.forwarding.is_tunnel() {
            out.push(tunnel_mtu_warning(&at, s.forwarding));
        }
        if s.max_fails > 0 && s.fail_timeout >= LONG {
            out.push(format!(
                "{at}: fail_timeout {} is {} or more: max_fails counts failures over that whole \
                 window, and a server removed by passive checks stays out at least that long \
                 (Angie's default: 10s)",
                human(s.fail_timeout),
                human(LONG)
            ));
        }
        if s.max_unhealthy_percent == 0 {
            out.push(format!(
                "{at}: max_unhealthy_percent = 0: health checks can never remove a server"
            ));
        } else if s.max_unhealthy_percent < 100 {
            let pct = usize::from(s.max_unhealthy_percent);
            // A group of one is the all-unhealthy rule, which the cap line says.
            for (level, n) in cap_groups(s) {
                if n >= 2 && n * pct / 100 == 0 {
                    let group = match level {
                        0 => "the primary group".to_string(),
                        l => format!("backup level {l}"),
                    };
                    let spare = if level == 0 && s.servers.iter().any(|v| v.spare) {
                        " unless a spare runs in its place"
                    } else {
                        ""
                    };
                    out.push(format!(
                        "{at}: max_unhealthy_percent = {pct} removes no server of {group} \
                         ({n} × {pct}% rounds down to 0): health checks never take one of \
                         them out{spare}, as with 0%"
                    ));
                }
            }
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
            if p.timeout > p.interval {
                out.push(format!(
                    "{at}: timeout {} > interval {}: a server that stops answering is probed every {} \
                     (a probe never overlaps the previous one), and a recovery can wait for a failing \
                     probe's timeout (the printed bounds include it)",
                    human(p.timeout),
                    human(p.interval),
                    human(p.timeout)
                ));
            } else if p.timeout == p.interval {
                out.push(format!(
                    "{at}: timeout {} = interval {}: a server that stops answering is probed back to back \
                     (a probe never overlaps the previous one)",
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
            absurd_values(&at, p, &mut out);
            hollow_probes(&at, p, &mut out);
            if p.kind == ProbeKind::Icmp && p.port.is_some() {
                out.push(format!("{at}: port is ignored by icmp probes"));
            }
            if p.kind == ProbeKind::Http && !p.http.tls && p.http.sni.is_some() {
                out.push(format!("{at}: sni is ignored without tls = true"));
            }
            if p.kind == ProbeKind::Udp && p.expect.is_none() && p.test.is_none() {
                out.push(format!(
                    "{at}: a udp probe without expect or test passes on silence: only an ICMP port-unreachable fails it"
                ));
            }
        }
    }
    out
}
