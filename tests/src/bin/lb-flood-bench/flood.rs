//! The sender: prebuilt UDP frames to the VIP put on an interface's wire (the client's
//! `eth0`, or the switch's port facing the lb) by one thread through an `AF_PACKET` socket with `PACKET_QDISC_BYPASS`, `sendmmsg` batches cycling
//! over the flows' frames, bounded by a packet count and a deadline.

use std::{
    ffi::CString,
    io,
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::Context;
use lb_tests::{
    net::{link::Mac, netns::NetNs},
    traffic::packet::Frame,
};

/// `SCHED_FIFO` priority of the flooding thread (below the NAPI threads').
const SENDER_PRIORITY: libc::c_int = 1;
/// Send buffer of the flooding socket (bytes).
const SEND_BUFFER: libc::c_int = 16 << 20;
/// Frames per `sendmmsg` call.
const BATCH: usize = 64;
/// `SOL_PACKET` / `PACKET_QDISC_BYPASS` from `linux/if_packet.h`.
const SOL_PACKET: libc::c_int = 263;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
/// UDP payload: the smallest frame (60 bytes before the FCS).
const PAYLOAD: [u8; 18] = *b"lb-flood-bench....";

/// One frame per flow: client `src` ports `first_port..first_port + flows` to `dst`.
pub fn frames(
    src_mac: Mac,
    dst_mac: Mac,
    src: IpAddr,
    first_port: u16,
    flows: u16,
    dst: IpAddr,
    dport: u16,
) -> Vec<Vec<u8>> {
    (0..flows)
        .map(|i| {
            Frame::udp(src, first_port + i, dst, dport)
                .macs(src_mac.0, dst_mac.0)
                .payload(&PAYLOAD)
                .bytes()
        })
        .collect()
}

/// How long and how much to send.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub max_packets: u64,
    pub duration: Duration,
    /// Pause after every batch (the smoke test's trickle); zero floods.
    pub pause: Duration,
    /// Frames per batch (at most [`BATCH`]).
    pub batch: usize,
}

/// What one flood did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sent {
    /// Frames the kernel took.
    pub sent: u64,
    /// Frames refused because the receive queue behind the sender's veth was full
    /// (`ENOBUFS`): dropped there.
    pub refused: u64,
    pub elapsed: Duration,
    /// On-CPU time of the sending thread (with the softirq work its sends caused).
    pub cpu: Duration,
}

/// Sends `frames` cyclically out of `ifname` in `ns` within `bounds`.
pub fn send(ns: &NetNs, ifname: &str, frames: &[Vec<u8>], bounds: Bounds) -> anyhow::Result<Sent> {
    anyhow::ensure!(!frames.is_empty(), "no frames to send");
    let name = CString::new(ifname)?;
    ns.run(|| -> anyhow::Result<Sent> {
        // SAFETY: plain socket(2), owned below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error()).context("socket(AF_PACKET)");
        }
        // SAFETY: the kernel just returned this fd to us.
        let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let one: libc::c_int = 1;
        // SAFETY: an int option of the size given, on a socket we own; `one` outlives the call.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                SOL_PACKET,
                PACKET_QDISC_BYPASS,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error()).context("PACKET_QDISC_BYPASS");
        }
        // SAFETY: `name` is a CString, NUL-terminated and alive across the call.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(io::Error::last_os_error())
                .with_context(|| format!("if_nametoindex({ifname})"));
        }
        if bounds.pause.is_zero() {
            flood_mode(fd)?;
        }
        let cpu_before = thread_on_cpu();
        let mut result = flood(fd, index, frames, bounds);
        if let Ok(sent) = &mut result {
            sent.cpu = thread_on_cpu().saturating_sub(cpu_before);
        }
        drop(sock);
        result
    })?
}

/// Before a flood: the machine is shared, and CFS shares a CPU between sessions
/// (autogroups) whatever a thread's nice value, so the flooding thread takes its CPU as
/// a real-time task for the flood's bounded time, below the NAPI threads there (the
/// kernel's RT throttling leaves other work 5 %). Frames still queued at the receiver
/// are charged to the socket: a buffer far beyond any queue means the sender never waits
/// for buffer space, and a full queue refuses frames instead (counted).
fn flood_mode(fd: i32) -> anyhow::Result<()> {
    let param = libc::sched_param {
        sched_priority: SENDER_PRIORITY,
    };
    // SAFETY: a plain syscall on the calling thread with a struct we own.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("SCHED_FIFO for the sender");
    }
    // SAFETY: an int option of the size given, read from a static.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            (&SEND_BUFFER as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("SO_SNDBUFFORCE");
    }
    Ok(())
}

/// The calling thread's on-CPU time (`/proc/thread-self/schedstat`).
fn thread_on_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

fn flood(fd: i32, ifindex: u32, frames: &[Vec<u8>], bounds: Bounds) -> anyhow::Result<Sent> {
    // SAFETY: a zeroed sockaddr_ll is valid; the fields sendmmsg needs are set.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_ifindex = ifindex as i32;
    addr.sll_halen = 6;
    addr.sll_addr[..6].copy_from_slice(&frames[0][..6]);
    let batch = bounds.batch.clamp(1, BATCH);
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(batch);
    // SAFETY: zeroed mmsghdrs are valid; they are filled before each call.
    let mut msgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; batch];
    let mut out = Sent::default();
    let mut next = 0usize;
    let started = Instant::now();
    while out.sent + out.refused < bounds.max_packets && started.elapsed() < bounds.duration {
        let want = batch.min((bounds.max_packets - out.sent - out.refused) as usize);
        iovs.clear();
        for i in 0..want {
            let f = &frames[(next + i) % frames.len()];
            iovs.push(libc::iovec {
                iov_base: f.as_ptr() as *mut libc::c_void,
                iov_len: f.len(),
            });
        }
        for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
            m.msg_hdr.msg_name = (&mut addr as *mut libc::sockaddr_ll).cast();
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_ll>() as u32;
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `want` headers, each pointing at live iovecs, frames and address.
        let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), want as u32, 0) };
        let taken = if n < 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::ENOBUFS) => 0,
                Some(libc::EINTR) => continue,
                _ => return Err(err).context("sendmmsg"),
            }
        } else {
            n as usize
        };
        out.sent += taken as u64;
        next += taken;
        if taken < want {
            // The frame after the last one taken was dropped by a full queue (the error
            // of a partly sent batch is not reported): count it and go past it.
            out.refused += 1;
            next += 1;
        }
        next %= frames.len();
        if !bounds.pause.is_zero() {
            std::thread::sleep(bounds.pause);
        }
    }
    out.elapsed = started.elapsed();
    Ok(out)
}
