//! Addresses: nat `snat_ip`s configured on the attached interface, and dsr backends —
//! on the interface's segment, and their ARP sysctls where the backend is this host.

use std::net::IpAddr;

use crate::config::{Config, Forwarding, ServerAddress};

use super::{Finding, dsr_segment, read_sysctl};

/// Every nat `snat_ip` must be an address of this host (replies come back to it), best
/// on the attached interface.
pub fn snat(cfg: &Config, interface: Option<&str>) -> Vec<Finding> {
    let check = "snat_ip";
    let Ok(local) = crate::host::named_addresses() else {
        return vec![Finding::warning(check, "cannot list this host's addresses")];
    };
    let mut out = Vec::new();
    for s in cfg
        .services
        .iter()
        .filter(|s| s.forwarding == Forwarding::Nat)
    {
        for ip in &s.snat_ips {
            let on: Vec<&str> = local
                .iter()
                .filter(|(_, a)| a == ip)
                .map(|(n, _)| n.as_str())
                .collect();
            let f = if on.is_empty() {
                Finding::blocker(
                    check,
                    format!(
                        "service {:?}: {ip} is not an address of this host: replies from the \
                         backends to it never reach the balancer (`run` refuses it); `ip addr \
                         add {ip}/32 dev {}` or fix snat_ip",
                        s.name,
                        interface.unwrap_or("IF")
                    ),
                )
            } else if interface.is_some_and(|i| !on.contains(&i)) {
                Finding::warning(
                    check,
                    format!(
                        "service {:?}: {ip} is on {} rather than {}: the backends' replies must \
                         still arrive on {} to be translated (check their route to {ip})",
                        s.name,
                        on.join(", "),
                        interface.unwrap_or("-"),
                        interface.unwrap_or("-")
                    ),
                )
            } else {
                Finding::ok(
                    check,
                    format!("service {:?}: {ip} is on {}", s.name, on.join(", ")),
                )
            };
            out.push(f);
        }
    }
    out
}

/// dsr backends: on the attached interface's segment ([`dsr_segment`]), and the ARP
/// sysctls that keep a backend holding the VIP from answering ARP for it — checked
/// where the backend is this host, printed as advice for the others.
pub fn dsr(cfg: &Config, interface: Option<&str>) -> Vec<Finding> {
    let local: Vec<IpAddr> = crate::host::named_addresses()
        .map(|v| v.into_iter().map(|(_, a)| a).collect())
        .unwrap_or_default();
    let off = interface.map_or_else(Vec::new, |i| dsr_segment::off_segment(cfg, i));
    let mut out = Vec::new();
    for s in cfg
        .services
        .iter()
        .filter(|s| s.forwarding == Forwarding::Dsr)
    {
        let check = format!("dsr {}", s.name);
        let mut remote = 0;
        for srv in &s.servers {
            let ServerAddress::Socket(sa) = &srv.address else {
                continue;
            };
            let ip = sa.ip();
            if local.contains(&ip) {
                out.push(local_arp(&check, ip));
                continue;
            }
            remote += 1;
        }
        out.extend(
            off.iter()
                .filter(|o| o.service == s.name)
                .map(|o| Finding::blocker(check.clone(), o.to_string())),
        );
        if remote > 0 {
            out.push(Finding::ok(
                check,
                format!(
                    "on each of the {remote} backends: the VIP {} on lo (`ip addr add {}/32 dev \
                     lo`), `sysctl -w net.ipv4.conf.all.arp_ignore=1 \
                     net.ipv4.conf.all.arp_announce=2` (not checked from here)",
                    s.vip.ip(),
                    s.vip.ip()
                ),
            ));
        }
    }
    out
}

/// A dsr backend that is this host: its ARP sysctls.
fn local_arp(check: &str, ip: IpAddr) -> Finding {
    if ip.is_ipv6() {
        return Finding::ok(
            check,
            format!("backend {ip} is this host (IPv6: no ARP settings)"),
        );
    }
    let ignore = read_sysctl("net.ipv4.conf.all.arp_ignore").unwrap_or_default();
    let announce = read_sysctl("net.ipv4.conf.all.arp_announce").unwrap_or_default();
    if ignore.parse::<u8>().is_ok_and(|v| v >= 1) && announce.parse::<u8>().is_ok_and(|v| v >= 2) {
        Finding::ok(
            check,
            format!("backend {ip} is this host: arp_ignore {ignore}, arp_announce {announce}"),
        )
    } else {
        Finding::warning(
            check,
            format!(
                "backend {ip} is this host and answers ARP for the VIP it holds (arp_ignore \
                 {ignore}, arp_announce {announce}): `sysctl -w net.ipv4.conf.all.arp_ignore=1 \
                 net.ipv4.conf.all.arp_announce=2`"
            ),
        )
    }
}
