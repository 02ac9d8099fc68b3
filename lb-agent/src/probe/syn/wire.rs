//! The SYN check's packet I/O for the engine ([`super::engine`]): SYNs out in
//! `sendmmsg` batches, replies in with `recvmmsg` batches and queued ICMP errors, each
//! matched to the probe it verifiably answers.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use socket2::{SockAddr, Socket};

use super::icmp::{self, Ignored, Unreachable};
use super::packet::{self, SYN_LEN};
use super::{Flights, Outgoing, Owner, Settled, stats};

/// SYNs per `sendmmsg` and replies per `recvmmsg` at most.
pub(super) const BATCH: usize = 64;
/// Bytes kept of a reply: an IPv4 header with options and a TCP header with options.
const REPLY_BYTES: usize = 128;

/// Probes that ended, and how: for the engine to settle.
pub(super) type Settlements = Vec<(Owner, Settled)>;

/// Sends `batch`, one `sendmmsg` per address family in it (in chunks of [`BATCH`]);
/// settles the probes it could not send.
pub(super) fn send_families(
    batch: &[Outgoing],
    v4: &Socket,
    v6: Option<&Socket>,
    flights: &mut Flights,
    settled: &mut Settlements,
) {
    if batch.is_empty() {
        return;
    }
    let now = std::time::Instant::now();
    let (mut sum, mut max, mut late) = (0u64, 0u64, 0u64);
    for o in batch {
        let waited = now.saturating_duration_since(o.queued);
        let us = waited.as_micros() as u64;
        sum += us;
        max = max.max(us);
        late += u64::from(waited >= o.timeout);
    }
    let s = stats();
    s.queue_us_sum.fetch_add(sum, Ordering::Relaxed);
    s.queue_us_max.fetch_max(max, Ordering::Relaxed);
    s.sent_late.fetch_add(late, Ordering::Relaxed);
    for want_v4 in [true, false] {
        let group: Vec<&Outgoing> = batch
            .iter()
            .filter(|o| o.dst.is_ipv4() == want_v4)
            .collect();
        for chunk in group.chunks(BATCH) {
            let sock = if want_v4 { Some(v4) } else { v6 };
            let failed = match sock {
                Some(sock) => send_batch(sock, chunk),
                None => (0..chunk.len())
                    .map(|i| (i, io::Error::from_raw_os_error(libc::EAFNOSUPPORT)))
                    .collect(),
            };
            s.sent
                .fetch_add((chunk.len() - failed.len()) as u64, Ordering::Relaxed);
            for (i, err) in failed {
                fail(flights, chunk[i], &err, settled);
            }
        }
    }
}

