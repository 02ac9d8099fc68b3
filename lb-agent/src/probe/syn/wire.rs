//! The SYN check's packet I/O: a sender thread that writes queued SYNs with `sendmmsg`
//! (bracketing each call with the clock: the SYNs' send stamps), and a receiver thread
//! per raw socket that reads replies with `recvmmsg` (each with the kernel's receive
//! stamp) and resolves the probes they verifiably answer. A probe at its deadline drains
//! the socket itself through the same [`Receiver`].

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, mpsc};
use std::time::Duration;

use socket2::{SockAddr, Socket};

use super::icmp::{self, Ignored, Unreachable};
use super::packet::{self, SYN_LEN};
use super::sockname::source_of;
use super::{Outgoing, PendingMap, Settled, stats};
use crate::probe::stamps::{self, Sent, Stamp};

/// SYNs per `sendmmsg` and replies per `recvmmsg` at most.
const BATCH: usize = 64;
/// Bytes kept of a reply: an IPv4 header with options and a TCP header with options.
const REPLY_BYTES: usize = 128;
/// After a batch that was not full, each thread waits this long for more work to gather,
/// so that at high rates a system call carries many packets instead of one (and the
/// thread wakes at most about a thousand times a second). It adds at most this much to
/// a probe's duration.
const GATHER: Duration = Duration::from_millis(1);

/// Sends what `queue` brings until every sender is gone.
pub(super) fn send_loop(
    queue: mpsc::Receiver<Outgoing>,
    v4: &Socket,
    v6: Option<&Socket>,
    pending: &PendingMap,
) {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(BATCH);
    while let Ok(first) = queue.recv() {
        batch.push(first);
        std::thread::sleep(GATHER);
        loop {
            while batch.len() < BATCH {
                match queue.try_recv() {
                    Ok(out) => batch.push(out),
                    Err(_) => break,
                }
            }
            send_families(&batch, v4, v6, pending);
            let full = batch.len() == BATCH;
            batch.clear();
            if !full {
                break;
            }
        }
    }
}

