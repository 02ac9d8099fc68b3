//! `[cluster]` and its `[[cluster.peer]]` tables: this node's name, the address the
//! agents sync connection state on, the peers and the shared key file
//! (docs/internals/cluster-sync.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use lb_common::maps::CLUSTER_SNAT_MAX;

use super::fields::{R, opt, positive_duration};
use super::spanned::{Field, Table};
use super::{Forwarding, ServiceConfig, values};

/// Every key of `[cluster]`.
pub(super) const CLUSTER_KEYS: &[&str] = &["node", "listen", "key_file", "resync_timeout", "peer"];
/// Every key of a `[[cluster.peer]]` table.
pub(super) const PEER_KEYS: &[&str] = &["name", "address"];

/// Most members of a cluster (this node and its peers).
pub const MAX_MEMBERS: usize = lb_common::maps::CLUSTER_MEMBERS_MAX;
/// Default `cluster.resync_timeout`.
pub const DEFAULT_RESYNC_TIMEOUT: Duration = Duration::from_secs(5);

/// `[cluster]`: the agents of these nodes share their nat connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This node's name among the members.
    pub node: String,
    /// Where this node receives the peers' connections; the address they dial.
    pub listen: SocketAddr,
    /// The shared secret every member holds (at least 32 bytes, owner-only).
    pub key_file: PathBuf,
    /// How long a starting agent waits for its peers' bulk resync before it announces.
    pub resync_timeout: Duration,
    /// The other members, in file order.
    pub peers: Vec<ClusterPeer>,
}

/// `[[cluster.peer]]`: another member.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterPeer {
    pub name: String,
    /// Its `listen` address.
    pub address: SocketAddr,
}

pub(super) fn cluster(t: &Table<'_>, services: &[ServiceConfig]) -> R<ClusterConfig> {
    t.check_keys(CLUSTER_KEYS)?;
    let node = t.require("node", "\"lb1\"")?.parse(node_name)?;
    let listen = t
        .require("listen", "\"10.0.9.1:7946\"")?
        .parse(sync_address)?;
    let key_file = t
        .require("key_file", "\"/etc/lb/cluster.key\"")?
        .parse(|s| {
            let p = PathBuf::from(s);
            if p.is_absolute() {
                Ok(p)
            } else {
                Err(format!(
                    "{s:?} is not an absolute path: write the shared key's file, e.g. \"/etc/lb/cluster.key\""
                ))
            }
        })?;
    let resync_timeout =
        opt(t, "resync_timeout", positive_duration)?.unwrap_or(DEFAULT_RESYNC_TIMEOUT);
    let peer_field = t.get("peer").ok_or_else(|| {
        t.err_key(
            "peer",
            "a cluster needs at least one [[cluster.peer]] with a name and an address",
        )
    })?;
    let peers = peers(&peer_field, &node, listen)?;
    let members = peers.len() + 1;
    for svc in services.iter().filter(|s| s.forwarding == Forwarding::Nat) {
        let ports = usize::from(svc.snat_ports.end() - svc.snat_ports.start()) + 1;
        if ports < members {
            return Err(peer_field.err(format!(
                "{members} members split service {:?}'s {ports} source ports: every member needs at least one",
                svc.name
            )));
        }
    }
    shared_snat_ranges(&peer_field, services)?;
    Ok(ClusterConfig {
        node,
        listen,
        key_file,
        resync_timeout,
        peers,
    })
}

/// In a cluster a reply's destination port names the member that made its connection
/// (each hands out its slice of the SNAT address's range): services that share a SNAT
/// address must give it one range, and the data plane names at most
/// `CLUSTER_SNAT_MAX` shared addresses.
fn shared_snat_ranges(f: &Field<'_>, services: &[ServiceConfig]) -> R<()> {
    let mut seen: Vec<(std::net::IpAddr, &ServiceConfig)> = Vec::new();
    for svc in services.iter().filter(|s| s.forwarding == Forwarding::Nat) {
        for ip in &svc.snat_ips {
            match seen.iter().find(|(addr, _)| addr == ip) {
                Some((_, first)) if first.snat_ports != svc.snat_ports => {
                    return Err(f.err(format!(
                        "services {:?} ({}-{}) and {:?} ({}-{}) share SNAT address {ip} with different snat_ports: in a cluster each shared address has one port range, which the members split",
                        first.name,
                        first.snat_ports.start(),
                        first.snat_ports.end(),
                        svc.name,
                        svc.snat_ports.start(),
                        svc.snat_ports.end(),
                    )));
                }
                Some(_) => {}
                None => seen.push((*ip, svc)),
            }
        }
    }
    if seen.len() > CLUSTER_SNAT_MAX {
        return Err(f.err(format!(
            "the nat services use {} SNAT addresses; a cluster shares at most {CLUSTER_SNAT_MAX}",
            seen.len()
        )));
    }
    Ok(())
}

fn peers(f: &Field<'_>, node: &str, listen: SocketAddr) -> R<Vec<ClusterPeer>> {
    let tables = f.tables()?;
    if tables.is_empty() || tables.len() >= MAX_MEMBERS {
        return Err(f.err(format!(
            "must list 1 to {} peers (got {})",
            MAX_MEMBERS - 1,
            tables.len()
        )));
    }
    let mut out: Vec<ClusterPeer> = Vec::with_capacity(tables.len());
    for t in &tables {
        t.check_keys(PEER_KEYS)?;
        let name_field = t.require("name", "\"lb2\"")?;
        let name = name_field.parse(node_name)?;
        if name == node {
            return Err(name_field.err(format!(
                "{name:?} is this node (cluster.node); list the other members only"
            )));
        }
        if let Some(i) = out.iter().position(|p| p.name == name) {
            return Err(name_field.err(format!("duplicate peer {name:?} (also peer[{i}])")));
        }
        let address_field = t.require("address", "\"10.0.9.2:7946\"")?;
        let address = address_field.parse(sync_address)?;
        if address == listen {
            return Err(address_field.err(format!(
                "{address} is this node's cluster.listen; each member has its own"
            )));
        }
        if let Some(i) = out.iter().position(|p| p.address == address) {
            return Err(address_field.err(format!(
                "{address} is already the address of peer[{i}] ({:?})",
                out[i].name
            )));
        }
        out.push(ClusterPeer { name, address });
    }
    Ok(out)
}

