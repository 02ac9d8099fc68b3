//! Requests from async code: one rtnetlink connection whose task runs on the current
//! tokio runtime, shared by clones of [`Connection`].

use futures_util::StreamExt;
use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::AsyncSocket;

use super::{
    NetlinkError,
    reply::{Reply, reply},
};

/// An rtnetlink connection.
#[derive(Clone)]
pub struct Connection {
    handle: rtnetlink::Handle,
}

impl Connection {
    /// Opens the connection and spawns its task; must be called inside a tokio runtime.
    pub fn open() -> Result<Self, NetlinkError> {
        let (mut conn, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Socket)?;
        // Without it (kernels before 4.12) errors only lose their text.
        let _ = conn.socket_mut().socket_mut().set_ext_ack(true);
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// Sends `msg` with `flags` (plus `NLM_F_REQUEST | NLM_F_ACK`) and collects the
    /// answers up to the acknowledgement (or the end of a dump).
    pub async fn request(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        let mut replies = self
            .handle
            .clone()
            .request(req)
            .map_err(|e| NetlinkError::Socket(std::io::Error::other(e.to_string())))?;
        let mut answers = Vec::new();
        while let Some(msg) = replies.next().await {
            match reply(msg)? {
                Reply::Answer(m) => answers.push(m),
                Reply::Complete => break,
                Reply::Other => {}
            }
        }
        Ok(answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::request::tests::link_get_with_a_name_too_long;

    #[tokio::test]
    async fn a_refusal_keeps_the_kernels_errno_and_message() {
        let connection = Connection::open().expect("connection");
        let err = connection
            .request(link_get_with_a_name_too_long(), 0)
            .await
            .unwrap_err();
        assert_eq!(err.errno(), Some(libc::ERANGE), "{err}");
        assert_eq!(err.message(), Some("Attribute failed policy validation"));
    }
}