/// Sends `batch`, one `sendmmsg` per address family in it; fails the probes it could not
/// send.
fn send_families(batch: &[Outgoing], v4: &Socket, v6: Option<&Socket>, pending: &PendingMap) {
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
    // A SYN waiting in the queue is the sender late (lag module).
    crate::probe::lag::note_late(Duration::from_micros(max));
    // One sendmmsg per family present in the batch.
    for want_v4 in [true, false] {
        let group: Vec<&Outgoing> = batch
            .iter()
            .filter(|o| o.dst.is_ipv4() == want_v4)
            .collect();
        if group.is_empty() {
            continue;
        }
        let sock = if want_v4 { Some(v4) } else { v6 };
        let failed = match sock {
            Some(sock) => {
                // The send's bracket (stamps module): its start before the call, its end
                // after it.
                mark(pending, &group, |p, at| p.sent_lo = Some(at));
                let failed = send_batch(sock, &group);
                mark(pending, &group, |p, at| p.sent_hi = Some(at));
                failed
            }
            None => (0..group.len())
                .map(|i| (i, io::Error::from_raw_os_error(libc::EAFNOSUPPORT)))
                .collect(),
        };
        stats()
            .sent
            .fetch_add((group.len() - failed.len()) as u64, Ordering::Relaxed);
        for (i, err) in failed {
            fail(pending, &group[i..=i], &err);
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

/// Sets a send stamp, the clock now, on the probes of `group` still in flight.
fn mark(pending: &PendingMap, group: &[&Outgoing], set: impl Fn(&mut super::Pending, Stamp)) {
    let mut map = pending.lock().unwrap_or_else(|e| e.into_inner());
    let at = stamps::now();
    for o in group {
        if let Some(p) = map.get_mut(&(o.dst, o.sport))
            && p.isn == o.isn
        {
            set(p, at);
        }
    }
}

/// Resolves the probes of `group` with the send error `err` (a local fault or not, as
/// the connect probe's errors: [`crate::probe::local`]).
fn fail(pending: &PendingMap, group: &[&Outgoing], err: &io::Error) {
    let mut map = pending.lock().unwrap_or_else(|e| e.into_inner());
    for o in group {
        let key = (o.dst, o.sport);
        if map.get(&key).is_some_and(|p| p.isn == o.isn)
            && let Some(p) = map.remove(&key)
        {
            let e = match err.raw_os_error() {
                Some(code) => io::Error::from_raw_os_error(code),
                None => io::Error::new(err.kind(), err.to_string()),
            };
            let _ = p.reply.send(Settled::NotSent(e));
        }
    }
}

/// Reads replies from `sock` until it fails for good: waits until the socket has
/// something, then drains it under `receiver`'s lock (which a probe at its deadline takes
/// to drain the socket itself: [`Receiver::drain`]).
pub(super) fn recv_loop(
    sock: &Socket,
    ipv4: bool,
    pending: &PendingMap,
    receiver: &Mutex<Receiver>,
) {
    loop {
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, alive for the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, -1) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(error = %err, "SYN check receiver stopped");
            return;
        }
        let drained = receiver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(sock, ipv4, pending);
        if let Err(err) = drained {
            tracing::error!(error = %err, "SYN check receiver stopped");
            return;
        }
        std::thread::sleep(GATHER);
    }
}

/// Buffers for reading replies in batches; one per raw socket, behind a lock that the
/// receiver thread and probes at their deadline share.
pub(super) struct Receiver {
    bufs: Vec<[u8; REPLY_BYTES]>,
    names: Vec<libc::sockaddr_storage>,
    /// u64 words: a control buffer must be aligned for `cmsghdr`.
    controls: Vec<[u64; stamps::CONTROL_BYTES / 8]>,
    /// The last read's packets: bytes kept and the kernel's receive stamp.
    got: Vec<(usize, Option<Stamp>)>,
}

impl Default for Receiver {
    fn default() -> Self {
        Receiver {
            bufs: vec![[0u8; REPLY_BYTES]; BATCH],
            // SAFETY: all-zero is a valid sockaddr_storage.
            names: vec![unsafe { std::mem::zeroed() }; BATCH],
            controls: vec![[0u64; stamps::CONTROL_BYTES / 8]; BATCH],
            got: Vec::with_capacity(BATCH),
        }
    }
}

impl Receiver {
    /// One `recvmmsg` without waiting: `Some(n)` packets read (0: none queued), `None`
    /// when the socket reports a queued error instead.
    fn read(&mut self, sock: &Socket) -> io::Result<Option<usize>> {
        let mut iovs: Vec<libc::iovec> = self
            .bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: REPLY_BYTES,
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = self
            .names
            .iter_mut()
            .zip(iovs.iter_mut())
            .zip(self.controls.iter_mut())
            .map(|((name, iov), control)| {
                // SAFETY: all-zero is a valid mmsghdr.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = (name as *mut libc::sockaddr_storage).cast();
                m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
                m.msg_hdr.msg_iov = iov;
                m.msg_hdr.msg_iovlen = 1;
                m.msg_hdr.msg_control = control.as_mut_ptr().cast();
                m.msg_hdr.msg_controllen = stamps::CONTROL_BYTES;
                m
            })
            .collect();
        self.got.clear();
        loop {
            // SAFETY: every header points at a name, a buffer and a control buffer alive
            // for the call.
            let n = unsafe {
                libc::recvmmsg(
                    sock.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    BATCH as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                for m in &msgs[..n as usize] {
                    let len = (m.msg_len as usize).min(REPLY_BYTES);
                    // SAFETY: filled by the kernel; its control buffer is alive.
                    let rx = unsafe { stamps::received(&m.msg_hdr) };
                    self.got.push((len, rx));
                }
                return Ok(Some(n as usize));
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(Some(0)),
                Some(libc::EBADF | libc::ENOTSOCK | libc::EINVAL | libc::EFAULT) => {
                    return Err(err);
                }
                _ => return Ok(None),
            }
        }
    }

    /// Reads every packet queued on `sock` (and queued ICMP errors) without waiting and
    /// hands each verified reply, with the kernel's receive stamp, to its probe. Returns
    /// the realtime clock read before the first read: every packet the kernel received
    /// up to then has been read and dispatched when this returns.
    pub(super) fn drain(
        &mut self,
        sock: &Socket,
        ipv4: bool,
        pending: &PendingMap,
    ) -> io::Result<Stamp> {
        let from = stamps::now();
        loop {
            let n = self.read(sock)?;
            let Some(n) = n else {
                // A queued error (`IP_RECVERR`): an ICMP error about a TCP packet of
                // this host, maybe one of our SYNs.
                read_errors(sock, ipv4, pending);
                continue;
            };
            let mut replies = Vec::with_capacity(n);
            // The oldest stamp read: the receiver was late by its age (lag module).
            if let Some(oldest) = self.got.iter().filter_map(|g| g.1).min() {
                crate::probe::lag::note(oldest, from.max(oldest));
            }
            for i in 0..n {
                let (len, rx) = self.got[i];
                let from_ip = source_of(&self.names[i]);
                let segment = if ipv4 {
                    packet::strip_ipv4(&self.bufs[i][..len])
                } else {
                    Ok(&self.bufs[i][..len])
                };
                match (from_ip, segment.and_then(packet::parse)) {
                    (Some(ip), Ok(reply)) => replies.push((ip, reply, rx)),
                    _ => {
                        stats().malformed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            resolve(pending, &replies);
            if n < BATCH {
                return Ok(from);
            }
        }
    }
}
/// Reads up to [`BATCH`] errors from the socket's error queue (`MSG_ERRQUEUE`) and fails
/// the probes whose SYN an ICMP error verifiably quotes; counts the others. The rest
/// waits for the next round, after the replies queued meanwhile.
fn read_errors(sock: &Socket, ipv4: bool, pending: &PendingMap) {
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
    resolve_unreachable(pending, &errors);
}

/// Fails the probe each error quotes, if its quote is that probe's SYN (target, ports
/// and ISN); counts the others.
fn resolve_unreachable(pending: &PendingMap, errors: &[Unreachable]) {
    if errors.is_empty() {
        return;
    }
    let mut map = pending.lock().unwrap_or_else(|e| e.into_inner());
    for e in errors {
        let key = (SocketAddr::new(e.target, e.dport), e.sport);
        match map.get(&key) {
            None => {
                stats().icmp_unmatched.fetch_add(1, Ordering::Relaxed);
            }
            Some(p) if p.isn != e.seq => {
                stats().icmp_rejected.fetch_add(1, Ordering::Relaxed);
            }
            Some(_) => {
                let p = map.remove(&key).expect("just found");
                stats().unreachable.fetch_add(1, Ordering::Relaxed);
                let _ = p
                    .reply
                    .send(Settled::Unreachable(io::Error::from_raw_os_error(e.errno)));
            }
        }
    }
}

/// Hands each verified reply, with its receive stamp and its SYN's send stamps, to its
/// probe; counts the others.
fn resolve(pending: &PendingMap, replies: &[(std::net::IpAddr, packet::Reply, Option<Stamp>)]) {
    if replies.is_empty() {
        return;
    }
    let mut map = pending.lock().unwrap_or_else(|e| e.into_inner());
    for &(ip, reply, rx) in replies {
        let key = (SocketAddr::new(ip, reply.from_port), reply.to_port);
        match map.get(&key) {
            None => {
                stats().unmatched.fetch_add(1, Ordering::Relaxed);
            }
            Some(p) if p.isn.wrapping_add(1) != reply.ack => {
                stats().rejected.fetch_add(1, Ordering::Relaxed);
            }
            Some(_) => {
                let p = map.remove(&key).expect("just found");
                let counter = match reply.answer {
                    packet::Answer::Accepts => &stats().accepted,
                    packet::Answer::Refuses => &stats().refused,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                // The SYN left before its answer came: an unfinished send's bracket
                // ends at the answer's stamp.
                let sent = p.sent_lo.map(|lo| Sent {
                    lo,
                    hi: p.sent_hi.or(rx).unwrap_or(lo),
                });
                let _ = p.reply.send(Settled::Answer {
                    answer: reply.answer,
                    rx,
                    sent,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;
    use crate::probe::syn::Pending;

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
        let pending = PendingMap::default();
        let target: SocketAddr = "[fd00::2]:80".parse().unwrap();
        let (tx, mut rx) = oneshot::channel();
        pending.lock().unwrap().insert(
            (target, 40000),
            Pending {
                isn: 77,
                reply: tx,
                sent_lo: None,
                sent_hi: None,
            },
        );
        let other_port: SocketAddr = "[fd00::2]:81".parse().unwrap();
        let other_host: SocketAddr = "[fd00::3]:80".parse().unwrap();
        let (rejected, unmatched) = (
            stats().icmp_rejected.load(Ordering::Relaxed),
            stats().icmp_unmatched.load(Ordering::Relaxed),
        );
        resolve_unreachable(
            &pending,
            &[
                unreachable(target, 40000, 78),     // wrong sequence number
                unreachable(target, 40000, 76),     // the ISN is not the ACK
                unreachable(target, 40001, 77),     // another source port
                unreachable(other_port, 40000, 77), // another target port
                unreachable(other_host, 40000, 77), // another target
            ],
        );
        assert!(rx.try_recv().is_err(), "no forgery settles the probe");
        assert!(pending.lock().unwrap().contains_key(&(target, 40000)));
        // Counters are process-wide (other tests run alongside): at least ours.
        assert!(stats().icmp_rejected.load(Ordering::Relaxed) >= rejected + 2);
        assert!(stats().icmp_unmatched.load(Ordering::Relaxed) >= unmatched + 3);

        resolve_unreachable(&pending, &[unreachable(target, 40000, 77)]);
        match rx.try_recv() {
            Ok(Settled::Unreachable(e)) => {
                assert_eq!(e.raw_os_error(), Some(libc::EHOSTUNREACH))
            }
            _ => panic!("the quoted SYN's probe fails as unreachable"),
        }
        assert!(pending.lock().unwrap().is_empty(), "its entry is gone");
        // The same error again (a duplicate) finds no probe.
        let before = stats().icmp_unmatched.load(Ordering::Relaxed);
        resolve_unreachable(&pending, &[unreachable(target, 40000, 77)]);
        assert!(stats().icmp_unmatched.load(Ordering::Relaxed) > before);
    }
}
