//! The next-hop state: which next hop each backend takes, what the kernel's neighbour
//! table says about it, and the MAC (or none) each backend should have in the maps.
//!
//! Pure: the watch ([`super::watch`]) feeds it route answers and neighbour entries and
//! sends the [`MacUpdate`]s it returns to the agent, with the [`Moved`] neighbours it
//! noticed on the way ([`NextHops::take_moved`]).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::decode::{Mac, NeighEntry, Reach};

/// Beyond this many neighbours known on the interface, a deleted one that no backend
/// uses is forgotten (its last MAC too: its return is then no move).
const NEIGHBOURS_KEPT: usize = 65_536;

/// A backend's MAC changed: `None` = not usable (FAILED, INCOMPLETE, deleted, no route).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MacUpdate {
    pub backend: IpAddr,
    pub mac: Option<Mac>,
}

/// A neighbour on the interface answered from another link-layer address than the one
/// it last had (a NIC swapped, a VRRP or router failover, a host moved): whatever was
/// sent to `old` for it now belongs at `new`. Reported for every neighbour, not only
/// the backends' next hops: a router toward the clients is one too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moved {
    pub addr: IpAddr,
    pub old: Mac,
    pub new: Mac,
}

/// One batch from the watch to the agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NeighbourChanges {
    /// Backends whose MAC changed.
    pub backends: Vec<MacUpdate>,
    /// Neighbours whose link-layer address moved.
    pub moved: Vec<Moved>,
}

