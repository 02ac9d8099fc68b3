//! Where the other end of a link is (`RTM_GETLINK`: `IFLA_LINK`, `IFLA_LINK_NETNSID`):
//! for a veth, its peer, which lives in this network namespace or in another one.

use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkMessage},
};

use super::{NetlinkError, request};

/// The other end of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkPeer {
    /// The link names none (not a veth, or a device of its own).
    None,
    /// In this network namespace, with this index.
    Here(u32),
    /// In another network namespace (its index there is of no use here).
    Elsewhere,
}

/// The other end of interface `ifindex`.
pub fn query_link_peer(ifindex: u32) -> Result<LinkPeer, NetlinkError> {
    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    let answers = request(RouteNetlinkMessage::GetLink(msg), 0)?;
    let link = answers
        .iter()
        .find_map(|m| match m {
            RouteNetlinkMessage::NewLink(link) => Some(link),
            _ => None,
        })
        .ok_or_else(|| NetlinkError::Decode("no RTM_NEWLINK answer to RTM_GETLINK".into()))?;
    // The kernel names the other end's index only when it differs from this link's own
    // (`IFLA_LINK`), which a peer in another namespace may well share; the namespace it
    // names apart (`IFLA_LINK_NETNSID`).
    let mut peer = None;
    let mut elsewhere = false;
    for attr in &link.attributes {
        match attr {
            LinkAttribute::Link(index) if *index != 0 => peer = Some(*index),
            LinkAttribute::LinkNetNsId(_) => elsewhere = true,
            _ => {}
        }
    }
    Ok(match (peer, elsewhere) {
        (_, true) => LinkPeer::Elsewhere,
        (Some(index), false) if index != ifindex => LinkPeer::Here(index),
        _ => LinkPeer::None,
    })
}
