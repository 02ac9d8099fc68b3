//! ICMP errors about our SYNs: the raw TCP sockets have `IP_RECVERR`/`IPV6_RECVERR`, so
//! the kernel queues every ICMP error that quotes a TCP packet from this host on their
//! error queue (`MSG_ERRQUEUE`), with the quoted packet's destination address, the
//! kernel's errno for it, and the quoted TCP header. An error fails a probe at once only
//! when that header is one of our SYNs in flight: its ports and our keyed sequence
//! number (the ISN no one who did not see the SYN can know).

use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

use socket2::Socket;

/// Bytes kept of a queued error's payload: the quoted TCP header's first 8 bytes are all
/// we read (ports, sequence number; RFC 792 guarantees 8).
const QUOTE_BYTES: usize = 64;
/// Room for one `IP_RECVERR` control message (the error and the offender's address).
const CONTROL_BYTES: usize = 128;

/// An ICMP error that would end a connect in SYN-SENT, about a TCP segment we may have
/// sent: not yet matched to a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unreachable {
    /// The quoted packet's destination: the target.
    pub target: IpAddr,
    /// The quoted TCP header's source port (ours) and destination port (the target's).
    pub sport: u16,
    pub dport: u16,
    /// The quoted sequence number: our ISN if it quotes our SYN.
    pub seq: u32,
    /// The kernel's errno for the error (what a connect would fail with).
    pub errno: i32,
}

/// Why a queued error is not one that can fail a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ignored {
    /// Not from an ICMP message of the socket's family, no address, or a quote shorter
    /// than 8 bytes.
    Malformed,
    /// An ICMP type a connect does not fail on (too big/fragmentation needed, an
    /// unknown unreachable code): the SYN may still be answered.
    NotFatal,
}

/// The queued error's fields as the kernel gives them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Queued<'a> {
    pub origin: u8,
    pub icmp_type: u8,
    pub icmp_code: u8,
    pub errno: u32,
    pub target: Option<IpAddr>,
    pub quote: &'a [u8],
}

/// Whether an ICMP error of `icmp_type`/`icmp_code` makes the kernel abort a TCP connect
/// in SYN-SENT (`tcp_v4_err`/`tcp_v6_err`): every error but source quench, redirects and
/// the path-MTU messages; unreachable codes past the defined ones are ignored on IPv4.
pub(super) fn ends_connect(ipv4: bool, icmp_type: u8, icmp_code: u8) -> bool {
    if ipv4 {
        match icmp_type {
            // Destination unreachable, codes 0..=15 but 4 (fragmentation needed).
            3 => icmp_code <= 15 && icmp_code != 4,
            // Time exceeded, parameter problem.
            11 | 12 => true,
            _ => false,
        }
    } else {
        // Destination unreachable, time exceeded, parameter problem; not packet too big.
        matches!(icmp_type, 1 | 3 | 4)
    }
}

/// Validates one queued error of an IPv4 (`ipv4`) or IPv6 raw socket.
pub(super) fn parse(ipv4: bool, q: Queued<'_>) -> Result<Unreachable, Ignored> {
    let origin = if ipv4 {
        libc::SO_EE_ORIGIN_ICMP
    } else {
        libc::SO_EE_ORIGIN_ICMP6
    };
    let (Some(target), true, true) = (q.target, q.origin == origin, q.quote.len() >= 8) else {
        return Err(Ignored::Malformed);
    };
    if target.is_ipv4() != ipv4 || q.errno == 0 || q.errno > 4095 {
        return Err(Ignored::Malformed);
    }
    if !ends_connect(ipv4, q.icmp_type, q.icmp_code) {
        return Err(Ignored::NotFatal);
    }
    let h = q.quote;
    Ok(Unreachable {
        target,
        sport: u16::from_be_bytes([h[0], h[1]]),
        dport: u16::from_be_bytes([h[2], h[3]]),
        seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        errno: q.errno as i32,
    })
}