impl NeighbourChanges {
    pub fn is_empty(&self) -> bool {
        self.backends.is_empty() && self.moved.is_empty()
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Hop {
    /// The next hop the backend's MAC comes from (`None`: no route on the interface).
    current: Option<IpAddr>,
    /// A new next hop the route moved to, not resolved yet: the backend keeps the old
    /// one's MAC until this one is usable or FAILED (a route change costs no gap).
    pending: Option<IpAddr>,
    /// What was last sent for this backend.
    sent: Option<Option<Mac>>,
}

/// Next hops and neighbour entries on one interface.
#[derive(Debug, Default)]
pub struct NextHops {
    ifindex: u32,
    hops: HashMap<IpAddr, Hop>,
    /// The interface's entries as last seen; `None`: the kernel deleted it. An address
    /// never seen says nothing (its first event may still be queued on the socket).
    table: HashMap<IpAddr, Option<Reach>>,
    /// The last link-layer address each neighbour had, kept while it is FAILED or
    /// deleted, so a neighbour that comes back elsewhere is a move too.
    lladdr: HashMap<IpAddr, Mac>,
    /// Moves noticed since [`NextHops::take_moved`].
    moved: Vec<Moved>,
}

impl NextHops {
    pub fn new(ifindex: u32) -> Self {
        Self {
            ifindex,
            ..Default::default()
        }
    }

    /// The backends followed.
    pub fn backends(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.hops.keys().copied()
    }

    /// Backends whose new next hop waits for resolution, with that hop.
    pub fn pending(&self) -> impl Iterator<Item = (IpAddr, IpAddr)> + '_ {
        self.hops
            .iter()
            .filter_map(|(b, h)| h.pending.map(|p| (*b, p)))
    }

    /// Follows exactly `backends`; returns the ones new here (they need a route lookup).
    pub fn set_backends(&mut self, backends: &[IpAddr]) -> Vec<IpAddr> {
        let keep: HashSet<IpAddr> = backends.iter().copied().collect();
        self.hops.retain(|b, _| keep.contains(b));
        let mut fresh = Vec::new();
        for &b in backends {
            if let std::collections::hash_map::Entry::Vacant(v) = self.hops.entry(b) {
                v.insert(Hop::default());
                fresh.push(b);
            }
        }
        fresh
    }

    /// The kernel's route answer for `backend`: `Some(hop)` on the interface (the
    /// gateway, or the backend itself on-link), `None` (no route, or another interface).
    pub fn set_route(&mut self, backend: IpAddr, hop: Option<IpAddr>) -> Option<MacUpdate> {
        let table = &self.table;
        let h = self.hops.get_mut(&backend)?;
        match hop {
            Some(hop) if h.current.is_some() && h.current != Some(hop) => match table.get(&hop) {
                Some(Some(Reach::Usable(_) | Reach::Failed)) => {
                    h.current = Some(hop);
                    h.pending = None;
                }
                _ => h.pending = Some(hop),
            },
            _ => {
                h.current = hop;
                h.pending = None;
            }
        }
        self.evaluate(backend)
    }

    /// An entry was created or changed.
    pub fn neigh(&mut self, entry: NeighEntry) -> Vec<MacUpdate> {
        if entry.ifindex != self.ifindex {
            return Vec::new();
        }
        self.table.insert(entry.addr, Some(entry.reach));
        self.note_lladdr(entry.addr, entry.reach);
        if matches!(entry.reach, Reach::Usable(_) | Reach::Failed) {
            for h in self.hops.values_mut() {
                if h.pending == Some(entry.addr) {
                    h.current = h.pending.take();
                }
            }
        }
        self.evaluate_hop(entry.addr)
    }

    /// The kernel deleted its entry for `addr`.
    pub fn neigh_gone(&mut self, ifindex: u32, addr: IpAddr) -> Vec<MacUpdate> {
        if ifindex != self.ifindex {
            return Vec::new();
        }
        let in_use = self
            .hops
            .values()
            .any(|h| h.current == Some(addr) || h.pending == Some(addr));
        if !in_use && self.table.len() > NEIGHBOURS_KEPT {
            // Many neighbours come and go (clients on the segment): one no backend uses
            // is forgotten once deleted, so the state stays bounded.
            self.table.remove(&addr);
            self.lladdr.remove(&addr);
            return Vec::new();
        }
        self.table.insert(addr, None);
        self.evaluate_hop(addr)
    }

    /// A full dump of the interface's table replaces what was known (after an overflow
    /// of the multicast socket, when events were lost).
    pub fn replace_table(&mut self, entries: &[NeighEntry]) -> Vec<MacUpdate> {
        self.table = entries
            .iter()
            .filter(|e| e.ifindex == self.ifindex)
            .map(|e| (e.addr, Some(e.reach)))
            .collect();
        let ifindex = self.ifindex;
        for e in entries.iter().filter(|e| e.ifindex == ifindex) {
            self.note_lladdr(e.addr, e.reach);
        }
        // A next hop in use missing from the dump was deleted meanwhile.
        for h in self.hops.values() {
            for hop in [h.current, h.pending].into_iter().flatten() {
                self.table.entry(hop).or_insert(None);
            }
        }
        let pending: Vec<(IpAddr, IpAddr)> = self.pending().collect();
        for (b, hop) in pending {
            if matches!(
                self.table.get(&hop),
                Some(Some(Reach::Usable(_) | Reach::Failed))
            ) {
                let h = self.hops.get_mut(&b).expect("pending backend is followed");
                h.current = h.pending.take();
            }
        }
        let backends: Vec<IpAddr> = self.hops.keys().copied().collect();
        backends
            .into_iter()
            .filter_map(|b| self.evaluate(b))
            .collect()
    }

    /// The neighbours whose link-layer address moved since the last call.
    pub fn take_moved(&mut self) -> Vec<Moved> {
        std::mem::take(&mut self.moved)
    }

    fn note_lladdr(&mut self, addr: IpAddr, reach: Reach) {
        let Reach::Usable(new) = reach else {
            return;
        };
        if let Some(old) = self.lladdr.insert(addr, new)
            && old != new
        {
            self.moved.push(Moved { addr, old, new });
        }
    }

    fn evaluate_hop(&mut self, hop: IpAddr) -> Vec<MacUpdate> {
        let users: Vec<IpAddr> = self
            .hops
            .iter()
            .filter(|(_, h)| h.current == Some(hop))
            .map(|(b, _)| *b)
            .collect();
        users.into_iter().filter_map(|b| self.evaluate(b)).collect()
    }

    /// The backend's MAC as the table says now; an update when it differs from the last.
    fn evaluate(&mut self, backend: IpAddr) -> Option<MacUpdate> {
        let h = self.hops.get_mut(&backend)?;
        let mac = match h.current {
            None => None,
            Some(hop) => match self.table.get(&hop) {
                Some(Some(Reach::Usable(mac))) => Some(*mac),
                Some(Some(Reach::Failed | Reach::Incomplete) | None) => None,
                Some(Some(Reach::Unknown)) | None => return None,
            },
        };
        if h.sent == Some(mac) {
            return None;
        }
        h.sent = Some(mac);
        Some(MacUpdate { backend, mac })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IF: u32 = 4;
    const OLD: Mac = [2, 0, 0, 0, 0, 1];
    const NEW: Mac = [2, 0, 0, 0, 0, 2];

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn entry(addr: &str, reach: Reach) -> NeighEntry {
        NeighEntry {
            ifindex: IF,
            addr: ip(addr),
            reach,
        }
    }

    fn up(backend: &str, mac: Option<Mac>) -> MacUpdate {
        MacUpdate {
            backend: ip(backend),
            mac,
        }
    }

    /// One on-link backend (b1) and two behind gateway .1 (b2, b3).
    fn state() -> NextHops {
        let mut s = NextHops::new(IF);
        s.replace_table(&[
            entry("10.0.1.11", Reach::Usable(OLD)),
            entry("10.0.1.1", Reach::Usable(OLD)),
        ]);
        let fresh = s.set_backends(&[ip("10.0.1.11"), ip("10.0.2.12"), ip("10.0.2.13")]);
        assert_eq!(fresh.len(), 3);
        assert_eq!(
            s.set_route(ip("10.0.1.11"), Some(ip("10.0.1.11"))),
            Some(up("10.0.1.11", Some(OLD)))
        );
        for b in ["10.0.2.12", "10.0.2.13"] {
            assert_eq!(
                s.set_route(ip(b), Some(ip("10.0.1.1"))),
                Some(up(b, Some(OLD)))
            );
        }
        s
    }

    #[test]
    fn an_announced_mac_reaches_the_backends_of_that_hop() {
        let mut s = state();
        assert_eq!(
            s.neigh(entry("10.0.1.11", Reach::Usable(NEW))),
            vec![up("10.0.1.11", Some(NEW))]
        );
        // The same address again (REACHABLE after STALE): nothing to send.
        assert!(s.neigh(entry("10.0.1.11", Reach::Usable(NEW))).is_empty());
        let mut gw = s.neigh(entry("10.0.1.1", Reach::Usable(NEW)));
        gw.sort_by_key(|u| u.backend);
        assert_eq!(
            gw,
            vec![up("10.0.2.12", Some(NEW)), up("10.0.2.13", Some(NEW))]
        );
        // Another interface's entry for the same address changes nothing.
        let mut other = entry("10.0.1.11", Reach::Failed);
        other.ifindex = IF + 1;
        assert!(s.neigh(other).is_empty());
    }

    #[test]
    fn failed_incomplete_and_deleted_entries_make_the_backend_unusable() {
        let mut s = state();
        assert_eq!(
            s.neigh(entry("10.0.1.11", Reach::Failed)),
            vec![up("10.0.1.11", None)]
        );
        assert!(s.neigh(entry("10.0.1.11", Reach::Incomplete)).is_empty());
        assert_eq!(
            s.neigh(entry("10.0.1.11", Reach::Usable(NEW))),
            vec![up("10.0.1.11", Some(NEW))]
        );
        assert_eq!(
            s.neigh_gone(IF, ip("10.0.1.11")),
            vec![up("10.0.1.11", None)]
        );
        // NONE without an address says nothing either way.
        assert!(s.neigh(entry("10.0.1.11", Reach::Unknown)).is_empty());
    }

    #[test]
    fn a_route_change_keeps_the_old_mac_until_the_new_gateway_resolves() {
        let mut s = state();
        assert_eq!(s.set_route(ip("10.0.2.12"), Some(ip("10.0.1.2"))), None);
        assert_eq!(
            s.pending().collect::<Vec<_>>(),
            vec![(ip("10.0.2.12"), ip("10.0.1.2"))]
        );
        // Being resolved: the old gateway still carries the traffic.
        assert!(s.neigh(entry("10.0.1.2", Reach::Incomplete)).is_empty());
        // The old gateway's changes no longer matter once the new one answered.
        assert_eq!(
            s.neigh(entry("10.0.1.2", Reach::Usable(NEW))),
            vec![up("10.0.2.12", Some(NEW))]
        );
        assert_eq!(
            s.neigh(entry("10.0.1.1", Reach::Failed)),
            vec![up("10.0.2.13", None)]
        );
        // A route to a gateway already known switches at once.
        assert_eq!(
            s.set_route(ip("10.0.2.13"), Some(ip("10.0.1.2"))),
            Some(up("10.0.2.13", Some(NEW)))
        );
        // No route on the interface any more.
        assert_eq!(
            s.set_route(ip("10.0.2.13"), None),
            Some(up("10.0.2.13", None))
        );
    }

    #[test]
    fn a_new_gateway_that_fails_makes_the_backend_unusable() {
        let mut s = state();
        assert_eq!(s.set_route(ip("10.0.2.12"), Some(ip("10.0.1.2"))), None);
        assert_eq!(
            s.neigh(entry("10.0.1.2", Reach::Failed)),
            vec![up("10.0.2.12", None)]
        );
    }

    #[test]
    fn a_resync_applies_what_the_lost_events_changed() {
        let mut s = state();
        s.set_route(ip("10.0.2.12"), Some(ip("10.0.1.2")));
        let mut ups = s.replace_table(&[
            entry("10.0.1.11", Reach::Usable(NEW)),
            entry("10.0.1.2", Reach::Usable(NEW)),
        ]);
        ups.sort_by_key(|u| u.backend);
        assert_eq!(
            ups,
            vec![
                up("10.0.1.11", Some(NEW)),
                up("10.0.2.12", Some(NEW)),
                // Gateway .1 is gone from the table.
                up("10.0.2.13", None),
            ]
        );
        assert_eq!(s.pending().count(), 0);
    }

    #[test]
    fn backends_no_longer_followed_are_dropped() {
        let mut s = state();
        assert_eq!(
            s.set_backends(&[ip("10.0.1.11"), ip("10.0.3.1")]),
            vec![ip("10.0.3.1")]
        );
        assert_eq!(s.backends().count(), 2);
        assert!(s.neigh(entry("10.0.1.1", Reach::Failed)).is_empty());
    }

    #[test]
    fn an_address_never_seen_says_nothing_until_its_event() {
        let mut s = NextHops::new(IF);
        s.set_backends(&[ip("10.0.1.20")]);
        // The agent resolved it; its NEWNEIGH may still be queued on the socket.
        assert_eq!(s.set_route(ip("10.0.1.20"), Some(ip("10.0.1.20"))), None);
        assert_eq!(
            s.neigh(entry("10.0.1.20", Reach::Usable(OLD))),
            vec![up("10.0.1.20", Some(OLD))]
        );
    }

    #[test]
    fn every_neighbour_that_answers_from_another_address_is_a_move() {
        let mut s = state();
        assert!(s.take_moved().is_empty(), "first sight is no move");
        // A router no backend uses (toward the clients) moves.
        s.neigh(entry("10.0.1.254", Reach::Usable(OLD)));
        s.neigh(entry("10.0.1.254", Reach::Usable(NEW)));
        // The backends' gateway moves.
        s.neigh(entry("10.0.1.1", Reach::Usable(NEW)));
        // The same address again is nothing.
        s.neigh(entry("10.0.1.1", Reach::Usable(NEW)));
        assert_eq!(
            s.take_moved(),
            vec![
                Moved {
                    addr: ip("10.0.1.254"),
                    old: OLD,
                    new: NEW
                },
                Moved {
                    addr: ip("10.0.1.1"),
                    old: OLD,
                    new: NEW
                },
            ]
        );
        assert!(s.take_moved().is_empty());
        // Failed, deleted, then back elsewhere: a move from the address it last had.
        s.neigh(entry("10.0.1.11", Reach::Failed));
        s.neigh_gone(IF, ip("10.0.1.11"));
        s.neigh(entry("10.0.1.11", Reach::Usable(NEW)));
        // Seen in a dump after lost events.
        s.replace_table(&[entry("10.0.1.254", Reach::Usable(OLD))]);
        assert_eq!(
            s.take_moved(),
            vec![
                Moved {
                    addr: ip("10.0.1.11"),
                    old: OLD,
                    new: NEW
                },
                Moved {
                    addr: ip("10.0.1.254"),
                    old: NEW,
                    new: OLD
                },
            ]
        );
        // Another interface's entries are not this one's neighbours.
        let mut other = entry("10.0.1.254", Reach::Usable(NEW));
        other.ifindex = IF + 1;
        s.neigh(other);
        assert!(s.take_moved().is_empty());
    }

    #[test]
    fn deleted_neighbours_no_backend_uses_are_forgotten_beyond_the_bound() {
        let mut s = state();
        let many = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a64_0000 + i));
        for i in 0..=NEIGHBOURS_KEPT as u32 {
            s.neigh(entry(&many(i).to_string(), Reach::Usable(OLD)));
        }
        for i in 0..=NEIGHBOURS_KEPT as u32 {
            s.neigh_gone(IF, many(i));
        }
        assert!(s.table.len() <= NEIGHBOURS_KEPT + 2);
        assert!(s.lladdr.len() <= NEIGHBOURS_KEPT + 2);
        // A next hop in use is kept through its deletion: its backends become unusable.
        let mut gone = s.neigh_gone(IF, ip("10.0.1.1"));
        gone.sort_by_key(|u| u.backend);
        assert_eq!(gone, vec![up("10.0.2.12", None), up("10.0.2.13", None)]);
        assert_eq!(s.table.get(&ip("10.0.1.1")), Some(&None));
    }
}
