//! The address in a received packet's socket name, read by the reply receiver
//! (`wire.rs`) and the ICMP error queue reader (`icmp.rs`): the room below both.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The address in a received packet's name: its sender (or, for a queued ICMP error,
/// the destination of the packet it quotes).
pub(super) fn source_of(name: &libc::sockaddr_storage) -> Option<IpAddr> {
    match i32::from(name.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in; storage is large enough.
            let a = unsafe { &*(name as *const _ as *const libc::sockaddr_in) };
            Some(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)).into())
        }
        libc::AF_INET6 => {
            // SAFETY: as above, a sockaddr_in6.
            let a = unsafe { &*(name as *const _ as *const libc::sockaddr_in6) };
            Some(Ipv6Addr::from(a.sin6_addr.s6_addr).into())
        }
        _ => None,
    }
}
