//! rtnetlink for XDP: which program an interface runs (`RTM_GETLINK`, `IFLA_XDP`), and
//! attaching, replacing (`XDP_FLAGS_REPLACE` + `IFLA_XDP_EXPECTED_FD`) or removing it
//! (`RTM_SETLINK`). A program attached this way stays attached when the process exits,
//! unlike one held by a `bpf_link`; that is what lets a restart find it again.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLA_F_NESTED: u16 = 1 << 15;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NETLINK_CAP_ACK: libc::c_int = 10;
const NETLINK_EXT_ACK: libc::c_int = 11;

const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_EXPECTED_FD: u16 = 8;

/// Fail with `EBUSY` when a program is already attached.
pub const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1 << 0;
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// Replace only the program given by `IFLA_XDP_EXPECTED_FD`.
pub const XDP_FLAGS_REPLACE: u32 = 1 << 4;

const NLMSG_HDR: usize = 16;
const IFINFOMSG: usize = 16;

/// How an XDP program is attached (`IFLA_XDP_ATTACHED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttached {
    Driver,
    Generic,
    Offload,
    /// Several modes at once (not something lb does).
    Multi,
}

impl XdpAttached {
    /// The mode flag that addresses this attachment.
    pub fn flags(self) -> u32 {
        match self {
            XdpAttached::Generic => XDP_FLAGS_SKB_MODE,
            _ => XDP_FLAGS_DRV_MODE,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            XdpAttached::Driver => "native",
            XdpAttached::Generic => "generic",
            XdpAttached::Offload => "offload",
            XdpAttached::Multi => "multiple modes",
        }
    }
}

/// The XDP program an interface runs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpProgram {
    pub id: u32,
    pub mode: XdpAttached,
}

/// A refusal by the kernel, with its extended-ack message when it gave one.
#[derive(Debug, thiserror::Error)]
#[error("{source}{}", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
pub struct NetlinkError {
    #[source]
    pub source: io::Error,
    pub message: Option<String>,
}

