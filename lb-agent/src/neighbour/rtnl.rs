//! Requests to the kernel over rtnetlink: the route lookup for one destination
//! (RTM_GETROUTE with the destination, what `ip route get` does), one neighbour entry
//! (RTM_GETNEIGH for one address) and the neighbour table of one interface
//! (RTM_GETNEIGH dump).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage},
};
use rtnetlink::RouteMessageBuilder;

use super::{
    NeighbourError,
    decode::{NeighEntry, Reach, RouteHop, neigh_entry, route_hop},
};
use crate::netlink::{self, Connection, NetlinkError};

/// An rtnetlink connection (its task runs on the current tokio runtime).
#[derive(Clone)]
pub struct Rtnl {
    connection: Connection,
}

impl Rtnl {
    /// Opens the connection; must be called inside a tokio runtime.
    pub fn new() -> Result<Self, NeighbourError> {
        let connection = Connection::open().map_err(failed("connection"))?;
        Ok(Self { connection })
    }

    /// The kernel's route for `addr`: its gateway (if any) and outgoing interface.
    pub async fn route(&self, addr: IpAddr) -> Result<RouteHop, NeighbourError> {
        let answers = self
            .connection
            .request(route_get(addr), 0)
            .await
            .map_err(failed(&format!("route get {addr}")))?;
        Ok(hop_of(&answers))
    }

    /// The kernel's entry for `addr` on interface `ifindex` (RTM_GETNEIGH for that one
    /// address, no dump); `None`: no entry.
    pub async fn neighbour(
        &self,
        ifindex: u32,
        addr: IpAddr,
    ) -> Result<Option<Reach>, NeighbourError> {
        let mut msg = NeighbourMessage::default();
        msg.header.ifindex = ifindex;
        let (family, dst) = match addr {
            IpAddr::V4(a) => (AddressFamily::Inet, NeighbourAddress::Inet(a)),
            IpAddr::V6(a) => (AddressFamily::Inet6, NeighbourAddress::Inet6(a)),
        };
        msg.header.family = family;
        msg.attributes.push(NeighbourAttribute::Destination(dst));
        let answers = match self
            .connection
            .request(RouteNetlinkMessage::GetNeighbour(msg), 0)
            .await
        {
            Err(err) if err.errno() == Some(libc::ENOENT) => return Ok(None),
            answers => answers.map_err(failed(&format!("neighbour get {addr}")))?,
        };
        Ok(answers.iter().find_map(|m| match m {
            RouteNetlinkMessage::NewNeighbour(n) => neigh_entry(n).map(|e| e.reach),
            _ => None,
        }))
    }

    /// Every IPv4 and IPv6 neighbour entry on interface `ifindex`.
    pub async fn neighbours(&self, ifindex: u32) -> Result<Vec<NeighEntry>, NeighbourError> {
        let mut entries = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut msg = NeighbourMessage::default();
            msg.header.family = family;
            let answers = self
                .connection
                .request(RouteNetlinkMessage::GetNeighbour(msg), NLM_F_DUMP)
                .await
                .map_err(failed("neighbour dump"))?;
            entries.extend(answers.iter().filter_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n) => {
                    neigh_entry(n).filter(|e| e.ifindex == ifindex)
                }
                _ => None,
            }));
        }
        Ok(entries)
    }
}

/// [`Rtnl::route`] from synchronous code, on a netlink socket of its own.
pub fn route(addr: IpAddr) -> Result<RouteHop, NeighbourError> {
    let answers =
        netlink::request(route_get(addr), 0).map_err(failed(&format!("route get {addr}")))?;
    Ok(hop_of(&answers))
}

/// RTM_GETROUTE for the one destination `addr` (what `ip route get` sends).
fn route_get(addr: IpAddr) -> RouteNetlinkMessage {
    let msg = match addr {
        IpAddr::V4(a) => RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(a, 32)
            .build(),
        IpAddr::V6(a) => RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(a, 128)
            .build(),
    };
    RouteNetlinkMessage::GetRoute(msg)
}

/// The hop of the route in the answer to [`route_get`].
fn hop_of(answers: &[RouteNetlinkMessage]) -> RouteHop {
    answers
        .iter()
        .find_map(|m| match m {
            RouteNetlinkMessage::NewRoute(route) => Some(route_hop(route)),
            _ => None,
        })
        .unwrap_or_default()
}

/// The index of interface `name`.
pub fn ifindex(name: &str) -> Result<u32, NeighbourError> {
    netlink::link_index(name).ok_or_else(|| NeighbourError::NoInterface(name.into()))
}

/// Names the request a netlink failure belongs to.
fn failed(what: &str) -> impl FnOnce(NetlinkError) -> NeighbourError + '_ {
    move |source| NeighbourError::Netlink {
        what: what.to_string(),
        source,
    }
}
