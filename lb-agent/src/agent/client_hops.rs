//! [`ClientHops`]: the cluster component's cache of this node's next hop toward each
//! client seen in a replica (the MAC a reply taken over before any client packet is sent
//! to), looked up again as it ages without ever losing a MAC it knew.

use std::{collections::HashMap, mem, net::IpAddr, time::Duration};

use lb_common::maps::HopMove;
use tokio::time::Instant;

/// Client next-hop MACs kept at most per generation; a full one starts the next.
const CLIENT_MACS: usize = 65_536;

/// How long a generation lasts: at the first refresh after it, its MACs become the
/// previous generation's, so that each client is looked up again with its next replica
/// (a router toward it may have moved to another MAC), and until then keeps the MAC
/// known before.
const GENERATION: Duration = Duration::from_secs(30);

/// Two generations of client next-hop MACs.
pub struct ClientHops {
    current: HashMap<IpAddr, [u8; 6]>,
    previous: HashMap<IpAddr, [u8; 6]>,
    since: Instant,
}

impl Default for ClientHops {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientHops {
    pub fn new() -> Self {
        ClientHops {
            current: HashMap::new(),
            previous: HashMap::new(),
            since: Instant::now(),
        }
    }

    /// The MAC to install toward `client`: this generation's, else the previous one's.
    pub fn get(&self, client: &IpAddr) -> Option<[u8; 6]> {
        self.current
            .get(client)
            .or_else(|| self.previous.get(client))
            .copied()
    }

    /// Whether `client` was looked up in this generation (else: look it up).
    pub fn fresh(&self, client: &IpAddr) -> bool {
        self.current.contains_key(client)
    }

    /// Keeps what a lookup found.
    pub fn learn(&mut self, client: IpAddr, mac: [u8; 6]) {
        if self.current.len() >= CLIENT_MACS {
            self.start_over();
        }
        self.current.insert(client, mac);
    }

    /// Starts the next generation if this one has lasted [`GENERATION`].
    pub fn age(&mut self) {
        if self.since.elapsed() >= GENERATION {
            self.start_over();
        }
    }

    /// A client whose next hop is `mac`, if any is known.
    pub fn one_behind(&self, mac: [u8; 6]) -> Option<IpAddr> {
        self.current
            .iter()
            .chain(&self.previous)
            .find(|(_, m)| **m == mac)
            .map(|(ip, _)| *ip)
    }

    /// Every client behind a moved next hop takes its new MAC.
    pub fn follow(&mut self, moves: &[HopMove]) {
        for mac in self.current.values_mut().chain(self.previous.values_mut()) {
            if let Some(new) = HopMove::apply(moves, *mac) {
                *mac = new;
            }
        }
    }

    fn start_over(&mut self) {
        self.previous = mem::take(&mut self.current);
        self.since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    #[tokio::test(start_paused = true)]
    async fn an_aged_mac_is_looked_up_again_and_used_until_an_answer_replaces_it() {
        let mut hops = ClientHops::new();
        hops.learn(ip(1), A);
        hops.age();
        assert!(hops.fresh(&ip(1)), "young: no lookup");
        tokio::time::advance(GENERATION).await;
        hops.age();
        assert!(!hops.fresh(&ip(1)), "aged: looked up again");
        assert_eq!(hops.get(&ip(1)), Some(A), "and still known meanwhile");
        hops.learn(ip(1), B);
        assert_eq!(hops.get(&ip(1)), Some(B));
        // Two generations later a client never looked up again is forgotten.
        tokio::time::advance(GENERATION).await;
        hops.age();
        tokio::time::advance(GENERATION).await;
        hops.age();
        assert_eq!(hops.get(&ip(1)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_move_reaches_both_generations() {
        let mut hops = ClientHops::new();
        hops.learn(ip(1), A);
        tokio::time::advance(GENERATION).await;
        hops.age();
        hops.learn(ip(2), A);
        hops.learn(ip(3), B);
        assert!(hops.one_behind(A).is_some());
        hops.follow(&[HopMove { old: A, new: B }]);
        assert_eq!(
            [ip(1), ip(2), ip(3)].map(|c| hops.get(&c)),
            [Some(B); 3],
            "every client behind A"
        );
        assert_eq!(hops.one_behind(A), None);
    }
}
