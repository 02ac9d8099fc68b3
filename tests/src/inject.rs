//! Hand-made frames put on a namespace's wire (an `AF_PACKET` socket on its interface):
//! what the hostile-traffic scenarios send that no socket would, such as SYNs from
//! spoofed, unrouted sources.

use std::{ffi::CString, io, time::Duration};

use crate::netns::{NetNs, NetnsError};

/// Why frames could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("sending raw frames on {ifname}: {what}")]
    Io {
        ifname: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// How long one call may spend waiting out a full transmit queue (`ENOBUFS`) in all
/// (also [`crate::icmp_forge::send_raw_v4`]'s).
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
) -> Result<usize, InjectError> {
    let err = |what: &'static str| {
        let ifname = ifname.to_owned();
        move |source| InjectError::Io {
            ifname,
            what,
            source,
        }
    };
    let name = CString::new(ifname).map_err(|_| {
        err("interface name")(io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
    })?;
    ns.run(|| -> Result<usize, InjectError> {
        // SAFETY: plain socket(2); the fd is closed below on every path.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                0, // send only: no protocol to receive
            )
        };
        if fd < 0 {
            return Err(err("socket(AF_PACKET)")(io::Error::last_os_error()));
        }
        let result = (|| {
            // SAFETY: a NUL-terminated name.
            let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if index == 0 {
                return Err(err("if_nametoindex")(io::Error::last_os_error()));
            }
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
        })();
        // SAFETY: our own fd, closed once.
        unsafe { libc::close(fd) };
        result
    })?
}
