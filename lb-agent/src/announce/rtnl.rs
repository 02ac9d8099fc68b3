//! The announce interface over rtnetlink: create it (`ifb`), set it up, and add,
//! refresh, delete and list its host addresses with their lifetimes. Each change is a
//! request of [`crate::netlink`], acknowledged or refused with the kernel's errno.

use std::{net::IpAddr, time::Duration};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressFlags, AddressMessage, CacheInfo},
    link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
};

use crate::netlink::{self, NetlinkError};

/// `INFINITY_LIFE_TIME` of the kernel: an address that never expires.
pub const FOREVER: u32 = u32::MAX;

/// A netlink request about the announce interface that failed.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct RtnlError {
    what: String,
    #[source]
    source: NetlinkError,
}

impl RtnlError {
    /// The kernel's errno, when the kernel refused the request.
    pub fn errno(&self) -> Option<i32> {
        self.source.errno()
    }
}

/// One host address on an interface and how long it has left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostAddress {
    pub addr: IpAddr,
    /// Seconds until the kernel removes it; [`FOREVER`] when it never expires.
    pub valid_secs: u32,
}

/// Creates `name` as an `ifb` device.
pub fn create_ifb(name: &str) -> Result<(), RtnlError> {
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(name.to_string()));
    msg.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]));
    request(
        RouteNetlinkMessage::NewLink(msg),
        NLM_F_CREATE | NLM_F_EXCL,
        &format!("creating ifb device {name}"),
    )
    .map(drop)
}

/// Sets the interface with index `index` up.
pub fn set_up(index: u32, name: &str) -> Result<(), RtnlError> {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.header.flags = LinkFlags::Up;
    msg.header.change_mask = LinkFlags::Up;
    request(
        RouteNetlinkMessage::SetLink(msg),
        0,
        &format!("setting {name} up"),
    )
    .map(drop)
}

/// Adds `addr` as a host address (`/32`, `/128`) on interface `index`, or refreshes it
/// when it is there: its lifetime starts again at `lifetime` (`None`: never expires).
pub fn replace_host_address(
    index: u32,
    addr: IpAddr,
    lifetime: Option<Duration>,
) -> Result<(), RtnlError> {
    let mut msg = host_address_message(index, addr);
    let secs = lifetime.map_or(FOREVER, |d| {
        u32::try_from(d.as_secs())
            .unwrap_or(FOREVER - 1)
            .min(FOREVER - 1)
    });
    let mut info = CacheInfo::default();
    info.ifa_valid = secs;
    info.ifa_preferred = secs;
    msg.attributes.push(AddressAttribute::CacheInfo(info));
    if addr.is_ipv6() {
        // A VIP is on every node: duplicate address detection would mark it `dadfailed`.
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    request(
        RouteNetlinkMessage::NewAddress(msg),
        NLM_F_CREATE | NLM_F_REPLACE,
        &format!("adding {addr} to interface {index}"),
    )
    .map(drop)
}

/// Deletes host address `addr` from interface `index` (`EADDRNOTAVAIL` when absent).
pub fn delete_host_address(index: u32, addr: IpAddr) -> Result<(), RtnlError> {
    request(
        RouteNetlinkMessage::DelAddress(host_address_message(index, addr)),
        0,
        &format!("deleting {addr} from interface {index}"),
    )
    .map(drop)
}

/// The host addresses (`/32`, `/128`) on interface `index` with their lifetimes.
pub fn host_addresses(index: u32) -> Result<Vec<HostAddress>, RtnlError> {
    let answers = request(
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        NLM_F_DUMP,
        "listing addresses",
    )?;
    Ok(answers
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewAddress(a) => host_address(&a, index),
            _ => None,
        })
        .collect())
}

fn host_address(msg: &AddressMessage, index: u32) -> Option<HostAddress> {
    if msg.header.index != index {
        return None;
    }
    let mut addr = None;
    let mut valid_secs = FOREVER;
    for attr in &msg.attributes {
        match attr {
            // IPv4 names the address in IFA_LOCAL (IFA_ADDRESS is the peer's on
            // point-to-point links); IPv6 only has IFA_ADDRESS.
            AddressAttribute::Local(a) => addr = Some(*a),
            AddressAttribute::Address(a) if addr.is_none() => addr = Some(*a),
            AddressAttribute::CacheInfo(c) => valid_secs = c.ifa_valid,
            _ => {}
        }
    }
    let addr = addr?;
    let host_len = if addr.is_ipv4() { 32 } else { 128 };
    (msg.header.prefix_len == host_len).then_some(HostAddress { addr, valid_secs })
}

fn host_address_message(index: u32, addr: IpAddr) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.index = index;
    match addr {
        IpAddr::V4(_) => {
            msg.header.family = AddressFamily::Inet;
            msg.header.prefix_len = 32;
            msg.attributes.push(AddressAttribute::Local(addr));
            msg.attributes.push(AddressAttribute::Address(addr));
        }
        IpAddr::V6(_) => {
            msg.header.family = AddressFamily::Inet6;
            msg.header.prefix_len = 128;
            msg.attributes.push(AddressAttribute::Address(addr));
        }
    }
    msg
}

/// Sends `msg` with `flags`; the answers up to the acknowledgement or the end of a dump.
fn request(
    msg: RouteNetlinkMessage,
    flags: u16,
    what: &str,
) -> Result<Vec<RouteNetlinkMessage>, RtnlError> {
    netlink::request(msg, flags).map_err(|source| RtnlError {
        what: what.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_address_is_read_from_local_or_address_and_needs_a_host_prefix() {
        let v4: IpAddr = "10.92.0.100".parse().unwrap();
        let mut msg = host_address_message(7, v4);
        let mut info = CacheInfo::default();
        info.ifa_valid = 42;
        msg.attributes.push(AddressAttribute::CacheInfo(info));
        assert_eq!(
            host_address(&msg, 7),
            Some(HostAddress {
                addr: v4,
                valid_secs: 42
            })
        );
        assert_eq!(host_address(&msg, 8), None, "another interface");
        msg.header.prefix_len = 24;
        assert_eq!(host_address(&msg, 7), None, "not a host address");

        let v6: IpAddr = "2001:db8::100".parse().unwrap();
        let msg = host_address_message(7, v6);
        assert_eq!(
            host_address(&msg, 7),
            Some(HostAddress {
                addr: v6,
                valid_secs: FOREVER
            })
        );
    }
}
