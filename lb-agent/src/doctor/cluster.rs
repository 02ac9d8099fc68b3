//! `[cluster]`: the shared key file, the sync address, and a handshake with every peer
//! (docs/internals/cluster-sync.md).

use std::time::Duration;

use crate::cluster::{Identity, Reach, reach, read_key};
use crate::config::Config;

use super::Finding;

/// How long a peer may take to complete a handshake.
const HANDSHAKE: Duration = Duration::from_secs(2);

pub async fn check(cfg: &Config) -> Vec<Finding> {
    let Some(cluster) = &cfg.cluster else {
        return Vec::new();
    };
    let key = cluster.key_file.display();
    let identity = match read_key(&cluster.key_file).and_then(|k| Identity::derive(&k)) {
        Ok(identity) => identity,
        Err(e) => {
            return vec![Finding::blocker(
                "cluster key",
                format!("{e}: the agent cannot start its cluster sync"),
            )];
        }
    };
    let mut out = vec![Finding::ok(
        "cluster key",
        format!("{key}: readable by its owner only, long enough"),
    )];
    out.push(match std::net::UdpSocket::bind(cluster.listen) {
        Ok(_) => Finding::ok(
            "cluster listen",
            format!("{} can be bound (UDP)", cluster.listen),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Finding::ok(
            "cluster listen",
            format!(
                "{} is in use (the running agent's sync socket?)",
                cluster.listen
            ),
        ),
        Err(e) => Finding::blocker(
            "cluster listen",
            format!(
                "cannot bind {} ({e}): cluster.listen must be an address of this host",
                cluster.listen
            ),
        ),
    });
    for peer in &cluster.peers {
        let check = format!("cluster peer {}", peer.name);
        out.push(match reach(&identity, peer.address, HANDSHAKE).await {
            Reach::Up(took) => Finding::ok(
                check,
                format!(
                    "{}: handshake with the shared key in {took:.1?}",
                    peer.address
                ),
            ),
            Reach::WrongKey => Finding::blocker(
                check,
                format!(
                    "{} holds another key: copy {key} from a member to every node",
                    peer.address
                ),
            ),
            Reach::NoAnswer(why) => Finding::warning(
                check,
                format!(
                    "{}: {why}; its connections are not shared until it answers (its agent \
                     down, or UDP blocked on the way)",
                    peer.address
                ),
            ),
        });
    }
    out
}
