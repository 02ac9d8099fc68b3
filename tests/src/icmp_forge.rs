//! Hand-built ICMP errors sent from inside a namespace through a raw IPv4 socket
//! (`IPPROTO_RAW`: the caller writes the whole IP header, any source address), for
//! scenarios where a host forges errors about other hosts' flows.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{
    netns::{NetNs, NetnsError},
    packet::{Frame, TCP_SYN},
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
/// many the kernel accepted (a full socket buffer drops some: counted, not retried).
pub fn send_raw_v4(ns: &NetNs, packets: &[Vec<u8>]) -> Result<io::Result<usize>, NetnsError> {
    ns.run(|| {
        let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_RAW)))?;
        let mut sent = 0;
        for p in packets {
            let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
            let to = SockAddr::from(SocketAddr::new(IpAddr::V4(dst), 0));
            if socket.send_to(p, &to).is_ok() {
                sent += 1;
            }
        }
        Ok(sent)
    })
}
