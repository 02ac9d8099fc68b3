//! The icmp probe of a tunnel service (`ipip`, `gue`): the echo request travels the way
//! client packets do — encapsulated toward the server, addressed to the VIP — so a
//! server whose decapsulation is broken (no `lb_decap`, no ipip device, a filter on the
//! outer protocol) fails it while a direct probe would pass (docs/tunnel.md, "Health").
//!
//! The inner packet is an ICMP (v4) or ICMPv6 echo request from this host's address
//! toward the server to the VIP; it is sent through a raw socket of protocol 4 / 41
//! (the kernel adds the outer IP header) or, for GUE, as the payload of a UDP datagram
//! to port 6080. The server, holding the VIP, answers from it directly to this host;
//! the reply is read from a raw ICMP socket, matched by its source (the VIP),
//! identifier and sequence number. The inner family must be the server's
//! (an IPv4 VIP with IPv6 servers is probed directly). Needs `CAP_NET_RAW`.

use std::io::{self, ErrorKind};
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

use super::{Passed, ProbeError};
use crate::config::TunnelProbe;

const ECHO_REQUEST_V4: u8 = 8;
const ECHO_REPLY_V4: u8 = 0;
const ECHO_REQUEST_V6: u8 = 128;
const ECHO_REPLY_V6: u8 = 129;
const PAYLOAD: &[u8] = b"lb-agent tunnel probe";
/// Protocol numbers of an IPv4 / IPv6 packet inside IP.
const IPPROTO_IPIP: i32 = 4;
const IPPROTO_IPV6: i32 = 41;
/// GUE's port (`lb_common::maps::GUE_PORT`).
const GUE_PORT: u16 = lb_common::maps::GUE_PORT;

/// Sequence numbers unique across the process: every raw socket sees every reply.
static SEQ: AtomicU16 = AtomicU16::new(0);

/// One encapsulated echo request to `t.vip` through `server`; passes on the matching
/// reply within `timeout`.
pub(super) async fn probe(
    t: TunnelProbe,
    server: IpAddr,
    timeout: Duration,
) -> Result<Passed, ProbeError> {
    let start = Instant::now();
    let v4 = t.vip.is_ipv4();
    // The address this host sends from toward the server: the inner source, to which
    // the server's reply comes back.
    let src = local_toward(server).map_err(icmp_error)?;
    let id = std::process::id() as u16;
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let inner = echo_packet(src, t.vip, id, seq);
    let replies = open_replies(t.vip).map_err(icmp_error)?;
    send(t, server, &inner).map_err(icmp_error)?;
    let deadline = start + timeout;
    let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
    loop {
        let ready = tokio::time::timeout_at(deadline, replies.readable()).await;
        let Ok(ready) = ready else {
            return Err(ProbeError::TimedOut);
        };
        let mut guard = ready.map_err(icmp_error)?;
        match guard.try_io(|s| s.get_ref().recv_from(&mut buf)) {
            Ok(Ok((n, from))) => {
                // SAFETY: recv_from initialised the first n bytes.
                let got: &[u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), n) };
                let from_vip = from.as_socket().is_some_and(|a| a.ip() == t.vip);
                if from_vip && is_reply(got, v4, id, seq) {
                    let rtt = start.elapsed();
                    return Ok(Passed {
                        detail: format!(
                            "echo reply from {} through the tunnel in {:.1} ms",
                            t.vip,
                            rtt.as_secs_f64() * 1e3
                        ),
                        rtt: Some(rtt),
                    });
                }
            }
            Ok(Err(e)) if e.kind() == ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(icmp_error(e)),
            Err(_would_block) => {}
        }
    }
}

fn icmp_error(source: io::Error) -> ProbeError {
    ProbeError::Icmp { source }
}

/// This host's address toward `server` (the route's source), as a connected UDP
/// socket reports it; no packet is sent.
fn local_toward(server: IpAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let s = UdpSocket::bind(any)?;
    s.connect(SocketAddr::new(server, GUE_PORT))?;
    Ok(s.local_addr()?.ip())
}

/// A raw ICMP socket of `vip`'s family, non-blocking, in the runtime. Not connected:
/// this host may have no route to the VIP (the balancer need not), and the reply's
/// source is checked as it is read.
fn open_replies(vip: IpAddr) -> io::Result<AsyncFd<Socket>> {
    let (domain, proto) = if vip.is_ipv4() {
        (Domain::IPV4, Protocol::ICMPV4)
    } else {
        (Domain::IPV6, Protocol::ICMPV6)
    };
    let s = Socket::new(domain, Type::RAW, Some(proto))?;
    s.set_nonblocking(true)?;
    // SAFETY: the socket is owned by the AsyncFd for its whole life, and closed only
    // when the AsyncFd drops (deregistered first).
    unsafe { AsyncFd::register(s) }.map_err(io::Error::from)
}