impl NetlinkError {
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

impl From<io::Error> for NetlinkError {
    fn from(source: io::Error) -> Self {
        NetlinkError {
            source,
            message: None,
        }
    }
}

/// The XDP program attached to interface `ifindex`, if any.
pub fn query_xdp(ifindex: u32) -> Result<Option<XdpProgram>, NetlinkError> {
    let sock = Socket::open()?;
    let msg = Message::new(RTM_GETLINK, NLM_F_REQUEST, ifindex);
    sock.send(&msg.finish())?;
    let mut attached = None;
    let mut prog_id = 0u32;
    let replies = sock.receive_until_reply()?;
    let Some(link) = replies.iter().find(|m| m.kind == RTM_NEWLINK) else {
        return Err(io::Error::other("no RTM_NEWLINK answer to RTM_GETLINK").into());
    };
    let attrs = link.payload.get(IFINFOMSG..).unwrap_or_default();
    for (kind, value) in Attrs(attrs) {
        if kind & !NLA_F_NESTED != IFLA_XDP {
            continue;
        }
        for (kind, value) in Attrs(value) {
            match kind & !NLA_F_NESTED {
                IFLA_XDP_ATTACHED => {
                    attached = match value.first() {
                        Some(1) => Some(XdpAttached::Driver),
                        Some(2) => Some(XdpAttached::Generic),
                        Some(3) => Some(XdpAttached::Offload),
                        Some(4) => Some(XdpAttached::Multi),
                        _ => None,
                    }
                }
                IFLA_XDP_PROG_ID => prog_id = read_u32(value),
                _ => {}
            }
        }
    }
    Ok(attached
        .filter(|_| prog_id != 0)
        .map(|mode| XdpProgram { id: prog_id, mode }))
}

/// Sets the XDP program of `ifindex` to `prog` (`None` removes it). With `expected`, the
/// kernel replaces only that program (`XDP_FLAGS_REPLACE`), atomically; `flags` carry
/// the mode and `XDP_FLAGS_UPDATE_IF_NOEXIST`.
pub fn set_xdp(
    ifindex: u32,
    prog: Option<BorrowedFd<'_>>,
    expected: Option<BorrowedFd<'_>>,
    mut flags: u32,
) -> Result<(), NetlinkError> {
    let sock = Socket::open()?;
    let mut msg = Message::new(RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, ifindex);
    let nest = msg.begin_nest(IFLA_XDP);
    msg.attr(
        IFLA_XDP_FD,
        &prog.map_or(-1, |fd| fd.as_raw_fd()).to_ne_bytes(),
    );
    if let Some(old) = expected {
        flags |= XDP_FLAGS_REPLACE;
        msg.attr(IFLA_XDP_EXPECTED_FD, &old.as_raw_fd().to_ne_bytes());
    }
    msg.attr(IFLA_XDP_FLAGS, &flags.to_ne_bytes());
    msg.end_nest(nest);
    sock.send(&msg.finish())?;
    sock.receive_until_reply().map(|_| ())
}

fn read_u32(value: &[u8]) -> u32 {
    value
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

/// A request being built: header, `ifinfomsg`, attributes.
struct Message {
    buf: Vec<u8>,
}

impl Message {
    fn new(kind: u16, flags: u16, ifindex: u32) -> Self {
        let mut buf = vec![0u8; NLMSG_HDR + IFINFOMSG];
        buf[4..6].copy_from_slice(&kind.to_ne_bytes());
        buf[6..8].copy_from_slice(&flags.to_ne_bytes());
        buf[8..12].copy_from_slice(&1u32.to_ne_bytes()); // sequence
        // ifinfomsg: family AF_UNSPEC, type 0, index, flags 0, change 0.
        buf[NLMSG_HDR + 4..NLMSG_HDR + 8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
        Message { buf }
    }

    fn attr(&mut self, kind: u16, value: &[u8]) {
        let len = 4 + value.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(self.buf.len().next_multiple_of(4), 0);
    }

    fn begin_nest(&mut self, kind: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        at
    }

    fn end_nest(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

/// Netlink attributes (`len`, `type`, value) of a buffer.
struct Attrs<'a>(&'a [u8]);

impl<'a> Iterator for Attrs<'a> {
    type Item = (u16, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let buf = self.0;
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]);
        if len < 4 || len > buf.len() {
            return None;
        }
        let value = &buf[4..len];
        self.0 = buf.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((kind, value))
    }
}

/// One received message.
struct Reply {
    kind: u16,
    payload: Vec<u8>,
}

struct Socket {
    fd: OwnedFd,
}

impl Socket {
    fn open() -> io::Result<Self> {
        // SAFETY: plain socket call; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let one: libc::c_int = 1;
        for opt in [NETLINK_EXT_ACK, NETLINK_CAP_ACK] {
            // SAFETY: valid fd and option value; failure only loses the error text.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_NETLINK,
                    opt,
                    (&one as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        Ok(Socket { fd })
    }

    fn send(&self, msg: &[u8]) -> io::Result<()> {
        // SAFETY: zeroed sockaddr_nl addresses the kernel (pid 0).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: the buffer and address are valid for the call.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads messages until the request's answer is complete: an `NLMSG_ERROR` (an ack
    /// with error 0 is success), `NLMSG_DONE`, or a non-multipart reply.
    fn receive_until_reply(&self) -> Result<Vec<Reply>, NetlinkError> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error().into());
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= NLMSG_HDR {
                let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
                let kind = u16::from_ne_bytes([rest[4], rest[5]]);
                let flags = u16::from_ne_bytes([rest[6], rest[7]]);
                if len < NLMSG_HDR || len > rest.len() {
                    return Err(io::Error::other("truncated netlink message").into());
                }
                let payload = &rest[NLMSG_HDR..len];
                match kind {
                    NLMSG_ERROR => return ack(payload, flags).map(|()| out),
                    NLMSG_DONE => return Ok(out),
                    _ => {
                        out.push(Reply {
                            kind,
                            payload: payload.to_vec(),
                        });
                        if flags & 2 == 0 {
                            // Not NLM_F_MULTI: this was the whole answer.
                            return Ok(out);
                        }
                    }
                }
                rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
            }
        }
    }
}

/// An `nlmsgerr`: error 0 is an ack; else the errno and the extended-ack message.
fn ack(payload: &[u8], flags: u16) -> Result<(), NetlinkError> {
    let errno = payload
        .get(..4)
        .map_or(0, |b| i32::from_ne_bytes(b.try_into().expect("4 bytes")));
    if errno == 0 {
        return Ok(());
    }
    let mut message = None;
    if flags & NLM_F_ACK_TLVS != 0 {
        // With NETLINK_CAP_ACK only the original request's header follows the errno.
        let tlvs = payload.get(4 + NLMSG_HDR..).unwrap_or_default();
        for (kind, value) in Attrs(tlvs) {
            if kind == NLMSGERR_ATTR_MSG {
                let text = value.split(|&b| b == 0).next().unwrap_or_default();
                message = Some(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
    Err(NetlinkError {
        source: io::Error::from_raw_os_error(-errno),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setlink_request_nests_the_xdp_attributes() {
        let mut msg = Message::new(RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, 7);
        let nest = msg.begin_nest(IFLA_XDP);
        msg.attr(IFLA_XDP_FD, &5i32.to_ne_bytes());
        msg.attr(IFLA_XDP_FLAGS, &XDP_FLAGS_DRV_MODE.to_ne_bytes());
        msg.end_nest(nest);
        let buf = msg.finish();
        assert_eq!(
            u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize,
            buf.len()
        );
        assert_eq!(u16::from_ne_bytes([buf[4], buf[5]]), RTM_SETLINK);
        assert_eq!(i32::from_ne_bytes(buf[20..24].try_into().unwrap()), 7);
        let attrs: Vec<_> = Attrs(&buf[NLMSG_HDR + IFINFOMSG..]).collect();
        assert_eq!(attrs.len(), 1);
        assert_eq!(attrs[0].0, IFLA_XDP | NLA_F_NESTED);
        let inner: Vec<_> = Attrs(attrs[0].1).collect();
        assert_eq!(inner[0], (IFLA_XDP_FD, &5i32.to_ne_bytes()[..]));
        assert_eq!(
            inner[1],
            (IFLA_XDP_FLAGS, &XDP_FLAGS_DRV_MODE.to_ne_bytes()[..])
        );
    }

    #[test]
    fn an_error_ack_carries_errno_and_the_kernel_message() {
        let mut payload = (-libc::EBUSY).to_ne_bytes().to_vec();
        payload.extend_from_slice(&[0u8; NLMSG_HDR]); // the capped original header
        let text = b"XDP program already attached\0";
        payload.extend_from_slice(&((4 + text.len()) as u16).to_ne_bytes());
        payload.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        payload.extend_from_slice(text);
        let err = ack(&payload, NLM_F_ACK_TLVS).unwrap_err();
        assert_eq!(err.errno(), Some(libc::EBUSY));
        assert_eq!(err.message.as_deref(), Some("XDP program already attached"));
        assert!(err.to_string().contains("(XDP program already attached)"));
        assert!(ack(&0i32.to_ne_bytes(), 0).is_ok());
    }
}
