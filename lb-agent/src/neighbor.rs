//! MAC resolution for backends through the kernel's routing and neighbour tables.
//!
//! For each backend the next hop on the attached interface is found (`ip -j route get`),
//! then its link-layer address (`ip -j neigh show`). When the kernel does not know it
//! yet, one UDP datagram to the discard port makes the kernel resolve it (ARP or NDP);
//! the table is then polled until `timeout`. A backend whose MAC stays unknown is not
//! selectable; status says so.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use serde::Deserialize;
use tokio::process::Command;

/// Why a MAC address could not be found.
#[derive(Debug, thiserror::Error)]
pub enum NeighborError {
    #[error("running `ip {args}` failed")]
    Spawn {
        args: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`ip {args}` failed: {stderr}")]
    Command { args: String, stderr: String },
    #[error("`ip {args}` printed output that is not the expected JSON")]
    Parse {
        args: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{addr} is not reachable through {interface} (route goes through {dev})")]
    WrongInterface {
        addr: IpAddr,
        interface: String,
        dev: String,
    },
    #[error("no ARP/NDP answer from {next_hop} on {interface} within {timeout:?}")]
    Unresolved {
        next_hop: IpAddr,
        interface: String,
        timeout: Duration,
    },
}

#[derive(Deserialize)]
struct Route {
    gateway: Option<IpAddr>,
    dev: Option<String>,
}

#[derive(Deserialize)]
struct Neighbour {
    lladdr: Option<String>,
    #[serde(default)]
    state: Vec<String>,
}

/// Resolves the MAC to put in front of packets for `addr` leaving `interface`.
pub async fn resolve_mac(
    interface: &str,
    addr: IpAddr,
    timeout: Duration,
) -> Result<[u8; 6], NeighborError> {
    let next_hop = next_hop(interface, addr).await?;
    if let Some(mac) = lookup(interface, next_hop).await? {
        return Ok(mac);
    }
    poke(next_hop);
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Some(mac) = lookup(interface, next_hop).await? {
            return Ok(mac);
        }
    }
    Err(NeighborError::Unresolved {
        next_hop,
        interface: interface.to_string(),
        timeout,
    })
}

async fn next_hop(interface: &str, addr: IpAddr) -> Result<IpAddr, NeighborError> {
    let addr_s = addr.to_string();
    let routes: Vec<Route> = ip_json(&["-j", "route", "get", &addr_s]).await?;
    let route = routes.into_iter().next();
    match route {
        Some(Route { gateway, dev }) => {
            let dev = dev.unwrap_or_default();
            if dev != interface && dev != "lo" {
                return Err(NeighborError::WrongInterface {
                    addr,
                    interface: interface.to_string(),
                    dev,
                });
            }
            Ok(gateway.unwrap_or(addr))
        }
        None => Ok(addr),
    }
}

async fn lookup(interface: &str, next_hop: IpAddr) -> Result<Option<[u8; 6]>, NeighborError> {
    let hop = next_hop.to_string();
    let entries: Vec<Neighbour> =
        ip_json(&["-j", "neigh", "show", "to", &hop, "dev", interface]).await?;
    Ok(entries.into_iter().find_map(|n| {
        let usable = !n.state.iter().any(|s| s == "FAILED" || s == "INCOMPLETE");
        n.lladdr.filter(|_| usable).and_then(|l| parse_mac(&l))
    }))
}

/// Sends one datagram so the kernel starts neighbour resolution; errors don't matter.
fn poke(next_hop: IpAddr) {
    let bind: SocketAddr = match next_hop {
        IpAddr::V4(_) => "0.0.0.0:0".parse().expect("literal"),
        IpAddr::V6(_) => "[::]:0".parse().expect("literal"),
    };
    if let Ok(sock) = std::net::UdpSocket::bind(bind) {
        let _ = sock.send_to(&[0], SocketAddr::new(next_hop, 9));
    }
}

async fn ip_json<T: for<'de> Deserialize<'de>>(args: &[&str]) -> Result<Vec<T>, NeighborError> {
    let joined = args.join(" ");
    let out = Command::new("ip")
        .args(args)
        .output()
        .await
        .map_err(|source| NeighborError::Spawn {
            args: joined.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(NeighborError::Command {
            args: joined,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    serde_json::from_slice(&out.stdout).map_err(|source| NeighborError::Parse {
        args: joined,
        source,
    })
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_macs() {
        assert_eq!(
            parse_mac("02:00:0a:4d:00:0b"),
            Some([2, 0, 0x0a, 0x4d, 0, 0x0b])
        );
        assert_eq!(parse_mac("02:00:0a:4d:00"), None);
        assert_eq!(parse_mac("02:00:0a:4d:00:0b:01"), None);
        assert_eq!(parse_mac("zz:00:0a:4d:00:0b"), None);
    }
}