/// Sends `inner` to `server`: in a raw IP-in-IP socket, or in a UDP datagram to GUE's
/// port.
fn send(t: TunnelProbe, server: IpAddr, inner: &[u8]) -> io::Result<()> {
    let to = SocketAddr::new(server, if t.gue { GUE_PORT } else { 0 });
    if t.gue {
        let any: SocketAddr = if server.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal")
        } else {
            "[::]:0".parse().expect("literal")
        };
        UdpSocket::bind(any)?.send_to(inner, to)?;
        return Ok(());
    }
    let domain = if server.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let proto = if t.vip.is_ipv4() {
        IPPROTO_IPIP
    } else {
        IPPROTO_IPV6
    };
    let s = Socket::new(domain, Type::RAW, Some(Protocol::from(proto)))?;
    s.send_to(inner, &SockAddr::from(to))?;
    Ok(())
}

/// RFC 1071 sum of `data` (big-endian words, an odd byte padded), not yet folded.
fn sum(data: &[u8]) -> u32 {
    data.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// The inner packet: an IP header from `src` to `dst` and an echo request.
pub(super) fn echo_packet(src: IpAddr, dst: IpAddr, id: u16, seq: u16) -> Vec<u8> {
    let ty = if dst.is_ipv4() {
        ECHO_REQUEST_V4
    } else {
        ECHO_REQUEST_V6
    };
    let mut icmp = vec![ty, 0, 0, 0];
    icmp.extend_from_slice(&id.to_be_bytes());
    icmp.extend_from_slice(&seq.to_be_bytes());
    icmp.extend_from_slice(PAYLOAD);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let c = fold(sum(&icmp));
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
            ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 1, 0, 0]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let c = fold(sum(&ip));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            ip.extend_from_slice(&icmp);
            ip
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut pseudo = Vec::with_capacity(40);
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 58]);
            let c = fold(sum(&pseudo) + sum(&icmp));
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            let mut ip = vec![0x60, 0, 0, 0];
            ip.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
            ip.extend_from_slice(&[58, 64]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            ip.extend_from_slice(&icmp);
            ip
        }
        // The caller's families agree (an inner packet of the server's family).
        _ => Vec::new(),
    }
}

/// Whether `got` (a raw socket's read: IPv4 with its header, ICMPv6 without) is the
/// echo reply to `id`/`seq`.
pub(super) fn is_reply(got: &[u8], v4: bool, id: u16, seq: u16) -> bool {
    let icmp = if v4 {
        let Some(&vihl) = got.first() else {
            return false;
        };
        let hlen = usize::from(vihl & 0x0f) * 4;
        match got.get(hlen..) {
            Some(rest) => rest,
            None => return false,
        }
    } else {
        got
    };
    let want = if v4 { ECHO_REPLY_V4 } else { ECHO_REPLY_V6 };
    icmp.len() >= 8
        && icmp[0] == want
        && icmp[4..6] == id.to_be_bytes()
        && icmp[6..8] == seq.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inner_echo_request_checks_out() {
        let p = echo_packet(
            "10.93.0.2".parse().unwrap(),
            "10.99.0.1".parse().unwrap(),
            7,
            9,
        );
        assert_eq!(p.len(), 20 + 8 + PAYLOAD.len());
        assert_eq!(fold(sum(&p[..20])), 0, "IPv4 header checksum");
        assert_eq!(fold(sum(&p[20..])), 0, "ICMP checksum");
        assert_eq!((p[9], p[20], &p[24..28]), (1, 8, &[0, 7, 0, 9][..]));

        let p = echo_packet("fd93::2".parse().unwrap(), "fd99::1".parse().unwrap(), 7, 9);
        let icmp = &p[40..];
        let mut pseudo = p[8..40].to_vec();
        pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 58]);
        assert_eq!(fold(sum(&pseudo) + sum(icmp)), 0, "ICMPv6 checksum");
        assert_eq!((p[6], icmp[0]), (58, 128));
    }

    #[test]
    fn only_the_matching_echo_reply_counts() {
        let mut v4 = vec![0x45; 20];
        v4.extend_from_slice(&[0, 0, 0, 0, 0, 7, 0, 9]);
        assert!(is_reply(&v4, true, 7, 9));
        assert!(!is_reply(&v4, true, 7, 10), "another sequence number");
        v4[20] = 8;
        assert!(!is_reply(&v4, true, 7, 9), "a request, not a reply");
        let v6 = [129, 0, 0, 0, 0, 7, 0, 9];
        assert!(is_reply(&v6, false, 7, 9));
        assert!(!is_reply(&v6[..6], false, 7, 9), "cut short");
    }
}
