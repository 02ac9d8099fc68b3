//! Local faults: probe errors caused by the agent's own host — out of descriptors,
//! buffers, memory or source ports, no route to the target, or a probe whose timeout the
//! agent cannot tell apart from its own lateness. They say nothing about the server, so
//! they count neither for nor against it (docs/local-faults.md).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

/// The least lateness a probe's timer is allowed before its timeout stops being the
/// server's ([`on_time_slack`]): the timer's millisecond ticks and ordinary scheduling.
pub const ON_TIME_MIN: Duration = Duration::from_millis(20);

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

/// How late a probe's timer may fire and its timeout still be the server's: 1/20 of the
/// timeout, at least [`ON_TIME_MIN`] (50 ms for a 1 s timeout, 25 ms for 500 ms).
pub fn on_time_slack(timeout: Duration) -> Duration {
    ON_TIME_MIN.max(timeout / 20)
}

/// The rule for probes judged by the agent's timer (connect, http, https, udp): a
/// timeout that fired `late` after it was due is the server's only if the agent was on
/// time (`late` within [`on_time_slack`]); later, the agent cannot tell whether the
/// server or its own lateness (a request sent late, a reply not read) made the probe
/// miss, and it is a local fault — `Some` with its detail.
pub(crate) fn late_timeout(timeout: Duration, late: Duration) -> Option<String> {
    (late > on_time_slack(timeout)).then(|| {
        format!(
            "local fault: timeout fired {late:?} late (agent late by more than its {:?} \
             slack: the timeout cannot be told from the agent's own lateness)",
            on_time_slack(timeout)
        )
    })
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
    fn a_timeout_is_the_servers_only_when_the_timer_was_on_time() {
        let ms = Duration::from_millis;
        assert_eq!(on_time_slack(ms(1000)), ms(50));
        assert_eq!(on_time_slack(ms(500)), ms(25));
        assert_eq!(on_time_slack(ms(100)), ON_TIME_MIN);
        assert!(late_timeout(ms(1000), ms(0)).is_none());
        assert!(late_timeout(ms(1000), ms(50)).is_none());
        // Any lateness past the slack, not only a starved agent's half second.
        for late in [ms(51), ms(120), ms(574), ms(698), ms(5000)] {
            let detail = late_timeout(ms(1000), late).expect("late: no verdict");
            assert!(detail.starts_with("local fault:"), "{detail}");
        }
        assert!(late_timeout(ms(500), ms(26)).is_some());
    }
}
