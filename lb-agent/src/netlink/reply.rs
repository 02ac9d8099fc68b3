//! What one message from the kernel means for the request it answers: an answer, the
//! end (acknowledgement or end of dump), or a refusal with its errno and the text of
//! the extended acknowledgement (`NLMSGERR_ATTR_MSG`).

use std::io;

use netlink_packet_core::{
    NLM_F_ACK_TLVS, NLM_F_CAPPED, NetlinkMessage, NetlinkPayload, NlasIterator,
};

use super::NetlinkError;

/// `NLMSGERR_ATTR_MSG`: the kernel's text for a refusal.
const NLMSGERR_ATTR_MSG: u16 = 1;
/// Length of a netlink message header.
const NLMSG_HDRLEN: usize = 16;

/// One message of the answer to a request.
pub(super) enum Reply<M> {
    /// A message of the answer (the object asked for, one entry of a dump).
    Answer(M),
    /// The acknowledgement or the end of the dump: the answer is complete.
    Complete,
    /// Nothing for the request (a no-op message).
    Other,
}

/// Reads one message; a refusal is the error.
pub(super) fn reply<M>(msg: NetlinkMessage<M>) -> Result<Reply<M>, NetlinkError> {
    match msg.payload {
        NetlinkPayload::InnerMessage(m) => Ok(Reply::Answer(m)),
        NetlinkPayload::Done(_) => Ok(Reply::Complete),
        NetlinkPayload::Error(e) => match e.code {
            None => Ok(Reply::Complete),
            Some(code) => Err(NetlinkError::Refused {
                source: io::Error::from_raw_os_error(-code.get()),
                message: extack_message(msg.header.flags, &e.header),
            }),
        },
        _ => Ok(Reply::Other),
    }
}

/// The `NLMSGERR_ATTR_MSG` of an error's payload (after the errno): the original
/// request (only its header when `NLM_F_CAPPED`), then the attributes when
/// `NLM_F_ACK_TLVS`.
fn extack_message(flags: u16, payload: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let request_len = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        let len = payload.get(..4)?;
        u32::from_ne_bytes(len.try_into().ok()?) as usize
    };
    let attributes = payload.get(request_len.next_multiple_of(4)..)?;
    NlasIterator::new(attributes)
        .filter_map(Result::ok)
        .find(|nla| nla.kind() == NLMSGERR_ATTR_MSG)
        .map(|nla| {
            let text = nla.value().split(|&b| b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(text).into_owned()
        })
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroI32;

    use netlink_packet_core::{ErrorMessage, NetlinkHeader};
    use netlink_packet_route::RouteNetlinkMessage;

    use super::*;

    fn refusal(flags: u16, payload: Vec<u8>) -> NetlinkError {
        let mut error = ErrorMessage::default();
        error.code = NonZeroI32::new(-libc::EBUSY);
        error.header = payload;
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        match reply(NetlinkMessage::<RouteNetlinkMessage>::new(
            header,
            NetlinkPayload::Error(error),
        )) {
            Err(err) => err,
            Ok(_) => panic!("an error code is a refusal"),
        }
    }

    fn message_attribute(text: &[u8]) -> Vec<u8> {
        let mut nla = ((4 + text.len()) as u16).to_ne_bytes().to_vec();
        nla.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        nla.extend_from_slice(text);
        nla
    }

    #[test]
    fn a_refusal_carries_errno_and_the_kernel_message_after_a_capped_request() {
        let mut payload = vec![0u8; NLMSG_HDRLEN];
        payload.extend(message_attribute(b"XDP program already attached\0"));
        let err = refusal(NLM_F_ACK_TLVS | NLM_F_CAPPED, payload);
        assert_eq!(err.errno(), Some(libc::EBUSY));
        assert_eq!(err.message(), Some("XDP program already attached"));
        assert!(err.to_string().contains("(XDP program already attached)"));
    }

    #[test]
    fn the_kernel_message_follows_a_whole_request_when_not_capped() {
        let mut payload = 22u32.to_ne_bytes().to_vec();
        payload.resize(24, 0);
        payload.extend(message_attribute(b"unsupported\0"));
        let err = refusal(NLM_F_ACK_TLVS, payload);
        assert_eq!(err.message(), Some("unsupported"));
    }

    #[test]
    fn a_refusal_without_attributes_has_no_message() {
        let err = refusal(0, vec![0u8; NLMSG_HDRLEN]);
        assert_eq!(err.errno(), Some(libc::EBUSY));
        assert_eq!(err.message(), None);
        assert!(matches!(
            reply(NetlinkMessage::<RouteNetlinkMessage>::new(
                NetlinkHeader::default(),
                NetlinkPayload::Error(ErrorMessage::default())
            )),
            Ok(Reply::Complete)
        ));
    }
}
