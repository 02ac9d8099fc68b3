//! When to check that the interface still runs the agent's program: on every rtnetlink
//! link notification (`RTMGRP_LINK`; an XDP change through netlink sends one) and at
//! least once per period (a change that sends none, or a lost notification).

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use tokio::{io::unix::AsyncFd, time::Interval};

const RTMGRP_LINK: u32 = 1;

/// Resolves [`LinkWatch::due`] on a link notification or when the period ends.
pub struct LinkWatch {
    every: Interval,
    events: Option<AsyncFd<OwnedFd>>,
}

impl LinkWatch {
    /// Needs a tokio runtime. Without a notification socket (it could not be opened:
    /// logged) it falls back to the period alone.
    pub fn new(every: Duration) -> Self {
        let events = subscribe().and_then(|fd| {
            // SAFETY: the AsyncFd owns the descriptor, which stays open and unchanged
            // for as long as it is registered.
            unsafe { AsyncFd::register(fd) }.map_err(|e| e.into())
        });
        if let Err(err) = &events {
            tracing::warn!(error = %err, "no link notifications; checking the XDP attachment every {every:?} only");
        }
        let mut every = tokio::time::interval(every);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        LinkWatch {
            every,
            events: events.ok(),
        }
    }

    /// Waits until a check is due. Cancel-safe.
    pub async fn due(&mut self) {
        let LinkWatch { every, events } = self;
        let Some(fd) = events else {
            every.tick().await;
            return;
        };
        tokio::select! {
            _ = every.tick() => {}
            guard = fd.readable() => {
                if let Ok(mut guard) = guard {
                    drain(guard.get_inner());
                    guard.clear_ready();
                }
            }
        }
    }
}

/// A non-blocking rtnetlink socket subscribed to link notifications.
fn subscribe() -> io::Result<OwnedFd> {
    // SAFETY: plain socket call; the result is checked.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: zeroed sockaddr_nl, then the fields bind needs.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr.nl_groups = RTMGRP_LINK;
    // SAFETY: the address is valid for the call.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Reads and drops every queued notification (their content does not matter: the
/// check reads the interface's state itself).
fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 8192];
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            // EAGAIN: empty; ENOBUFS: overrun, which a check covers as well.
            let err = io::Error::last_os_error();
            if n < 0 && err.raw_os_error() == Some(libc::ENOBUFS) {
                continue;
            }
            return;
        }
    }
}
