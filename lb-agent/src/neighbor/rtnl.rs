//! Requests to the kernel over rtnetlink: the route lookup for one destination
//! (RTM_GETROUTE with the destination, what `ip route get` does) and the neighbour
//! table of one interface (RTM_GETNEIGH dump).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures_util::{StreamExt, TryStreamExt};
use rtnetlink::{
    Handle, RouteMessageBuilder,
    packet_core::{NLM_F_REQUEST, NetlinkMessage, NetlinkPayload},
    packet_route::{
        AddressFamily, RouteNetlinkMessage,
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage},
    },
};

use super::{
    NeighborError,
    decode::{NeighEntry, Reach, RouteHop, neigh_entry, route_hop},
};

/// An rtnetlink connection (its task runs on the current tokio runtime).
#[derive(Clone)]
pub struct Rtnl {
    handle: Handle,
}

impl Rtnl {
    /// Opens the connection; must be called inside a tokio runtime.
    pub fn new() -> Result<Self, NeighborError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(NeighborError::Socket)?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// The kernel's route for `addr`: its gateway (if any) and outgoing interface.
    pub async fn route(&self, addr: IpAddr) -> Result<RouteHop, NeighborError> {
        let msg = match addr {
            IpAddr::V4(a) => RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(a, 32)
                .build(),
            IpAddr::V6(a) => RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(a, 128)
                .build(),
        };
        let mut answers = self.handle.route().get(msg).execute();
        let first = answers
            .try_next()
            .await
            .map_err(|e| NeighborError::Netlink {
                what: format!("route get {addr}"),
                message: e.to_string(),
            })?;
        Ok(first.as_ref().map(route_hop).unwrap_or_default())
    }

    /// The kernel's entry for `addr` on interface `ifindex` (RTM_GETNEIGH for that one
    /// address, no dump); `None`: no entry.
    pub async fn neighbour(
        &self,
        ifindex: u32,
        addr: IpAddr,
    ) -> Result<Option<Reach>, NeighborError> {
        let failed = |message: String| NeighborError::Netlink {
            what: format!("neighbour get {addr}"),
            message,
        };
        let mut msg = NeighbourMessage::default();
        msg.header.ifindex = ifindex;
        let (family, dst) = match addr {
            IpAddr::V4(a) => (AddressFamily::Inet, NeighbourAddress::Inet(a)),
            IpAddr::V6(a) => (AddressFamily::Inet6, NeighbourAddress::Inet6(a)),
        };
        msg.header.family = family;
        msg.attributes.push(NeighbourAttribute::Destination(dst));
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetNeighbour(msg));
        req.header.flags = NLM_F_REQUEST;
        let mut answers = self
            .handle
            .clone()
            .request(req)
            .map_err(|e| failed(e.to_string()))?;
        while let Some(answer) = answers.next().await {
            match answer.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(n)) => {
                    return Ok(neigh_entry(&n).map(|e| e.reach));
                }
                NetlinkPayload::Error(e) if e.raw_code() == -libc::ENOENT => return Ok(None),
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    return Err(failed(e.to_io().to_string()));
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Every IPv4 and IPv6 neighbour entry on interface `ifindex`.
    pub async fn neighbours(&self, ifindex: u32) -> Result<Vec<NeighEntry>, NeighborError> {
        let mut entries = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut dump = self
                .handle
                .neighbours()
                .get()
                .set_address_family(family)
                .execute();
            loop {
                let next: Option<NeighbourMessage> =
                    dump.try_next().await.map_err(|e| NeighborError::Netlink {
                        what: "neighbour dump".into(),
                        message: e.to_string(),
                    })?;
                let Some(msg) = next else { break };
                if let Some(e) = neigh_entry(&msg).filter(|e| e.ifindex == ifindex) {
                    entries.push(e);
                }
            }
        }
        Ok(entries)
    }
}

/// The index of interface `name`.
pub fn ifindex(name: &str) -> Result<u32, NeighborError> {
    let c = std::ffi::CString::new(name).map_err(|_| NeighborError::NoInterface(name.into()))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(NeighborError::NoInterface(name.into())),
        i => Ok(i),
    }
}
