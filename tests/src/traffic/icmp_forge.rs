//! Hand-built ICMP errors sent from inside a namespace through a raw IPv4 socket
//! (`IPPROTO_RAW`: the caller writes the whole IP header, any source address), for
//! scenarios where a host forges errors about other hosts' flows.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    os::fd::AsRawFd,
    time::Duration,
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{
    net::netns::NetNs,
    traffic::{
        inject::{FULL_QUEUE_BUDGET, FULL_QUEUE_PAUSE},
        packet::{Frame, TCP_SYN},
    },
    util::error::Error,
};

/// `IPPROTO_RAW`: sending implies `IP_HDRINCL`.
const IPPROTO_RAW: i32 = 255;

/// An IPv4 port unreachable from `src` to `dst` quoting a TCP SYN (`tcp`) or a UDP
/// datagram `quoted_src:sport -> quoted_dst:dport`: the IP packet, checksums filled in.
pub fn port_unreachable_v4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    tcp: bool,
    (quoted_src, sport): (Ipv4Addr, u16),
    (quoted_dst, dport): (Ipv4Addr, u16),
) -> Vec<u8> {
    let (qs, qd) = (IpAddr::V4(quoted_src), IpAddr::V4(quoted_dst));
    let quote = if tcp {
        Frame::tcp(qs, sport, qd, dport, TCP_SYN)
    } else {
        Frame::udp(qs, sport, qd, dport).payload(b"q")
    };
    Frame::icmp(IpAddr::V4(src), IpAddr::V4(dst), 3, 3)
        .payload(&quote.ip_bytes())
        .ip_bytes()
}

/// Sends every packet of `packets` (whole IPv4 packets) from inside `ns`; returns how
/// many were sent, or an error if the kernel lost any of them on the way out.
///
/// A burst of tens of thousands outruns the receiving end of a veth pair whose peer runs
/// XDP (its ring holds 256 frames). So the caller gives the sending interface a queue
/// ([`NetNs::hold_bursts`]) that the veth pushes back on instead of dropping; a packet
/// the full queue refuses (`ENOBUFS`, reported because the socket sets `IP_RECVERR`) is
/// sent again after a short pause, for at most `FULL_QUEUE_BUDGET` per call. What the
/// interfaces still dropped (their transmit drop counters, read before and after) is an
/// error: a scenario that counts what arrived must not run on a silently short sweep.
pub fn send_raw_v4(ns: &NetNs, packets: &[Vec<u8>]) -> Result<io::Result<usize>, Error> {
    ns.run(|| {
        let dropped_before = tx_dropped()?;
        let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_RAW)))?;
        recv_err(&socket)?;
        let mut sent = 0;
        let mut waited = Duration::ZERO;
        for p in packets {
            let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
            let to = SockAddr::from(SocketAddr::new(IpAddr::V4(dst), 0));
            loop {
                match socket.send_to(p, &to) {
                    Ok(_) => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::ENOBUFS)
                            && waited < FULL_QUEUE_BUDGET =>
                    {
                        std::thread::sleep(FULL_QUEUE_PAUSE);
                        waited += FULL_QUEUE_PAUSE;
                    }
                    Err(e) => return Err(e),
                }
            }
            sent += 1;
        }
        let dropped = tx_dropped()? - dropped_before;
        if dropped > 0 {
            return Err(io::Error::other(format!(
                "the namespace's interfaces dropped {dropped} of {sent} packets after the \
                 socket took them (a full transmit path without a queue to push back on)"
            )));
        }
        Ok(sent)
    })
}

/// Sets `IP_RECVERR`: without it a raw socket hides a packet its interface's full queue
/// refused (`ENOBUFS`) and reports it sent.
fn recv_err(socket: &Socket) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: an int option on our own socket; `on` lives across the call.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_IP,
            libc::IP_RECVERR,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The transmit drops of every interface of the calling thread's network namespace
/// (`/proc/thread-self/net/dev`, whose 12th figure after the name is `drop` of the
/// transmit side).
fn tx_dropped() -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/net/dev")?;
    let mut total = 0;
    for line in text.lines().skip(2) {
        let Some((_, figures)) = line.split_once(':') else {
            continue;
        };
        let drop = figures
            .split_whitespace()
            .nth(11)
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| io::Error::other(format!("unexpected /proc/net/dev line {line:?}")))?;
        total += drop;
    }
    Ok(total)
}