/// Sends `group`; returns the SYNs that did not go out, with their errors. A SYN the
/// local queue dropped fails with `ENOBUFS` (the socket has `IP_RECVERR`, else the kernel
/// hides it): a local fault, not a timeout held against the target.
fn send_batch(sock: &Socket, group: &[&Outgoing]) -> Vec<(usize, io::Error)> {
    // Raw sockets take the protocol, not a port, in the address: 0.
    let addrs: Vec<SockAddr> = group
        .iter()
        .map(|o| SockAddr::from(SocketAddr::new(o.dst.ip(), 0)))
        .collect();
    let mut iovs: Vec<libc::iovec> = group
        .iter()
        .map(|o| libc::iovec {
            iov_base: o.segment.as_ptr() as *mut libc::c_void,
            iov_len: SYN_LEN,
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = addrs
        .iter()
        .zip(iovs.iter_mut())
        .map(|(a, iov)| {
            // SAFETY: all-zero is a valid mmsghdr.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_name = a.as_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_namelen = a.len();
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    let mut failed = Vec::new();
    let mut done = 0;
    while done < msgs.len() {
        // SAFETY: every header points at an address, an iovec and a segment alive until
        // the call returns.
        let n = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                msgs[done..].as_mut_ptr(),
                (msgs.len() - done) as libc::c_uint,
                0,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // The message at `done` failed; the ones after it are tried again.
            failed.push((done, err));
            done += 1;
            continue;
        }
        done += n as usize;
    }
    failed
}

/// Settles the probe of `o` with the send error `err` (a local fault or not, as the
/// connect probe's errors: [`crate::probe::local`]).
fn fail(flights: &mut Flights, o: &Outgoing, err: &io::Error, settled: &mut Settlements) {
    let key = (o.dst, o.sport);
    if flights.get(&key).is_some_and(|p| p.isn == o.isn)
        && let Some(p) = flights.remove(&key)
    {
        let e = match err.raw_os_error() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(err.kind(), err.to_string()),
        };
        settled.push((p.owner, Settled::NotSent(e)));
    }
}

/// Buffers for one `recvmmsg` of [`BATCH`] replies.
pub(super) struct RecvBufs {
    bufs: Vec<[u8; REPLY_BYTES]>,
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs`/`msgs` only ever point into the same struct's
// buffers, rebuilt before each use; the struct is used by one thread at a time.
unsafe impl Send for RecvBufs {}

impl RecvBufs {
    pub(super) fn new() -> Self {
        RecvBufs {
            bufs: vec![[0u8; REPLY_BYTES]; BATCH],
            // SAFETY: all-zero is a valid sockaddr_storage.
            names: vec![unsafe { std::mem::zeroed() }; BATCH],
            iovs: Vec::with_capacity(BATCH),
            msgs: Vec::with_capacity(BATCH),
        }
    }
}

/// Reads up to [`BATCH`] queued replies from `sock` without waiting and appends the ones
/// that parse to `replies` (counting the others): how many were read, or the receive
/// error (`WouldBlock` when none was queued; another error means an ICMP error is
/// queued: [`read_errors`]).
pub(super) fn recv_some(
    sock: &Socket,
    ipv4: bool,
    b: &mut RecvBufs,
    replies: &mut Vec<(IpAddr, packet::Reply)>,
) -> io::Result<usize> {
    b.iovs.clear();
    b.iovs.extend(b.bufs.iter_mut().map(|buf| libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: REPLY_BYTES,
    }));
    b.msgs.clear();
    b.msgs.extend(
        b.names
            .iter_mut()
            .zip(b.iovs.iter_mut())
            .map(|(name, iov)| {
                // SAFETY: all-zero is a valid mmsghdr.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = (name as *mut libc::sockaddr_storage).cast();
                m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
                m.msg_hdr.msg_iov = iov;
                m.msg_hdr.msg_iovlen = 1;
                m
            }),
    );
    // SAFETY: every header points at a name and a buffer alive for the call.
    let n = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            b.msgs.as_mut_ptr(),
            BATCH as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    for i in 0..n as usize {
        let len = (b.msgs[i].msg_len as usize).min(REPLY_BYTES);
        let from = source_of(&b.names[i]);
        let segment = if ipv4 {
            packet::strip_ipv4(&b.bufs[i][..len])
        } else {
            Ok(&b.bufs[i][..len])
        };
        match (from, segment.and_then(packet::parse)) {
            (Some(ip), Ok(reply)) => replies.push((ip, reply)),
            _ => {
                stats().malformed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(n as usize)
}

/// Reads up to [`BATCH`] errors from the socket's error queue (`MSG_ERRQUEUE`) and fails
/// the probes whose SYN an ICMP error verifiably quotes; counts the others. The rest
/// waits for the next round, after the replies queued meanwhile.
pub(super) fn read_errors(
    sock: &Socket,
    ipv4: bool,
    flights: &mut Flights,
    settled: &mut Settlements,
) {
    let mut errors: Vec<Unreachable> = Vec::with_capacity(BATCH);
    icmp::drain(sock, ipv4, BATCH, |parsed| match parsed {
        Ok(e) => errors.push(e),
        Err(Ignored::Malformed) => {
            stats().malformed.fetch_add(1, Ordering::Relaxed);
        }
        Err(Ignored::NotFatal) => {
            stats().icmp_unmatched.fetch_add(1, Ordering::Relaxed);
        }
    });
    resolve_unreachable(flights, &errors, settled);
}

/// Fails the probe each error quotes, if its quote is that probe's SYN (target, ports
/// and ISN); counts the others.
fn resolve_unreachable(flights: &mut Flights, errors: &[Unreachable], settled: &mut Settlements) {
    for e in errors {
        let key = (SocketAddr::new(e.target, e.dport), e.sport);
        match flights.get(&key) {
            None => {
                stats().icmp_unmatched.fetch_add(1, Ordering::Relaxed);
            }
            Some(p) if p.isn != e.seq => {
                stats().icmp_rejected.fetch_add(1, Ordering::Relaxed);
            }
            Some(_) => {
                let p = flights.remove(&key).expect("just found");
                stats().unreachable.fetch_add(1, Ordering::Relaxed);
                settled.push((
                    p.owner,
                    Settled::Unreachable(io::Error::from_raw_os_error(e.errno)),
                ));
            }
        }
    }
}

/// Hands each verified reply to its probe; counts the others.
pub(super) fn resolve(
    flights: &mut Flights,
    replies: &[(IpAddr, packet::Reply)],
    settled: &mut Settlements,
) {
    for &(ip, reply) in replies {
        let key = (SocketAddr::new(ip, reply.from_port), reply.to_port);
        match flights.get(&key) {
            None => {
                stats().unmatched.fetch_add(1, Ordering::Relaxed);
            }
            Some(p) if p.isn.wrapping_add(1) != reply.ack => {
                stats().rejected.fetch_add(1, Ordering::Relaxed);
            }
            Some(_) => {
                let p = flights.remove(&key).expect("just found");
                let counter = match reply.answer {
                    packet::Answer::Accepts => &stats().accepted,
                    packet::Answer::Refuses => &stats().refused,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                settled.push((p.owner, Settled::Answer(reply.answer)));
            }
        }
    }
}

/// The address in a received packet's name: its sender (or, for a queued ICMP error,
/// the destination of the packet it quotes).
pub(super) fn source_of(name: &libc::sockaddr_storage) -> Option<std::net::IpAddr> {
    match i32::from(name.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in; storage is large enough.
            let a = unsafe { &*(name as *const _ as *const libc::sockaddr_in) };
            Some(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)).into())
        }
        libc::AF_INET6 => {
            // SAFETY: as above, a sockaddr_in6.
            let a = unsafe { &*(name as *const _ as *const libc::sockaddr_in6) };
            Some(Ipv6Addr::from(a.sin6_addr.s6_addr).into())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::syn::Flight;

    fn unreachable(target: SocketAddr, sport: u16, seq: u32) -> Unreachable {
        Unreachable {
            target: target.ip(),
            sport,
            dport: target.port(),
            seq,
            errno: libc::EHOSTUNREACH,
        }
    }

    #[test]
    fn an_icmp_error_fails_only_the_probe_whose_syn_it_quotes() {
        let mut flights = Flights::default();
        let target: SocketAddr = "[fd00::2]:80".parse().unwrap();
        let owner = Owner::Entry { id: 5, stamp: 9 };
        flights.insert((target, 40000), Flight { isn: 77, owner });
        let other_port: SocketAddr = "[fd00::2]:81".parse().unwrap();
        let other_host: SocketAddr = "[fd00::3]:80".parse().unwrap();
        let (rejected, unmatched) = (
            stats().icmp_rejected.load(Ordering::Relaxed),
            stats().icmp_unmatched.load(Ordering::Relaxed),
        );
        let mut settled = Settlements::new();
        resolve_unreachable(
            &mut flights,
            &[
                unreachable(target, 40000, 78),     // wrong sequence number
                unreachable(target, 40000, 76),     // the ISN is not the ACK
                unreachable(target, 40001, 77),     // another source port
                unreachable(other_port, 40000, 77), // another target port
                unreachable(other_host, 40000, 77), // another target
            ],
            &mut settled,
        );
        assert!(settled.is_empty(), "no forgery settles the probe");
        assert!(flights.contains_key(&(target, 40000)));
        // Counters are process-wide (other tests run alongside): at least ours.
        assert!(stats().icmp_rejected.load(Ordering::Relaxed) >= rejected + 2);
        assert!(stats().icmp_unmatched.load(Ordering::Relaxed) >= unmatched + 3);

        resolve_unreachable(
            &mut flights,
            &[unreachable(target, 40000, 77)],
            &mut settled,
        );
        match &settled[..] {
            [(Owner::Entry { id: 5, stamp: 9 }, Settled::Unreachable(e))] => {
                assert_eq!(e.raw_os_error(), Some(libc::EHOSTUNREACH))
            }
            _ => panic!("the quoted SYN's probe fails as unreachable"),
        }
        assert!(flights.is_empty(), "its entry is gone");
        // The same error again (a duplicate) finds no probe.
        let before = stats().icmp_unmatched.load(Ordering::Relaxed);
        resolve_unreachable(
            &mut flights,
            &[unreachable(target, 40000, 77)],
            &mut settled,
        );
        assert!(stats().icmp_unmatched.load(Ordering::Relaxed) > before);
        assert_eq!(settled.len(), 1);
    }
}
