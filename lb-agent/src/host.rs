//! Facts about this host that a config depends on: the addresses configured on it
//! (a nat service's `snat_ip` must be one, or replies could never reach the balancer;
//! a tunnel's outer source is one of the interface's).

use std::{collections::BTreeSet, net::IpAddr};

use crate::config::{Config, Forwarding};

/// Every address configured on an interface of this network namespace.
pub fn local_addresses() -> std::io::Result<BTreeSet<IpAddr>> {
    Ok(named_addresses()?.into_iter().map(|(_, ip)| ip).collect())
}

/// The addresses configured on `interface`, in the kernel's order.
pub fn interface_addresses(interface: &str) -> std::io::Result<Vec<IpAddr>> {
    Ok(named_addresses()?
        .into_iter()
        .filter(|(name, _)| name == interface)
        .map(|(_, ip)| ip)
        .collect())
}

/// `(interface, address)` of every IPv4 and IPv6 address of this network namespace, in
/// the kernel's order (`getifaddrs(3)`).
pub fn named_addresses() -> std::io::Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not freed yet.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() && !ifa.ifa_name.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says its real type.
            let ip = match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    Some(IpAddr::from(
                        u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                    ))
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            };
            if let Some(ip) = ip {
                // SAFETY: ifa_name is a NUL-terminated interface name of the node.
                let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
                    .to_string_lossy()
                    .into_owned();
                out.push((name, ip));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The addresses the agent puts on its `announce_interface` itself (docs/multi-node.md):
/// the VIPs, and in cluster mode the nat services' SNAT addresses, announced like VIPs.
/// None without an `announce_interface`.
pub fn announced_addresses(cfg: &Config) -> BTreeSet<IpAddr> {
    if cfg.agent.announce_interface.is_none() {
        return BTreeSet::new();
    }
    let vips = cfg.services.iter().map(|s| s.vip.ip());
    let snat = cfg
        .services
        .iter()
        .filter(|s| cfg.cluster.is_some() && s.forwarding == Forwarding::Nat)
        .flat_map(|s| s.snat_ips.iter().copied());
    vips.chain(snat).collect()
}

/// `(service, snat_ip)` of every nat service whose `snat_ip` is neither in `local` nor
/// one the agent adds itself ([`announced_addresses`]).
pub fn foreign_snat_ips(cfg: &Config, local: &BTreeSet<IpAddr>) -> Vec<(String, IpAddr)> {
    let announced = announced_addresses(cfg);
    cfg.services
        .iter()
        .filter(|s| s.forwarding == Forwarding::Nat)
        .flat_map(|s| s.snat_ips.iter().map(|ip| (s.name.clone(), *ip)))
        .filter(|(_, ip)| !local.contains(ip) && !announced.contains(ip))
        .collect()
}

/// The refusal for [`foreign_snat_ips`], `None` when every `snat_ip` is local.
pub fn check_snat_ips(cfg: &Config) -> Result<(), String> {
    let local = local_addresses().map_err(|e| format!("listing this host's addresses: {e}"))?;
    snat_ips_refusal(cfg, &local)
}

/// The refusal for [`foreign_snat_ips`] against `local`, `Ok` when every `snat_ip` is in it.
pub fn snat_ips_refusal(cfg: &Config, local: &BTreeSet<IpAddr>) -> Result<(), String> {
    let foreign = foreign_snat_ips(cfg, local);
    if foreign.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = foreign
        .iter()
        .map(|(svc, ip)| format!("service {svc:?} snat_ip {ip}"))
        .collect();
    Err(format!(
        "{} not configured on this host: replies from the backends to it would never reach \
         the balancer; add the address (`ip addr add`) or fix snat_ip",
        list.join(", ")
    ))
}

/// The kernel's ephemeral port range of this network namespace
/// (`net.ipv4.ip_local_port_range`; it applies to IPv6 too).
pub fn ephemeral_ports() -> std::io::Result<std::ops::RangeInclusive<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")?;
    parse_port_range(&text).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("ip_local_port_range: unexpected {text:?}"),
        )
    })
}

fn parse_port_range(text: &str) -> Option<std::ops::RangeInclusive<u16>> {
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    let (low, high) = (it.next()?.ok()?, it.next()?.ok()?);
    Some(low..=high)
}

/// A warning for every nat service whose `snat_ports` overlap `ephemeral`: a connection
/// this host opens from a `snat_ip` (a probe, say) could draw a port that a nat flow
/// holds toward the same backend, and its replies would be translated away.
pub fn snat_port_overlaps(cfg: &Config, ephemeral: &std::ops::RangeInclusive<u16>) -> Vec<String> {
    cfg.services
        .iter()
        .filter(|s| s.forwarding == Forwarding::Nat)
        .filter(|s| {
            s.snat_ports.start() <= ephemeral.end() && ephemeral.start() <= s.snat_ports.end()
        })
        .map(|s| {
            format!(
                "service {:?}: snat_ports {}-{} overlap this host's ephemeral ports {}-{} \
                 (net.ipv4.ip_local_port_range): a connection the host itself opens from a \
                 snat address may collide with a nat flow; move one of the ranges",
                s.name,
                s.snat_ports.start(),
                s.snat_ports.end(),
                ephemeral.start(),
                ephemeral.end()
            )
        })
        .collect()
}

/// [`snat_port_overlaps`] against this namespace's range (nothing when it cannot be read).
pub fn snat_port_warnings(cfg: &Config) -> Vec<String> {
    ephemeral_ports()
        .map(|range| snat_port_overlaps(cfg, &range))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_parse_as_the_kernel_prints_them() {
        assert_eq!(parse_port_range("32768\t60999\n"), Some(32768..=60999));
        assert_eq!(parse_port_range("1024 65535"), Some(1024..=65535));
        assert_eq!(parse_port_range("garbage"), None);
    }
}
