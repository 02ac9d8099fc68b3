//! Generic netlink (`NETLINK_GENERIC`): a message of any family — its command, version
//! and attributes — and the controller's lookup of a family's id by its name.

use netlink_packet_core::{
    DefaultNla, Emitable, NetlinkDeserializable, NetlinkHeader, NetlinkSerializable, NlasIterator,
};
use netlink_sys::protocols::NETLINK_GENERIC;

use super::{NetlinkError, request::request_on};

/// The controller family's fixed id (`GENL_ID_CTRL`).
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// Length of `struct genlmsghdr`: command, version, two reserved bytes.
const GENL_HDRLEN: usize = 4;

/// One generic netlink message: the family's id is its netlink message type; each
/// attribute is its kind and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenericMessage {
    pub family: u16,
    pub command: u8,
    pub version: u8,
    pub attributes: Vec<(u16, Vec<u8>)>,
}

impl GenericMessage {
    /// The value of attribute `kind`, if present.
    pub fn attribute(&self, kind: u16) -> Option<&[u8]> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, value)| value.as_slice())
    }

    fn nlas(&self) -> Vec<DefaultNla> {
        self.attributes
            .iter()
            .map(|(kind, value)| DefaultNla::new(*kind, value.clone()))
            .collect()
    }
}

impl NetlinkSerializable for GenericMessage {
    fn message_type(&self) -> u16 {
        self.family
    }

    fn buffer_len(&self) -> usize {
        GENL_HDRLEN + self.nlas().as_slice().buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[0] = self.command;
        buffer[1] = self.version;
        buffer[2..GENL_HDRLEN].fill(0);
        self.nlas().as_slice().emit(&mut buffer[GENL_HDRLEN..]);
    }
}

/// Why an answer is not a generic netlink message.
#[derive(Debug, thiserror::Error)]
#[error("a generic netlink message of {0} bytes, shorter than its header")]
pub struct ShortMessage(usize);

impl NetlinkDeserializable for GenericMessage {
    type Error = ShortMessage;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        if payload.len() < GENL_HDRLEN {
            return Err(ShortMessage(payload.len()));
        }
        let attributes = NlasIterator::new(&payload[GENL_HDRLEN..])
            .filter_map(Result::ok)
            .map(|nla| (nla.kind(), nla.value().to_vec()))
            .collect();
        Ok(GenericMessage {
            family: header.message_type,
            command: payload[0],
            version: payload[1],
            attributes,
        })
    }
}

/// Sends `msg` on a generic netlink socket of its own and collects the answers up to
/// the acknowledgement (or the end of a dump).
pub fn request(msg: GenericMessage, flags: u16) -> Result<Vec<GenericMessage>, NetlinkError> {
    request_on(NETLINK_GENERIC, msg, flags)
}

/// The id of generic netlink family `name`; `None` when this kernel has no such family.
pub fn family_id(name: &str) -> Result<Option<u16>, NetlinkError> {
    let mut family_name = name.as_bytes().to_vec();
    family_name.push(0);
    let ask = GenericMessage {
        family: GENL_ID_CTRL,
        command: CTRL_CMD_GETFAMILY,
        version: 1,
        attributes: vec![(CTRL_ATTR_FAMILY_NAME, family_name)],
    };
    let answers = match request(ask, 0) {
        Ok(answers) => answers,
        Err(err) if err.errno() == Some(libc::ENOENT) => return Ok(None),
        Err(err) => return Err(err),
    };
    answers
        .iter()
        .find_map(|m| m.attribute(CTRL_ATTR_FAMILY_ID))
        .and_then(|id| Some(u16::from_ne_bytes(id.try_into().ok()?)))
        .map(Some)
        .ok_or_else(|| NetlinkError::Decode(format!("no id in the answer for family {name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_names_its_own_family_and_knows_no_invented_one() {
        assert_eq!(family_id("nlctrl").expect("nlctrl"), Some(GENL_ID_CTRL));
        assert_eq!(family_id("no-such-family").expect("lookup"), None);
    }
}