/// Reads up to `max` errors queued on `sock` (without waiting), handing each parse to
/// `each`. Errors left queued keep the socket's error set, so the next receive call
/// (which reads queued replies first) reports it again: a flood of errors cannot hold
/// the replies back.
pub(super) fn drain(
    sock: &Socket,
    ipv4: bool,
    max: usize,
    mut each: impl FnMut(Result<Unreachable, Ignored>),
) {
    let mut quote = [0u8; QUOTE_BYTES];
    // u64 words: the control buffer must be aligned for `cmsghdr`.
    let mut control = [0u64; CONTROL_BYTES / 8];
    let mut read = 0;
    while read < max {
        // SAFETY: all-zero is a valid sockaddr_storage (family AF_UNSPEC).
        let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec {
            iov_base: quote.as_mut_ptr().cast(),
            iov_len: QUOTE_BYTES,
        };
        // SAFETY: all-zero is a valid msghdr (null pointers, zero lengths); its fields are
        // set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = CONTROL_BYTES;
        // SAFETY: the header points at a name, a buffer and a control buffer alive and of
        // the stated lengths for the call.
        let n = unsafe {
            libc::recvmsg(
                sock.as_raw_fd(),
                &mut msg,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        read += 1;
        let len = (n as usize).min(QUOTE_BYTES);
        // SAFETY: `msg` was filled by the kernel; its control length is within `control`.
        let err = unsafe { extended_err(&msg, ipv4) };
        let parsed = match err {
            Some(e) => parse(
                ipv4,
                Queued {
                    origin: e.ee_origin,
                    icmp_type: e.ee_type,
                    icmp_code: e.ee_code,
                    errno: e.ee_errno,
                    target: super::sockname::source_of(&name),
                    quote: &quote[..len],
                },
            ),
            None => Err(Ignored::Malformed),
        };
        each(parsed);
    }
}

/// The `IP_RECVERR`/`IPV6_RECVERR` control message of `msg`, if it has one.
///
/// # Safety
/// `msg` must come from a successful `recvmsg` whose control buffer is still alive.
unsafe fn extended_err(msg: &libc::msghdr, ipv4: bool) -> Option<libc::sock_extended_err> {
    let (level, kind) = if ipv4 {
        (libc::SOL_IP, libc::IP_RECVERR)
    } else {
        (libc::SOL_IPV6, libc::IPV6_RECVERR)
    };
    // SAFETY: the CMSG_* walk stays within the control length the kernel wrote.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == level && (*c).cmsg_type == kind {
                let data = libc::CMSG_DATA(c) as *const libc::sock_extended_err;
                return Some(std::ptr::read_unaligned(data));
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn quote(sport: u16, dport: u16, seq: u32) -> Vec<u8> {
        let mut q = Vec::new();
        q.extend(sport.to_be_bytes());
        q.extend(dport.to_be_bytes());
        q.extend(seq.to_be_bytes());
        q
    }

    fn queued(ipv4: bool, ty: u8, code: u8, q: &[u8]) -> Queued<'_> {
        Queued {
            origin: if ipv4 {
                libc::SO_EE_ORIGIN_ICMP
            } else {
                libc::SO_EE_ORIGIN_ICMP6
            },
            icmp_type: ty,
            icmp_code: code,
            errno: libc::EHOSTUNREACH as u32,
            target: Some(if ipv4 {
                Ipv4Addr::new(10, 0, 0, 2).into()
            } else {
                Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).into()
            }),
            quote: q,
        }
    }

    #[test]
    fn a_quoted_syn_gives_ports_sequence_and_errno() {
        let q = quote(40000, 80, 0xdead_beef);
        for ipv4 in [true, false] {
            let ty = if ipv4 { 3 } else { 1 };
            let got = parse(ipv4, queued(ipv4, ty, 1, &q)).unwrap();
            assert_eq!(
                (got.sport, got.dport, got.seq, got.errno),
                (40000, 80, 0xdead_beef, libc::EHOSTUNREACH)
            );
            assert_eq!(got.target.is_ipv4(), ipv4);
            // Only the first 8 bytes of the quote are read; more is fine.
            let mut long = q.clone();
            long.extend([0u8; 16]);
            assert_eq!(parse(ipv4, queued(ipv4, ty, 1, &long)), Ok(got));
        }
    }

    #[test]
    fn short_quotes_wrong_origins_and_families_are_malformed() {
        let q = quote(40000, 80, 1);
        for ipv4 in [true, false] {
            let ty = if ipv4 { 3 } else { 1 };
            assert_eq!(
                parse(ipv4, queued(ipv4, ty, 1, &q[..7])),
                Err(Ignored::Malformed)
            );
            let mut local = queued(ipv4, ty, 1, &q);
            local.origin = libc::SO_EE_ORIGIN_LOCAL;
            assert_eq!(parse(ipv4, local), Err(Ignored::Malformed), "a local error");
            let mut other_family = queued(ipv4, ty, 1, &q);
            other_family.origin = queued(!ipv4, ty, 1, &q).origin;
            assert_eq!(parse(ipv4, other_family), Err(Ignored::Malformed));
            let mut no_addr = queued(ipv4, ty, 1, &q);
            no_addr.target = None;
            assert_eq!(parse(ipv4, no_addr), Err(Ignored::Malformed));
            let mut wrong_addr = queued(ipv4, ty, 1, &q);
            wrong_addr.target = queued(!ipv4, ty, 1, &q).target;
            assert_eq!(parse(ipv4, wrong_addr), Err(Ignored::Malformed));
            let mut no_errno = queued(ipv4, ty, 1, &q);
            no_errno.errno = 0;
            assert_eq!(parse(ipv4, no_errno), Err(Ignored::Malformed));
        }
    }

    #[test]
    fn only_errors_that_abort_a_connect_count() {
        // IPv4: every unreachable code a connect fails on, but fragmentation needed.
        for code in 0..=15 {
            assert_eq!(
                ends_connect(true, 3, code),
                code != 4,
                "v4 unreachable {code}"
            );
        }
        assert!(!ends_connect(true, 3, 16), "an undefined code");
        assert!(ends_connect(true, 11, 0), "time exceeded");
        assert!(ends_connect(true, 12, 0), "parameter problem");
        for ty in [0, 4, 5, 8] {
            assert!(!ends_connect(true, ty, 0), "v4 type {ty}");
        }
        // IPv6: unreachable (any code), time exceeded, parameter problem; not too big.
        for code in 0..=7 {
            assert!(ends_connect(false, 1, code), "v6 unreachable {code}");
        }
        assert!(ends_connect(false, 3, 0) && ends_connect(false, 4, 0));
        assert!(!ends_connect(false, 2, 0), "packet too big");
        assert!(!ends_connect(false, 137, 0), "redirect");
        let q = quote(1, 2, 3);
        assert_eq!(parse(true, queued(true, 3, 4, &q)), Err(Ignored::NotFatal));
        assert_eq!(
            parse(false, queued(false, 2, 0, &q)),
            Err(Ignored::NotFatal)
        );
    }

    /// Sends a hand-built ICMP error over loopback quoting a TCP segment from `sport` to
    /// `quoted_dst`:9 with sequence number `seq`: an IPv4 packet through an
    /// `IPPROTO_RAW` socket, an ICMPv6 message (the kernel adds its checksum) through an
    /// ICMPv6 raw socket.
    fn send_error(quoted_dst: IpAddr, sport: u16, seq: u32) {
        use socket2::{Domain, Protocol, SockAddr, Type};
        let mut tcp = quote(sport, 9, seq);
        tcp.extend([0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
        match quoted_dst {
            IpAddr::V4(dst) => {
                let lo = Ipv4Addr::LOCALHOST.octets();
                let mut quoted = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0];
                quoted.extend(lo);
                quoted.extend(dst.octets());
                quoted.extend(&tcp);
                let mut icmp = vec![3, 1, 0, 0, 0, 0, 0, 0];
                icmp.extend(&quoted);
                let sum = !fold(&icmp);
                icmp[2..4].copy_from_slice(&sum.to_be_bytes());
                // The kernel fills in the outer header's length and checksum.
                let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0];
                ip.extend(lo);
                ip.extend(lo);
                ip.extend(&icmp);
                let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(255))).unwrap();
                let to = SockAddr::from(std::net::SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0));
                s.send_to(&ip, &to).unwrap();
            }
            IpAddr::V6(dst) => {
                let mut quoted = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
                quoted.extend(Ipv6Addr::LOCALHOST.octets());
                quoted.extend(dst.octets());
                quoted.extend(&tcp);
                let mut icmp = vec![1, 3, 0, 0, 0, 0, 0, 0];
                icmp.extend(&quoted);
                let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6)).unwrap();
                let to = SockAddr::from(std::net::SocketAddr::new(Ipv6Addr::LOCALHOST.into(), 0));
                s.send_to(&icmp, &to).unwrap();
            }
        }
    }

    fn fold(bytes: &[u8]) -> u16 {
        let mut sum: u32 = bytes
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    /// What the kernel gives a raw TCP socket with `IP_RECVERR` for an ICMP error about
    /// TCP: on its error queue, the quoted destination, the type, code and errno, and
    /// the quoted TCP header (needs CAP_NET_RAW, as the root test crate).
    #[test]
    fn the_kernel_queues_icmp_errors_about_tcp_on_the_raw_socket() {
        if crate::probe::syn::raw_socket_opens().is_err() {
            eprintln!("skipped: needs CAP_NET_RAW");
            return;
        }
        for (ipv4, dst) in [
            (true, IpAddr::from(Ipv4Addr::new(192, 0, 2, 7))),
            (
                false,
                IpAddr::from(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7)),
            ),
        ] {
            let domain = if ipv4 {
                socket2::Domain::IPV4
            } else {
                socket2::Domain::IPV6
            };
            let sock = crate::probe::syn::raw(domain, &[40000]).unwrap();
            // A sequence number of its own per run: other raw TCP sockets of this
            // process (the checker's) get a copy too, and are not read here.
            let seq = std::process::id() ^ 0x5a5a_0000;
            send_error(dst, 40000, seq);
            // The kernel reports the error on the socket (what wakes the receiver
            // thread's `recvmmsg`), then it waits on the error queue.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let reported = loop {
                match sock.take_error().unwrap() {
                    Some(e) => break Some(e),
                    None if std::time::Instant::now() > deadline => break None,
                    None => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            };
            let reported = reported.and_then(|e| e.raw_os_error());
            assert_eq!(reported, Some(libc::EHOSTUNREACH), "ipv4 {ipv4}");
            let mut got = Vec::new();
            drain(&sock, ipv4, 64, |e| got.push(e));
            let want = Unreachable {
                target: dst,
                sport: 40000,
                dport: 9,
                seq,
                errno: libc::EHOSTUNREACH,
            };
            // Other programs' ICMP errors about TCP on this host may be queued as well.
            assert!(got.contains(&Ok(want)), "ipv4 {ipv4}: queued {got:?}");
        }
    }
}
