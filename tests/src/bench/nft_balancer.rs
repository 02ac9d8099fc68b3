//! The nftables balancer the benchmarks compare lb with (BENCHMARKS.md §4, §6): DNAT to a
//! backend chosen by `numgen random` over a map with one entry per weight unit, SNAT to
//! the lb's address (the replies come back through it), as a one-arm kernel balancer is
//! usually built; and the lb host's sysctls such a forwarding balancer needs.

use std::net::Ipv4Addr;

use crate::{
    net::topology::{HOST_IF, Topology},
    scenario::balance::WEIGHTS,
};

/// The backends' IPv4 addresses with the benchmarks' weights (1:1:2).
pub fn weighted_backends(topo: &Topology) -> Vec<(Ipv4Addr, u32)> {
    topo.backends()
        .iter()
        .zip(WEIGHTS)
        .map(|(b, w)| (b.ipv4, w))
        .collect()
}

/// The ruleset of table `table`: `l4` (`tcp` or `udp`) to the VIP's `vip_port` goes to
/// the backends' `backend_port`, spread by weight, with the lb's address as source.
pub fn rules(table: &str, l4: &str, topo: &Topology, vip_port: u16, backend_port: u16) -> String {
    let backends = weighted_backends(topo);
    let slots: Vec<Ipv4Addr> = backends
        .iter()
        .flat_map(|&(ip, weight)| std::iter::repeat_n(ip, weight as usize))
        .collect();
    let map: Vec<String> = slots
        .iter()
        .enumerate()
        .map(|(i, ip)| format!("{i} : {ip}"))
        .collect();
    let set: Vec<String> = backends.iter().map(|(ip, _)| ip.to_string()).collect();
    format!(
        "table ip {table} {{\n\
         \tchain pre {{\n\
         \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
         \t\tip daddr {vip} {l4} dport {vip_port} dnat to numgen random mod {n} map {{ {map} }} : {backend_port}\n\
         \t}}\n\
         \tchain post {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip daddr {{ {set} }} {l4} dport {backend_port} snat to {lb}\n\
         \t}}\n\
         }}\n",
        vip = topo.vip4(),
        n = slots.len(),
        map = map.join(", "),
        set = set.join(", "),
        lb = topo.lb().ipv4,
    )
}

/// Sysctls of the lb host that a forwarding (nftables) balancer needs: forwarding on,
/// and no ICMP redirects for packets that leave by the interface they came in on.
pub fn prepare_lb_host(topo: &Topology) -> anyhow::Result<()> {
    let ns = &topo.lb().ns;
    let per_interface = format!("net.ipv4.conf.{HOST_IF}.send_redirects");
    for (key, value) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv4.conf.all.send_redirects", "0"),
        (per_interface.as_str(), "0"),
    ] {
        ns.sysctl(key, value)?;
    }
    Ok(())
}
