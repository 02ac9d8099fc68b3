//! The SYN check's source ports: claimed from the kernel by binding ordinary TCP sockets
//! to them without listening. The kernel then never hands them to another socket, and
//! answers our targets' SYN-ACKs on them with the RST that closes the half-open
//! connection on the target (no socket there to accept it).

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// Source ports claimed: probes of one target at the same time need distinct ports, and
/// a probe should rarely reuse the port of an earlier probe of the same target whose
/// half-open request the target may still hold (our RST to its SYN-ACK lost or not there
/// yet): the new SYN then falls outside that request's window, the target answers with a
/// bare ACK our filter drops, and the probe times out against a working target. With 16
/// ports that costs 0.03–0.16 % of the probes at 50,000 targets a second (272–1,646 per
/// 20 s window); with 240, 0–66. The reply filter checks them one by one
/// ([`super::filter`]: fewer than 250).
pub(super) const PORTS: usize = 240;

/// The claimed ports and the sockets that hold them (closing them frees the ports).
pub(super) struct Claimed {
    pub ports: Vec<u16>,
    _holders: Vec<Socket>,
}

/// Claims [`PORTS`] ports from the ephemeral range, for IPv4 and IPv6 at once where the
/// host has IPv6 (a dual-stack socket on `[::]`), else for IPv4.
pub(super) fn claim() -> io::Result<Claimed> {
    let mut ports = Vec::with_capacity(PORTS);
    let mut holders = Vec::with_capacity(PORTS);
    for _ in 0..PORTS {
        let sock = match dual_stack() {
            Ok(s) => s,
            Err(_) => {
                let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
                s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into())?;
                s
            }
        };
        let port = sock
            .local_addr()?
            .as_socket()
            .map(|a| a.port())
            .ok_or_else(|| io::Error::other("bound socket without an address"))?;
        ports.push(port);
        holders.push(sock);
    }
    Ok(Claimed {
        ports,
        _holders: holders,
    })
}

fn dual_stack() -> io::Result<Socket> {
    let s = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
    s.set_only_v6(false)?;
    s.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)).into())?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimed_ports_are_distinct_and_not_reusable() {
        let c = claim().unwrap();
        let mut sorted = c.ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), PORTS);
        let other = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        let taken = SocketAddr::from((Ipv4Addr::LOCALHOST, c.ports[0]));
        assert!(other.bind(&taken.into()).is_err(), "the port is ours");
    }
}
