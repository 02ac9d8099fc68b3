//! MAC resolution for backends through the kernel's routing and neighbour tables, over
//! rtnetlink.
//!
//! For each backend the next hop on the attached interface is found (RTM_GETROUTE for
//! the address, as `ip route get`), then its link-layer address (RTM_GETNEIGH). When
//! the kernel does not know it yet, one UDP datagram to the discard port makes the
//! kernel resolve it (ARP or NDP); the table is then polled until `timeout`. A backend
//! whose MAC stays unknown is not selectable; status says so. While the agent runs,
//! [`watch`] follows the neighbour and route tables so that the MAC lb writes follows
//! the kernel's (docs/neighbours.md).

pub mod decode;
pub mod nexthops;
pub mod rtnl;
pub mod watch;

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use decode::Reach;
use rtnl::Rtnl;

/// Why a MAC address could not be found.
#[derive(Debug, thiserror::Error)]
pub enum NeighbourError {
    #[error("netlink {what} failed: {source}")]
    Netlink {
        what: String,
        #[source]
        source: crate::netlink::NetlinkError,
    },
    #[error("no interface named {0}")]
    NoInterface(String),
    #[error("{addr} is not reachable through {interface} (route goes through interface {oif})")]
    WrongInterface {
        addr: IpAddr,
        interface: String,
        oif: u32,
    },
    #[error("no ARP/NDP answer from {next_hop} on {interface} (neighbour {state})")]
    Unresolved {
        next_hop: IpAddr,
        interface: String,
        state: &'static str,
    },
    #[error("no ARP/NDP answer from {next_hop} on {interface} within {timeout:?}")]
    Timeout {
        next_hop: IpAddr,
        interface: String,
        timeout: Duration,
    },
}

/// Resolves the MAC to put in front of packets for `addr` leaving `interface`.
///
/// Waits (up to `timeout`) only for an address the kernel has no entry for yet: an
/// entry already FAILED is poked (the kernel tries again) and one being resolved
/// (INCOMPLETE) is left to the kernel; both return at once, and the watch reports the
/// address when it comes. So retrying a dead backend never holds the caller.
pub async fn resolve_mac(
    rtnl: &Rtnl,
    interface: &str,
    addr: IpAddr,
    timeout: Duration,
) -> Result<[u8; 6], NeighbourError> {
    let ifindex = rtnl::ifindex(interface)?;
    let next_hop = next_hop(rtnl, interface, ifindex, addr).await?;
    let unresolved = |state: &'static str| NeighbourError::Unresolved {
        next_hop,
        interface: interface.to_string(),
        state,
    };
    match lookup(rtnl, ifindex, next_hop).await? {
        Some(Reach::Usable(mac)) => return Ok(mac),
        Some(Reach::Failed) => {
            poke(next_hop);
            return Err(unresolved("FAILED"));
        }
        Some(Reach::Incomplete) => return Err(unresolved("INCOMPLETE")),
        Some(Reach::Unknown) | None => poke(next_hop),
    }
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        match lookup(rtnl, ifindex, next_hop).await? {
            Some(Reach::Usable(mac)) => return Ok(mac),
            Some(Reach::Failed) => return Err(unresolved("FAILED")),
            _ => {}
        }
    }
    Err(NeighbourError::Timeout {
        next_hop,
        interface: interface.to_string(),
        timeout,
    })
}

async fn next_hop(
    rtnl: &Rtnl,
    interface: &str,
    ifindex: u32,
    addr: IpAddr,
) -> Result<IpAddr, NeighbourError> {
    let route = rtnl.route(addr).await?;
    match route.oif {
        Some(oif) if oif != ifindex && Some(oif) != rtnl::ifindex("lo").ok() => {
            Err(NeighbourError::WrongInterface {
                addr,
                interface: interface.to_string(),
                oif,
            })
        }
        _ => Ok(route.gateway.unwrap_or(addr)),
    }
}

async fn lookup(
    rtnl: &Rtnl,
    ifindex: u32,
    next_hop: IpAddr,
) -> Result<Option<Reach>, NeighbourError> {
    rtnl.neighbour(ifindex, next_hop).await
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
