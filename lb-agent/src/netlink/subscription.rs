//! Multicast subscriptions: a non-blocking rtnetlink socket in some groups, read from
//! tokio: once readable, everything queued is read in place, with lost events (`ENOBUFS`)
//! reported.

use std::io;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use super::NetlinkError;

/// Link changes (`RTNLGRP_LINK`).
pub const RTNLGRP_LINK: u32 = 1;
/// Neighbour table changes (`RTNLGRP_NEIGH`).
pub const RTNLGRP_NEIGH: u32 = 3;
/// IPv4 route changes (`RTNLGRP_IPV4_ROUTE`).
pub const RTNLGRP_IPV4_ROUTE: u32 = 7;
/// IPv6 route changes (`RTNLGRP_IPV6_ROUTE`).
pub const RTNLGRP_IPV6_ROUTE: u32 = 11;

/// Room for one datagram (the kernel's notifications are far smaller).
const DATAGRAM: usize = 1 << 16;

/// A socket in multicast groups, registered with the tokio runtime.
pub struct Subscription {
    socket: AsyncFd<Socket>,
    buf: Vec<u8>,
}

/// A subscription whose socket has datagrams queued.
pub struct Ready<'a> {
    guard: AsyncFdReadyGuard<'a, Socket>,
    buf: &'a mut Vec<u8>,
}

impl Subscription {
    /// Joins `groups`; with `rcvbuf`, asks for a receive buffer of that many bytes (the
    /// kernel caps it at `net.core.rmem_max` without CAP_NET_ADMIN). Must be called
    /// inside a tokio runtime.
    pub fn open(groups: &[u32], rcvbuf: Option<usize>) -> Result<Self, NetlinkError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        socket
            .bind(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Socket)?;
        for &group in groups {
            socket.add_membership(group).map_err(NetlinkError::Socket)?;
        }
        if let Some(bytes) = rcvbuf {
            // A smaller buffer only makes overflows (and their resyncs) likelier.
            let _ = socket.set_rx_buf_sz(bytes);
        }
        socket
            .set_non_blocking(true)
            .map_err(NetlinkError::Socket)?;
        // SAFETY: the socket owns its descriptor and `AsyncFd` owns the socket: the
        // descriptor stays open and the same until the `AsyncFd` is dropped.
        let socket = unsafe { AsyncFd::register(socket) }
            .map_err(|e| NetlinkError::Socket(io::Error::from(e)))?;
        Ok(Self {
            socket,
            buf: Vec::with_capacity(DATAGRAM),
        })
    }

    /// Waits until the socket is readable. Cancel-safe: nothing is read before the wait
    /// ends. An error means the socket failed.
    pub async fn ready(&mut self) -> Result<Ready<'_>, NetlinkError> {
        let Subscription { socket, buf } = self;
        let guard = socket.readable().await.map_err(NetlinkError::Socket)?;
        Ok(Ready { guard, buf })
    }
}

impl Ready<'_> {
    /// Reads every datagram queued, handing each to `each` in the subscription's one
    /// buffer. `true` when events were lost (`ENOBUFS`: the receive buffer overflowed)
    /// and the state they describe has to be read again. An error means the socket
    /// failed.
    pub fn read_all(self, mut each: impl FnMut(&[u8])) -> Result<bool, NetlinkError> {
        let Ready { mut guard, buf } = self;
        let mut overflow = false;
        loop {
            buf.clear();
            match guard.try_io(|s| s.get_ref().recv(&mut *buf, 0)) {
                Ok(Ok(_)) => each(buf),
                Ok(Err(err)) if err.raw_os_error() == Some(libc::ENOBUFS) => overflow = true,
                Ok(Err(err)) => return Err(NetlinkError::Socket(err)),
                Err(_would_block) => return Ok(overflow),
            }
        }
    }
}
