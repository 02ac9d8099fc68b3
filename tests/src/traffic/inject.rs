//! Hand-made frames put on a namespace's wire (an `AF_PACKET` socket on its interface):
//! what the hostile-traffic scenarios send that no socket would, such as SYNs from
//! spoofed, unrouted sources.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use crate::{net::netns::NetNs, util::error::Error};

/// How long one call may spend waiting out a full transmit queue (`ENOBUFS`) in all
/// (also [`crate::traffic::icmp_forge::send_raw_v4`]'s).
pub const FULL_QUEUE_BUDGET: Duration = Duration::from_secs(10);
/// The pause before a frame the full queue refused is sent again.
pub const FULL_QUEUE_PAUSE: Duration = Duration::from_micros(500);

/// Sends every frame of `frames` (complete Ethernet frames) out of `ifname` in `ns`,
/// pausing `gap` between two; returns how many the kernel took.
///
/// A burst can fill the interface's queue (a veth whose peer runs XDP holds a few
/// hundred frames): `sendto` then fails with `ENOBUFS` and the frame was not sent. The
/// frame is sent again after a short pause, as a real sender's queue would hold it,
/// for at most `FULL_QUEUE_BUDGET` per call; any other error ends the call.
pub fn send_frames(
    ns: &NetNs,
    ifname: &str,
    frames: &[Vec<u8>],
    gap: Duration,
) -> Result<usize, Error> {
    let err = |what: &'static str| {
        let ifname = ifname.to_owned();
        move |source| Error::Io {
            what: format!("sending raw frames on {ifname}: {what}"),
            source,
        }
    };
    ns.run(|| -> Result<usize, Error> {
        let (sock, index) = packet_socket(ifname).map_err(|(what, e)| err(what)(e))?;
        let fd = sock.as_raw_fd();
        // SAFETY: a zeroed sockaddr_ll is valid; we fill the fields sendto needs.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = index as i32;
        addr.sll_halen = 6;
        let mut sent = 0;
        let mut waited = Duration::ZERO;
        for frame in frames {
            addr.sll_addr[..6].copy_from_slice(&frame[..6]);
            loop {
                // SAFETY: the buffer and the address live across the call.
                let n = unsafe {
                    libc::sendto(
                        fd,
                        frame.as_ptr().cast(),
                        frame.len(),
                        0,
                        (&addr as *const libc::sockaddr_ll).cast(),
                        std::mem::size_of::<libc::sockaddr_ll>() as u32,
                    )
                };
                if n >= 0 {
                    break;
                }
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ENOBUFS) || waited >= FULL_QUEUE_BUDGET {
                    return Err(err("sendto")(e));
                }
                std::thread::sleep(FULL_QUEUE_PAUSE);
                waited += FULL_QUEUE_PAUSE;
            }
            sent += 1;
            if !gap.is_zero() {
                std::thread::sleep(gap);
            }
        }
        Ok(sent)
    })?
}

/// A send-only `AF_PACKET` socket and the index of `ifname`, in the calling thread's
/// network namespace (run it inside [`NetNs::run`]); on failure, the step that failed
/// and its error.
pub fn packet_socket(ifname: &str) -> Result<(OwnedFd, u32), (&'static str, io::Error)> {
    let name = CString::new(ifname).map_err(|_| {
        (
            "interface name",
            io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"),
        )
    })?;
    // SAFETY: plain socket(2), send only (no protocol to receive); owned below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(("socket(AF_PACKET)", io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this fd to us.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `name` is a CString, NUL-terminated and alive across the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(("if_nametoindex", io::Error::last_os_error()));
    }
    Ok((sock, index))
}
