//! The icmp probe: one echo request, a matching echo reply within the timeout.
//!
//! Uses an unprivileged ping socket (`SOCK_DGRAM`/`IPPROTO_ICMP{,V6}`) where
//! `net.ipv4.ping_group_range` allows it, else a raw socket (root / CAP_NET_RAW). The
//! socket is connected to the target, so the kernel only hands us its packets and reports
//! an ICMP host/network unreachable for it as a socket error (an immediate failure).

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket as StdUdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::stamps::{self, Judged, Sent, Stamp};
use super::{Passed, ProbeError};

const ECHO_REQUEST_V4: u8 = 8;
const ECHO_REPLY_V4: u8 = 0;
const ECHO_REQUEST_V6: u8 = 128;
const ECHO_REPLY_V6: u8 = 129;
const PAYLOAD: &[u8] = b"lb-agent health probe";

/// Sequence numbers are unique across the process, so that concurrent probes of one
/// target on raw sockets (which all see every reply from it) tell theirs apart.
static SEQ: AtomicU16 = AtomicU16::new(0);

/// One echo request, judged by the kernel's stamps (docs/local-faults.md): a reply the
/// kernel received within `timeout` of the request passes however late the agent read
/// it; silence is a timeout once the agent drained the socket after the server had its
/// whole timeout; when the agent was too late to tell, no verdict.
pub(super) async fn probe(ip: IpAddr, timeout: Duration) -> Result<Passed, ProbeError> {
    let start = Instant::now();
    let (sock, raw) = open(ip).map_err(icmp_error)?;
    let id = std::process::id() as u16;
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let request = echo_request(ip.is_ipv4(), id, seq);
    let lo = stamps::now();
    sock.send(&request).await.map_err(icmp_error)?;
    let sent = Sent {
        lo,
        hi: stamps::now(),
    };
    let want = Want {
        v4: ip.is_ipv4(),
        raw,
        id: if raw { Some(id) } else { None },
        seq,
    };
    let mut wake = start + timeout;
    let mut extended = false;
    loop {
        let at_deadline = tokio::select! {
            biased;
            ready = sock.readable() => {
                ready.map_err(icmp_error)?;
                false
            }
            () = tokio::time::sleep_until(wake) => true,
        };
        if at_deadline {
            super::lag::note_late(Instant::now().saturating_duration_since(wake));
        }
        // Every datagram the kernel received before `drained` is read below.
        let drained = stamps::now();
        if let Some(rx) = read_replies(&sock, want, at_deadline).map_err(icmp_error)? {
            return match rx.map(|rx| stamps::answer(sent, rx, timeout)) {
                Some(Judged::InTime(rtt)) => Ok(passed(Some(rtt))),
                None => Ok(passed(None)),
                Some(other) => Err(ProbeError::judged(stamps::confirm(other, sent.lo, timeout))),
            };
        }
        if !at_deadline {
            continue;
        }
        match stamps::silence(Some(sent), drained, timeout) {
            Ok(judged) => {
                return Err(ProbeError::judged(stamps::confirm(
                    judged, sent.lo, timeout,
                )));
            }
            Err(owed) if !extended => {
                extended = true;
                wake = Instant::now() + owed;
            }
            Err(owed) => return Err(ProbeError::judged(stamps::still_owed(owed))),
        }
    }
}

fn passed(rtt: Option<Duration>) -> Passed {
    Passed {
        detail: "echo reply".into(),
        rtt,
    }
}

/// The reply a probe waits for.
#[derive(Debug, Clone, Copy)]
struct Want {
    v4: bool,
    /// A raw socket (IPv4: the IP header comes too; the identifier is ours to check).
    raw: bool,
    id: Option<u16>,
    seq: u16,
}

/// Reads every datagram queued on `sock` without waiting: `Some` with the kernel's
/// receive stamp (`None` inside: the kernel gave none) once one is our reply. `direct`
/// (at the deadline) reads the socket whatever the runtime knows of its readiness: an
/// event the runtime has not taken from the kernel yet must not hide a reply; otherwise
/// through the runtime, which then forgets a readiness that read nothing.
fn read_replies(
    sock: &UdpSocket,
    want: Want,
    direct: bool,
) -> std::io::Result<Option<Option<Stamp>>> {
    let mut buf = [0u8; 2048];
    // u64 words: the control buffer must be aligned for `cmsghdr`.
    let mut control = [0u64; stamps::CONTROL_BYTES / 8];
    loop {
        let mut recv = || {
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            // SAFETY: all-zero is a valid msghdr.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = stamps::CONTROL_BYTES;
            // SAFETY: the header points at a buffer and a control buffer alive and of
            // the stated lengths for the call.
            let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: filled by the kernel; `control` is alive.
            Ok((n as usize, unsafe { stamps::received(&msg) }))
        };
        let got = if direct {
            recv()
        } else {
            sock.try_io(Interest::READABLE, recv)
        };
        let (n, rx) = match got {
            Ok(got) => got,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let n = n.min(buf.len());
        // A raw IPv4 socket delivers the IP header too; IPv6 and ping sockets do not.
        let msg = if want.raw && want.v4 {
            strip_ipv4_header(&buf[..n])
        } else {
            Some(&buf[..n])
        };
        // Ping sockets rewrite the identifier to their own and only deliver their replies.
        if let Some(msg) = msg
            && is_reply(msg, want.v4, want.id, want.seq)
        {
            return Ok(Some(rx));
        }
    }
}

/// A connected, non-blocking ICMP socket: a ping socket if allowed, else a raw one
/// (`true`).
fn open(ip: IpAddr) -> std::io::Result<(UdpSocket, bool)> {
    let (domain, proto) = match ip {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6),
    };
    let (sock, raw) = match Socket::new(domain, Type::DGRAM, Some(proto)) {
        Ok(s) => (s, false),
        Err(e)
            if matches!(e.kind(), ErrorKind::PermissionDenied)
                || e.raw_os_error() == Some(libc::EPROTONOSUPPORT) =>
        {
            (Socket::new(domain, Type::RAW, Some(proto))?, true)
        }
        Err(e) => return Err(e),
    };
    sock.set_nonblocking(true)?;
    // Replies are judged by when the kernel received them (stamps module).
    stamps::enable(&sock)?;
    sock.connect(&SockAddr::from(SocketAddr::new(ip, 0)))?;
    // Tokio's UdpSocket only needs a datagram-style fd: send/recv on a connected socket.
    Ok((UdpSocket::from_std(StdUdpSocket::from(sock))?, raw))
}

