//! One synchronous netlink request on a socket of its own, answered up to its
//! acknowledgement or the end of its dump: a refused change is an error with the
//! kernel's reason, never a silent no-op.

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use super::{
    NetlinkError,
    reply::{Reply, reply},
};

/// Sends the rtnetlink message `msg` with `flags` (plus `NLM_F_REQUEST | NLM_F_ACK`)
/// and collects the answers up to the acknowledgement (or the end of a dump).
pub fn request(
    msg: RouteNetlinkMessage,
    flags: u16,
) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
    request_on(NETLINK_ROUTE, msg, flags)
}

/// [`request`] on a socket of netlink `protocol` (`NETLINK_ROUTE`, `NETLINK_GENERIC`),
/// whose messages are `M`.
pub(super) fn request_on<M>(protocol: isize, msg: M, flags: u16) -> Result<Vec<M>, NetlinkError>
where
    M: NetlinkSerializable + NetlinkDeserializable,
{
    let socket = open(protocol)?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    header.sequence_number = 1;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    packet.finalize();
    let mut buf = vec![0u8; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket.send(&buf, 0).map_err(NetlinkError::Socket)?;

    let mut answers = Vec::new();
    loop {
        let (data, _) = socket.recv_from_full().map_err(NetlinkError::Socket)?;
        let mut rest = &data[..];
        while !rest.is_empty() {
            let msg = NetlinkMessage::<M>::deserialize(rest)
                .map_err(|e| NetlinkError::Decode(e.to_string()))?;
            let len = msg.header.length as usize;
            if len == 0 {
                return Err(NetlinkError::Decode("a message of length 0".into()));
            }
            rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
            match reply(msg)? {
                Reply::Answer(m) => answers.push(m),
                Reply::Complete => return Ok(answers),
                Reply::Other => {}
            }
        }
    }
}

/// A socket connected to the kernel that asks for extended acknowledgements, whose
/// errors carry only the request's header. `connect` binds it to a port of its own.
fn open(protocol: isize) -> Result<Socket, NetlinkError> {
    let socket = Socket::new(protocol).map_err(NetlinkError::Socket)?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(NetlinkError::Socket)?;
    // Without them (kernels before 4.12) errors only lose their text.
    let _ = socket.set_ext_ack(true);
    let _ = socket.set_cap_ack(true);
    Ok(socket)
}

#[cfg(test)]
pub(super) mod tests {
    use netlink_packet_core::NLM_F_DUMP;
    use netlink_packet_route::link::{LinkAttribute, LinkMessage};

    use super::*;

    /// An `RTM_GETLINK` whose name breaks the kernel's attribute policy (`IFNAMSIZ`):
    /// refused without any privilege, with an extended-ack message.
    pub(in crate::netlink) fn link_get_with_a_name_too_long() -> RouteNetlinkMessage {
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::IfName("a-name-longer-than-ifnamsiz".into()));
        RouteNetlinkMessage::GetLink(msg)
    }

    #[test]
    fn a_refusal_keeps_the_kernels_errno_and_message() {
        let err = request(link_get_with_a_name_too_long(), 0).unwrap_err();
        assert_eq!(err.errno(), Some(libc::ERANGE), "{err}");
        assert_eq!(err.message(), Some("Attribute failed policy validation"));

        let mut msg = LinkMessage::default();
        msg.header.index = i32::MAX as u32;
        let err = request(RouteNetlinkMessage::GetLink(msg), 0).unwrap_err();
        assert_eq!(err.errno(), Some(libc::ENODEV), "{err}");
    }

    #[test]
    fn a_dump_collects_every_answer_up_to_its_end() {
        let links = request(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            NLM_F_DUMP,
        )
        .expect("link dump");
        let lo = crate::netlink::link_index("lo").expect("lo");
        assert!(
            links.iter().any(
                |m| matches!(m, RouteNetlinkMessage::NewLink(link) if link.header.index == lo)
            )
        );
    }
}
