//! What a netlink request can fail with: the socket, the kernel's refusal (errno and
//! extended-ack message), or an answer that does not decode.

use std::io;

/// A netlink request that failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Socket(#[source] io::Error),
    /// The kernel refused the request, with its extended-ack message when it gave one.
    #[error("{source}{}", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Refused {
        #[source]
        source: io::Error,
        message: Option<String>,
    },
    #[error("undecodable answer from the kernel: {0}")]
    Decode(String),
}

impl NetlinkError {
    /// The errno of a refusal or of a failed socket call.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Socket(source) | NetlinkError::Refused { source, .. } => {
                source.raw_os_error()
            }
            NetlinkError::Decode(_) => None,
        }
    }

    /// The kernel's extended-ack message of a refusal.
    pub fn message(&self) -> Option<&str> {
        match self {
            NetlinkError::Refused { message, .. } => message.as_deref(),
            _ => None,
        }
    }
}