fn icmp_error(source: std::io::Error) -> ProbeError {
    ProbeError::Icmp { source }
}

/// An echo request. The checksum is computed for IPv4 (the kernel does it for ICMPv6, and
/// recomputes it on ping sockets).
fn echo_request(v4: bool, id: u16, seq: u16) -> Vec<u8> {
    let kind = if v4 { ECHO_REQUEST_V4 } else { ECHO_REQUEST_V6 };
    let mut pkt = vec![kind, 0, 0, 0];
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&seq.to_be_bytes());
    pkt.extend_from_slice(PAYLOAD);
    if v4 {
        let sum = checksum(&pkt);
        pkt[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    pkt
}

/// The Internet checksum (RFC 1071).
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn strip_ipv4_header(pkt: &[u8]) -> Option<&[u8]> {
    let ihl = usize::from(pkt.first()? & 0x0f) * 4;
    pkt.get(ihl..)
}

/// Is `msg` (an ICMP message) the echo reply to our request?
fn is_reply(msg: &[u8], v4: bool, id: Option<u16>, seq: u16) -> bool {
    let reply = if v4 { ECHO_REPLY_V4 } else { ECHO_REPLY_V6 };
    msg.len() >= 8
        && msg[0] == reply
        && id.is_none_or(|id| msg[4..6] == id.to_be_bytes())
        && msg[6..8] == seq.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reply reaches the kernel at once while the agent's only thread is blocked
    /// past the timeout: judged by the kernel's receive stamp it passes, and its
    /// duration is the stamps' round trip, not the agent's wait (needs a ping socket
    /// or CAP_NET_RAW).
    #[test]
    fn a_reply_received_in_time_but_read_late_passes() {
        let timeout = Duration::from_millis(300);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        if rt.block_on(async { open(IpAddr::from([127, 0, 0, 1])).is_err() }) {
            eprintln!("skipped: no ping or raw ICMP socket");
            return;
        }
        let out = rt.block_on(async {
            let mut cfg = crate::config::ProbeConfig::new("icmp", crate::config::ProbeKind::Icmp);
            cfg.timeout = timeout;
            let probe = tokio::spawn(async move {
                crate::probe::execute(&cfg, "127.0.0.1:0".parse().unwrap()).await
            });
            // Let it send, then starve the runtime past the deadline.
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            std::thread::sleep(timeout * 2);
            probe.await.unwrap()
        });
        assert!(out.ok, "{out:?}");
        assert!(out.duration < timeout, "measured by the stamps: {out:?}");
    }

    #[test]
    fn checksum_of_a_known_echo_request() {
        // type 8, id 0x1234, seq 1, no payload: 0xffff - (0x0800 + 0x1234 + 0x0001).
        let mut pkt = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
        let sum = checksum(&pkt);
        assert_eq!(sum, 0xffff - 0x0800 - 0x1234 - 0x0001);
        pkt[2..4].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(checksum(&pkt), 0, "a packet with its checksum sums to zero");
    }

    #[test]
    fn reply_must_match_type_id_and_sequence() {
        let reply = [0u8, 0, 0, 0, 0x12, 0x34, 0, 7, 1, 2];
        assert!(is_reply(&reply, true, Some(0x1234), 7));
        assert!(
            is_reply(&reply, true, None, 7),
            "ping sockets do not check the id"
        );
        assert!(!is_reply(&reply, true, Some(0x1235), 7));
        assert!(!is_reply(&reply, true, Some(0x1234), 8));
        assert!(
            !is_reply(&reply, false, Some(0x1234), 7),
            "type 0 is not an ICMPv6 echo reply"
        );
        let mut request = reply;
        request[0] = ECHO_REQUEST_V4;
        assert!(
            !is_reply(&request, true, Some(0x1234), 7),
            "our own request is not a reply"
        );
    }
}
