//! XDP through rtnetlink: which program an interface runs (`RTM_GETLINK`, `IFLA_XDP`),
//! and attaching, replacing (`XDP_FLAGS_REPLACE` + `IFLA_XDP_EXPECTED_FD`) or removing it
//! (`RTM_SETLINK`). A program attached this way stays attached when the process exits,
//! unlike one held by a `bpf_link`; that is what lets a restart find it again.

use std::os::fd::{AsRawFd, BorrowedFd};

use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{self, LinkAttribute, LinkMessage, LinkXdp},
};

use super::{NetlinkError, request};

/// Fail with `EBUSY` when a program is already attached.
pub const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1 << 0;
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// Replace only the program given by `IFLA_XDP_EXPECTED_FD`.
pub const XDP_FLAGS_REPLACE: u32 = 1 << 4;

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

    /// The mode the kernel reports; `None` when no program is attached.
    fn from_kernel(attached: link::XdpAttached) -> Option<Self> {
        match attached {
            link::XdpAttached::Driver => Some(XdpAttached::Driver),
            link::XdpAttached::SocketBuffer => Some(XdpAttached::Generic),
            link::XdpAttached::Hardware => Some(XdpAttached::Offload),
            link::XdpAttached::Multiple => Some(XdpAttached::Multi),
            _ => None,
        }
    }
}

/// The XDP program an interface runs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpProgram {
    pub id: u32,
    pub mode: XdpAttached,
}

/// The XDP program attached to interface `ifindex`, if any.
pub fn query_xdp(ifindex: u32) -> Result<Option<XdpProgram>, NetlinkError> {
    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    let answers = request(RouteNetlinkMessage::GetLink(msg), 0)?;
    answers
        .iter()
        .find_map(|m| match m {
            RouteNetlinkMessage::NewLink(link) => Some(attached_program(link)),
            _ => None,
        })
        .ok_or_else(|| NetlinkError::Decode("no RTM_NEWLINK answer to RTM_GETLINK".into()))
}

/// Sets the XDP program of `ifindex` to `prog` (`None` removes it). With `expected`, the
/// kernel replaces only that program (`XDP_FLAGS_REPLACE`), atomically; `flags` carry
/// the mode and `XDP_FLAGS_UPDATE_IF_NOEXIST`.
pub fn set_xdp(
    ifindex: u32,
    prog: Option<BorrowedFd<'_>>,
    expected: Option<BorrowedFd<'_>>,
    flags: u32,
) -> Result<(), NetlinkError> {
    request(
        RouteNetlinkMessage::SetLink(set_xdp_message(ifindex, prog, expected, flags)),
        0,
    )
    .map(drop)
}

/// The `RTM_SETLINK` message of [`set_xdp`].
fn set_xdp_message(
    ifindex: u32,
    prog: Option<BorrowedFd<'_>>,
    expected: Option<BorrowedFd<'_>>,
    mut flags: u32,
) -> LinkMessage {
    let mut xdp = vec![LinkXdp::Fd(prog.map_or(-1, |fd| fd.as_raw_fd()))];
    if let Some(old) = expected {
        flags |= XDP_FLAGS_REPLACE;
        // The kernel reads a signed descriptor; the crate types it `u32`, and an open
        // descriptor is never negative.
        xdp.push(LinkXdp::ExpectedFd(old.as_raw_fd() as u32));
    }
    xdp.push(LinkXdp::Flags(flags));
    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    msg.attributes.push(LinkAttribute::Xdp(xdp));
    msg
}

/// The program in a link's `IFLA_XDP`: it needs both its mode and a non-zero id.
fn attached_program(link: &LinkMessage) -> Option<XdpProgram> {
    let xdp = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Xdp(xdp) => Some(xdp),
        _ => None,
    })?;
    let mut mode = None;
    let mut id = 0;
    for attr in xdp {
        match attr {
            LinkXdp::Attached(attached) => mode = XdpAttached::from_kernel(*attached),
            LinkXdp::ProgId(prog_id) => id = *prog_id,
            _ => {}
        }
    }
    mode.filter(|_| id != 0).map(|mode| XdpProgram { id, mode })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use netlink_packet_core::{NetlinkMessage, NetlinkPayload};

    use super::*;

    /// The message as the kernel reads it: serialized, then parsed back.
    fn on_the_wire(msg: &LinkMessage) -> LinkMessage {
        let mut packet = NetlinkMessage::from(RouteNetlinkMessage::SetLink(msg.clone()));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf)
            .expect("a netlink message")
            .payload
        {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::SetLink(parsed)) => parsed,
            other => panic!("not a link message: {other:?}"),
        }
    }

    #[test]
    fn a_replacement_names_the_new_and_the_expected_program_and_the_replace_flag() {
        let new = std::fs::File::open("/dev/null").unwrap();
        let old = std::fs::File::open("/dev/null").unwrap();
        let msg = set_xdp_message(7, Some(new.as_fd()), Some(old.as_fd()), XDP_FLAGS_DRV_MODE);
        let parsed = on_the_wire(&msg);
        assert_eq!(parsed.header.index, 7);
        assert_eq!(
            parsed.attributes,
            vec![LinkAttribute::Xdp(vec![
                LinkXdp::Fd(new.as_raw_fd()),
                LinkXdp::ExpectedFd(old.as_raw_fd() as u32),
                LinkXdp::Flags(XDP_FLAGS_DRV_MODE | XDP_FLAGS_REPLACE),
            ])]
        );
    }

    #[test]
    fn a_removal_sends_descriptor_minus_one() {
        let msg = set_xdp_message(3, None, None, XDP_FLAGS_SKB_MODE);
        assert_eq!(
            on_the_wire(&msg).attributes,
            vec![LinkAttribute::Xdp(vec![
                LinkXdp::Fd(-1),
                LinkXdp::Flags(XDP_FLAGS_SKB_MODE)
            ])]
        );
    }

    #[test]
    fn the_attached_program_needs_a_mode_and_an_id() {
        let link = |xdp: Vec<LinkXdp>| {
            let mut msg = LinkMessage::default();
            msg.attributes.push(LinkAttribute::Xdp(xdp));
            msg
        };
        assert_eq!(
            attached_program(&link(vec![
                LinkXdp::Attached(link::XdpAttached::SocketBuffer),
                LinkXdp::ProgId(42),
            ])),
            Some(XdpProgram {
                id: 42,
                mode: XdpAttached::Generic
            })
        );
        assert_eq!(
            attached_program(&link(vec![LinkXdp::Attached(link::XdpAttached::None)])),
            None
        );
        assert_eq!(attached_program(&LinkMessage::default()), None);
    }
}
