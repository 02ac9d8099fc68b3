//! What reaches a host: a capture of the IPv4 TCP and UDP frames addressed to one of its
//! interfaces (its MAC), each with the kernel's receive time (`SO_TIMESTAMPNS`,
//! `CLOCK_REALTIME`) and the send time of its payload's first stamp
//! ([`crate::traffic::spread`]), if it has one. An `AF_PACKET` socket bound to the
//! interface sees such a frame whatever its destination address, before the host's stack
//! decides anything about it; a thread of its own reads it until the capture stops.

use std::{
    io,
    mem::{size_of, zeroed},
    net::Ipv4Addr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
};

use crate::{
    net::netns::NetNs,
    traffic::{
        packet::{IPPROTO_TCP, IPPROTO_UDP},
        spread::read_stamp,
    },
    util::error::Error,
};

/// How long one read waits before the thread looks at the stop flag again.
const READ_TIMEOUT_US: i64 = 50_000;
/// The socket's receive buffer: a few seconds of a scenario's traffic.
const RCVBUF: i32 = 8 << 20;

/// One frame that arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Receive time, ns since the epoch.
    pub at_ns: u64,
    pub proto: u8,
    pub src: Ipv4Addr,
    pub sport: u16,
    pub dst: Ipv4Addr,
    pub dport: u16,
    /// The time its payload's first stamp was written, if the payload starts with one.
    pub stamp_ns: Option<u64>,
}

/// A running capture; stopped on drop.
pub struct Capture {
    seen: Arc<Mutex<Vec<Arrival>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<io::Result<u32>>>,
}

impl Capture {
    /// Starts capturing what arrives on `ifname` in `ns`; frames arriving once this
    /// returns are all seen.
    pub fn start(ns: &NetNs, ifname: &str) -> Result<Capture, Error> {
        let name = ifname.to_owned();
        let sock = ns
            .run(move || open(&name))?
            .map_err(Error::io(format!("capturing on {ifname} in {}", ns.name())))?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (into, flag) = (Arc::clone(&seen), Arc::clone(&stop));
        let handle = thread::spawn(move || read_until(&sock, &into, &flag));
        Ok(Capture {
            seen,
            stop,
            handle: Some(handle),
        })
    }

    /// Every frame seen so far, in arrival order.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.seen.lock().expect("capture lock").clone()
    }

    /// Stops the capture; an error if reading failed or the socket lost frames (then
    /// what arrived is not known).
    pub fn stop(mut self) -> Result<Vec<Arrival>, Error> {
        self.finish()?;
        Ok(self.arrivals())
    }

    fn finish(&mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Relaxed);
        let Some(h) = self.handle.take() else {
            return Ok(());
        };
        let lost = h
            .join()
            .map_err(|_| Error::Unexpected("the capture thread panicked".into()))?
            .map_err(Error::io("reading the capture"))?;
        if lost > 0 {
            return Err(Error::Unexpected(format!(
                "the capture lost {lost} frames (its socket's buffer overflowed)"
            )));
        }
        Ok(())
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// An `AF_PACKET` socket for IPv4 frames arriving on `ifname`, with receive times.
fn open(ifname: &str) -> io::Result<OwnedFd> {
    let proto = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: plain socket(2); owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(ifname)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in the name"))?;
    // SAFETY: `name` is NUL-terminated and alive across the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    let on: i32 = 1;
    setsockopt(&sock, libc::SO_TIMESTAMPNS, &on)?;
    setsockopt(&sock, libc::SO_RCVBUFFORCE, &RCVBUF)?;
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: READ_TIMEOUT_US,
    };
    setsockopt(&sock, libc::SO_RCVTIMEO, &timeout)?;
    // SAFETY: a zeroed sockaddr_ll is valid; the fields bind needs are set.
    let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = proto;
    addr.sll_ifindex = index as i32;
    // SAFETY: the address lives across the call, its size is given.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

fn setsockopt<T>(sock: &OwnedFd, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live T of the size given, as option `name` expects.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (value as *const T).cast(),
            size_of::<T>() as u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads frames into `into` until `stop`; returns how many the socket dropped.
fn read_until(sock: &OwnedFd, into: &Mutex<Vec<Arrival>>, stop: &AtomicBool) -> io::Result<u32> {
    let mut frame = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let Some((n, at_ns)) = receive(sock, &mut frame)? else {
            continue;
        };
        if let Some(a) = parse(&frame[..n.min(frame.len())], at_ns) {
            into.lock().expect("capture lock").push(a);
        }
    }
    dropped(sock)
}

/// Frames the socket dropped since it was opened (`PACKET_STATISTICS`, read once).
fn dropped(sock: &OwnedFd) -> io::Result<u32> {
    // SAFETY: a zeroed tpacket_stats is valid.
    let mut stats: libc::tpacket_stats = unsafe { zeroed() };
    let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
    // SAFETY: `stats` and `len` live across the call, `len` says how large `stats` is.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&mut stats as *mut libc::tpacket_stats).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stats.tp_drops)
}

/// Reads one frame into `frame`: its length and receive time, or `None` when the read
/// timed out or the frame was not addressed to this host (a bridge floods a frame for a
/// MAC it has not learned to every port; such copies reach no socket).
fn receive(sock: &OwnedFd, frame: &mut [u8]) -> io::Result<Option<(usize, u64)>> {
    // Room for one `SCM_TIMESTAMPNS` message.
    let mut control = [0u64; 8];
    // SAFETY: zeroed sockaddr_ll and msghdr are valid; every pointer set below points
    // into a buffer that lives across the calls; the control messages are read only
    // within the length the kernel wrote.
    unsafe {
        let mut from: libc::sockaddr_ll = zeroed();
        let mut iov = libc::iovec {
            iov_base: frame.as_mut_ptr().cast(),
            iov_len: frame.len(),
        };
        let mut msg: libc::msghdr = zeroed();
        msg.msg_name = (&mut from as *mut libc::sockaddr_ll).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_ll>() as u32;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; 8]>();
        let Ok(n) = usize::try_from(libc::recvmsg(sock.as_raw_fd(), &mut msg, 0)) else {
            let e = io::Error::last_os_error();
            let retry = matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            );
            return if retry { Ok(None) } else { Err(e) };
        };
        if from.sll_pkttype != libc::PACKET_HOST {
            return Ok(None);
        }
        let mut at_ns = 0u64;
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                at_ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        Ok(Some((n, at_ns)))
    }
}

/// The arrival an IPv4 TCP or UDP frame stands for.
fn parse(f: &[u8], at_ns: u64) -> Option<Arrival> {
    const ETH: usize = 14;
    if f.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let ihl = usize::from(f.get(ETH)? & 0x0f) * 4;
    let proto = *f.get(ETH + 9)?;
    let l4 = ETH + ihl;
    let word = |at: usize| Some(u16::from_be_bytes([*f.get(at)?, *f.get(at + 1)?]));
    let payload = match proto {
        IPPROTO_UDP => l4 + 8,
        IPPROTO_TCP => l4 + usize::from(f.get(l4 + 12)? >> 4) * 4,
        _ => return None,
    };
    let addr = |at: usize| {
        Some(Ipv4Addr::new(
            *f.get(at)?,
            *f.get(at + 1)?,
            *f.get(at + 2)?,
            *f.get(at + 3)?,
        ))
    };
    Some(Arrival {
        at_ns,
        proto,
        src: addr(ETH + 12)?,
        sport: word(l4)?,
        dst: addr(ETH + 16)?,
        dport: word(l4 + 2)?,
        stamp_ns: f.get(payload..).and_then(read_stamp),
    })
}
