//! The agent's one netlink stack, on `netlink-packet-route`, `netlink-packet-core` and
//! `netlink-sys` (with `rtnetlink`'s connection for the async requests): it owns every
//! netlink socket the agent opens.
//!
//! - [`request()`]: one synchronous rtnetlink request on a socket of its own, up to its
//!   acknowledgement or the end of its dump;
//! - [`generic`]: the same for generic netlink, and a family's id by its name;
//! - [`Connection`]: the same requests from async code, over one shared connection;
//! - [`Subscription`]: a socket in multicast groups, for the watches of links,
//!   neighbours and routes;
//! - [`xdp`]: which XDP program an interface runs, and attaching, replacing or removing it;
//! - [`query_xdp_features`]: what XDP the interface's driver offers (netdev family);
//! - [`query_link_peer`]: where a veth's peer is.
//!
//! A request the kernel refuses is a [`NetlinkError`] with its errno and, when the
//! kernel gave one, its extended-ack message (`NETLINK_EXT_ACK`).

mod connection;
mod error;
pub mod generic;
mod link_peer;
mod reply;
mod request;
mod subscription;
pub mod xdp;
mod xdp_features;

pub use connection::Connection;
pub use error::NetlinkError;
pub use link_peer::{LinkPeer, query_link_peer};
pub use request::request;
pub use subscription::{
    RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE, RTNLGRP_LINK, RTNLGRP_NEIGH, Ready, Subscription,
};
pub use xdp::{XdpAttached, XdpProgram, query_xdp, set_xdp};
pub use xdp_features::{XdpFeatures, query_xdp_features};

/// The index of interface `name` in this network namespace; `None` when there is none.
pub fn link_index(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}
