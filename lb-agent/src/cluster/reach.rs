//! One QUIC handshake with a peer's sync address, with the cluster's identity: whether
//! the peer answers and holds the same key (what `doctor` checks).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::identity::{Identity, SERVER_NAME};
use super::is_crypto;

/// How a handshake with a peer went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Completed, in this long: the peer runs and holds the same key.
    Up(Duration),
    /// The handshake failed on the certificate: the peer holds another key.
    WrongKey,
    /// No handshake: why.
    NoAnswer(String),
}

/// Handshakes with the sync endpoint at `peer`, giving up after `within`.
pub async fn reach(identity: &Identity, peer: SocketAddr, within: Duration) -> Reach {
    let local: SocketAddr = if peer.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let mut endpoint = match quinn::Endpoint::client(local) {
        Ok(e) => e,
        Err(e) => return Reach::NoAnswer(format!("no local socket: {e}")),
    };
    endpoint.set_default_client_config(identity.client_config());
    let start = Instant::now();
    let connecting = match endpoint.connect(peer, SERVER_NAME) {
        Ok(c) => c,
        Err(e) => return Reach::NoAnswer(e.to_string()),
    };
    let reach = match tokio::time::timeout(within, connecting).await {
        Ok(Ok(conn)) => {
            conn.close(0u8.into(), b"reachability check");
            Reach::Up(start.elapsed())
        }
        Ok(Err(e)) if is_crypto(&e) => Reach::WrongKey,
        Ok(Err(e)) => Reach::NoAnswer(e.to_string()),
        Err(_) => Reach::NoAnswer(format!("no answer within {within:?}")),
    };
    endpoint.wait_idle().await;
    reach
}