/// A member's name: the characters of a service name.
fn node_name(s: &str) -> Result<String, String> {
    super::schema::service_name(s).map_err(|_| {
        format!(
            "{s:?} is not a node name: 1..64 letters, digits, '_', '-' or '.', starting with a letter or digit"
        )
    })
}

/// A member's sync address: the unicast `IP:PORT` its peers dial.
fn sync_address(s: &str) -> Result<SocketAddr, String> {
    let sa = s.parse::<SocketAddr>().map_err(|_| {
        values::port_out_of_range(s).unwrap_or_else(|| {
            format!("{s:?} is not an address: write \"IP:PORT\", e.g. \"10.0.9.1:7946\"")
        })
    })?;
    if sa.port() == 0 {
        return Err(format!("{s:?}: port 0 is not allowed (ports are 1..65535)"));
    }
    if sa.ip().is_unspecified() || sa.ip().is_multicast() {
        return Err(format!(
            "{s:?}: must be the unicast address the peers reach this member at"
        ));
    }
    Ok(sa)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const SERVICE: &str = "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n\
                           snat_ports = \"1024-1025\"\n[[service.server]]\naddress = \"10.0.1.11:8080\"\n";

    fn parse(cluster: &str) -> Result<Option<ClusterConfig>, String> {
        crate::config::parse(&format!("{SERVICE}{cluster}"), Path::new("lb.toml"))
            .map(|c| c.cluster)
            .map_err(|e| e.to_string())
    }

    const BASE: &str = "[cluster]\nnode = \"lb1\"\nlisten = \"10.0.9.1:7946\"\n\
                        key_file = \"/etc/lb/cluster.key\"\n";
    const PEER: &str = "[[cluster.peer]]\nname = \"lb2\"\naddress = \"10.0.9.2:7946\"\n";

    #[test]
    fn a_cluster_loads_with_its_defaults() {
        let c = parse(&format!("{BASE}{PEER}")).unwrap().unwrap();
        assert_eq!(c.node, "lb1");
        assert_eq!(c.listen, "10.0.9.1:7946".parse().unwrap());
        assert_eq!(c.key_file, PathBuf::from("/etc/lb/cluster.key"));
        assert_eq!(c.resync_timeout, DEFAULT_RESYNC_TIMEOUT);
        assert_eq!(
            c.peers,
            vec![ClusterPeer {
                name: "lb2".into(),
                address: "10.0.9.2:7946".parse().unwrap()
            }]
        );
        assert_eq!(parse("").unwrap(), None);
    }

    #[test]
    fn errors_name_the_line_and_the_key() {
        let cases = [
            (
                BASE.to_string(),
                "lb.toml:8: cluster.peer: a cluster needs at least one [[cluster.peer]]",
            ),
            (
                format!(
                    "{BASE}{PEER}[[cluster.peer]]\nname = \"lb1\"\naddress = \"10.0.9.3:7946\"\n"
                ),
                "lb.toml:16: cluster.peer[1].name: \"lb1\" is this node",
            ),
            (
                format!(
                    "{BASE}{PEER}[[cluster.peer]]\nname = \"lb3\"\naddress = \"10.0.9.2:7946\"\n"
                ),
                "lb.toml:17: cluster.peer[1].address: 10.0.9.2:7946 is already the address of peer[0]",
            ),
            (
                format!(
                    "{BASE}{PEER}[[cluster.peer]]\nname = \"lb3\"\naddress = \"10.0.9.3:7946\"\n"
                ),
                "lb.toml:12: cluster.peer: 3 members split service \"web\"'s 2 source ports",
            ),
            (
                format!(
                    "[[service]]\nname = \"api\"\nvip = \"10.0.0.101:80\"\nsnat_ip = \"10.0.0.2\"\n\
                     snat_ports = \"2000-2999\"\n[[service.server]]\naddress = \"10.0.1.12:8080\"\n\
                     {BASE}{PEER}"
                ),
                "lb.toml:19: cluster.peer: services \"web\" (1024-1025) and \"api\" (2000-2999) share SNAT address 10.0.0.2 with different snat_ports",
            ),
            (
                BASE.replace("10.0.9.1:7946", "0.0.0.0:7946") + PEER,
                "lb.toml:10: cluster.listen: \"0.0.0.0:7946\": must be the unicast address",
            ),
            (
                BASE.replace("/etc/lb/cluster.key", "cluster.key") + PEER,
                "lb.toml:11: cluster.key_file: \"cluster.key\" is not an absolute path",
            ),
            (
                BASE.replace("\"lb1\"", "\"-lb1\"") + PEER,
                "lb.toml:9: cluster.node: \"-lb1\" is not a node name",
            ),
            (
                format!("{BASE}resync_timeout = \"0\"\n{PEER}"),
                "lb.toml:12: cluster.resync_timeout: must be more than 0",
            ),
            (
                format!("{BASE}{PEER}port = 1\n"),
                "lb.toml:15: cluster.peer[0].port: unknown key",
            ),
        ];
        for (text, want) in cases {
            let got = parse(&text).unwrap_err();
            assert!(got.starts_with(want), "{text}\nwant: {want}\ngot:  {got}");
        }
    }
}
