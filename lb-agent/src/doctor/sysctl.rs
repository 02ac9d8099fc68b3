//! Sysctls of this network namespace: `rp_filter` on the interface and `all`, and the
//! kernel's ephemeral port range against the nat services' `snat_ports`.

use std::net::IpAddr;

use crate::config::{Config, ServerAddress};

use super::{Finding, read_sysctl};

/// `rp_filter` as the kernel applies it on `interface`: the larger of `all` and the
/// interface's own. Strict (1) drops a packet that arrives on the interface from a
/// source the kernel routes out of another one. Packets the program forwards never
/// reach it; the packets it passes to the kernel do: the agent's probe replies and
/// the ICMP errors it does not translate. So strict filtering matters exactly when a
/// backend is routed out of another interface than the attached one.
pub async fn rp_filter(interface: &str, cfg: Option<&Config>) -> Vec<Finding> {
    let all = read_sysctl("net.ipv4.conf.all.rp_filter").and_then(|v| v.parse::<u8>().ok());
    // By path: an interface name may hold dots (`eth0.100`), which the dotted form
    // would take for separators.
    let own = std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{interface}/rp_filter"))
        .ok()
        .and_then(|v| v.trim().parse().ok());
    let (Some(all), Some(own)) = (all, own) else {
        return vec![Finding::warning(
            "rp_filter",
            "cannot read net.ipv4.conf.{all,IF}.rp_filter",
        )];
    };
    let effective = all.max(own);
    let shown = format!("{effective} (all {all}, {interface} {own})");
    if effective != 1 {
        return vec![Finding::ok(
            "rp_filter",
            format!("{shown}: {}", if effective == 0 { "off" } else { "loose" }),
        )];
    }
    let Some(cfg) = cfg else {
        return vec![Finding::warning(
            "rp_filter",
            format!(
                "{shown}: strict; without --config doctor cannot tell whether a backend is \
                 routed out of another interface (then its packets to this host are dropped)"
            ),
        )];
    };
    let elsewhere = backends_routed_elsewhere(interface, cfg).await;
    if elsewhere.is_empty() {
        return vec![Finding::ok(
            "rp_filter",
            format!("{shown}: strict, and every backend is routed through {interface}"),
        )];
    }
    vec![Finding::blocker(
        "rp_filter",
        format!(
            "{shown}: strict, and {} routed out of another interface: packets from them \
             that reach this host on {interface} (probe replies, ICMP errors the program passes) \
             are dropped; set loose mode: sysctl -w net.ipv4.conf.all.rp_filter=2 \
             net.ipv4.conf.{interface}.rp_filter=2",
            elsewhere.join(", ")
        ),
    )]
}

/// The configured backends (literal addresses) whose route leaves through another
/// interface than `interface`.
async fn backends_routed_elsewhere(interface: &str, cfg: &Config) -> Vec<String> {
    let Ok(ifindex) = crate::dataplane::if_index(interface) else {
        return Vec::new();
    };
    let Ok(rtnl) = crate::neighbour::rtnl::Rtnl::new() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ip in literal_backends(cfg) {
        if let Ok(hop) = rtnl.route(ip).await
            && let Some(oif) = hop.oif
            && oif != ifindex
        {
            out.push(format!("backend {ip} is"));
        }
    }
    if out.len() > 1 {
        let n = out.len();
        out = vec![format!("{n} backends are")];
    }
    out
}

/// Every backend given as an IP literal, once.
pub fn literal_backends(cfg: &Config) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = cfg
        .services
        .iter()
        .flat_map(|s| &s.servers)
        .filter_map(|srv| match &srv.address {
            ServerAddress::Socket(sa) => Some(sa.ip()),
            ServerAddress::Name { .. } => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// nat `snat_ports` against `net.ipv4.ip_local_port_range`.
pub fn port_range(cfg: &Config) -> Vec<Finding> {
    let check = "port range";
    let nat = cfg
        .services
        .iter()
        .any(|s| s.forwarding == crate::config::Forwarding::Nat);
    if !nat {
        return Vec::new();
    }
    let Ok(ephemeral) = crate::host::ephemeral_ports() else {
        return vec![Finding::warning(
            check,
            "cannot read net.ipv4.ip_local_port_range",
        )];
    };
    let overlaps = crate::host::snat_port_overlaps(cfg, &ephemeral);
    if overlaps.is_empty() {
        return vec![Finding::ok(
            check,
            format!(
                "snat_ports stay out of the ephemeral ports {}-{}",
                ephemeral.start(),
                ephemeral.end()
            ),
        )];
    }
    overlaps
        .into_iter()
        .map(|o| {
            Finding::blocker(
                check,
                format!(
                    "{o} (e.g. sysctl -w net.ipv4.ip_local_port_range=\"32768 60999\" with \
                     snat_ports = \"1024-32767\")"
                ),
            )
        })
        .collect()
}
