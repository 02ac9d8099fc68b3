//! Local faults: probe errors caused by the agent's own host — out of descriptors,
//! buffers, memory or source ports, no route to the target, or a runtime so starved that
//! the probe's timer fired far too late. They say nothing about the server, so they
//! count neither for nor against it (docs/local-faults.md).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

/// A timeout that fires at least this much after it was due (or half the timeout, if
/// longer) means the agent did not get the CPU: the probe's verdict is not the server's.
pub const STARVED_MIN_LATE: Duration = Duration::from_millis(500);

/// Why `err`, met while probing `target`, is a local fault; `None` when it may be the
/// server's (or the network's) doing.
pub(crate) fn cause(err: &io::Error, target: SocketAddr) -> Option<String> {
    let errno = err.raw_os_error()?;
    let what = match errno {
        libc::EMFILE => "out of file descriptors (EMFILE)",
        libc::ENFILE => "system file table full (ENFILE)",
        libc::ENOBUFS => "no buffer space (ENOBUFS)",
        libc::ENOMEM => "out of memory (ENOMEM)",
        libc::EADDRNOTAVAIL => "no local address or port available (EADDRNOTAVAIL)",
        // Unreachable may be a router's ICMP about the server; only a failing local
        // route lookup makes it ours.
        libc::ENETUNREACH | libc::EHOSTUNREACH if !has_route(target) => {
            "no local route to the target"
        }
        _ => return None,
    };
    Some(format!("local fault: {what}"))
}

/// Whether the kernel has a route to `target`: connecting a UDP socket looks the route
/// up without sending anything. A socket that cannot even be opened says nothing.
fn has_route(target: SocketAddr) -> bool {
    let local: SocketAddr = match target.ip() {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let Ok(sock) = UdpSocket::bind(local) else {
        return true;
    };
    match sock.connect(target) {
        Ok(()) => true,
        Err(e) => !matches!(
            e.raw_os_error(),
            Some(libc::ENETUNREACH | libc::EHOSTUNREACH)
        ),
    }
}

/// Whether a timeout of `timeout` that fired `late` after it was due shows a starved agent.
pub(crate) fn starved(timeout: Duration, late: Duration) -> bool {
    late >= STARVED_MIN_LATE.max(timeout / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_errors_are_local() {
        let t: SocketAddr = "127.0.0.1:80".parse().unwrap();
        for errno in [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOBUFS,
            libc::ENOMEM,
            libc::EADDRNOTAVAIL,
        ] {
            assert!(
                cause(&io::Error::from_raw_os_error(errno), t).is_some(),
                "errno {errno}"
            );
        }
        for errno in [libc::ECONNREFUSED, libc::ECONNRESET, libc::ETIMEDOUT] {
            assert!(
                cause(&io::Error::from_raw_os_error(errno), t).is_none(),
                "errno {errno} is the server's"
            );
        }
        assert!(cause(&io::Error::other("x"), t).is_none());
    }

    #[test]
    fn unreachable_is_local_only_without_a_route() {
        let err = io::Error::from_raw_os_error(libc::EHOSTUNREACH);
        assert!(
            cause(&err, "127.0.0.1:80".parse().unwrap()).is_none(),
            "loopback has a route: unreachable came from the network"
        );
    }

    #[test]
    fn starvation_needs_a_timer_far_behind() {
        let s = Duration::from_secs;
        assert!(!starved(s(1), Duration::from_millis(20)));
        assert!(starved(s(1), Duration::from_millis(600)));
        assert!(
            !starved(s(4), Duration::from_millis(1500)),
            "half the timeout"
        );
        assert!(starved(s(4), s(2)));
    }
}
