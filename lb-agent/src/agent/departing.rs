//! Servers removed from the configuration (reload, API delete, DNS/SRV re-resolution):
//! the least harmful removal keeps the backend id `Sticky` (LIVE without SERVING) while
//! its established flows still carry traffic, so a removal takes no new flow but breaks
//! no connection. The id is freed once no packet was forwarded to it for
//! [`REMOVED_IDLE`] (a nat TCP entry's own idle timeout), or after [`REMOVED_MAX`] at
//! most; its flows then re-hash. Re-adding the address meanwhile keeps the same id, so its
//! pinned flows simply continue (docs/membership.md, "Removal from the configuration").
//! The agent keeps each service's departing backends in step with its servers here
//! ([`Agent::sync_departing`]).

use std::{net::SocketAddr, time::Duration};

use tokio::time::Instant;

use super::{Agent, Neighbours, ServiceRt};
use crate::{dataplane::Dataplane, probe::Prober};

/// A removed server's id is freed after this long without a forwarded packet.
pub const REMOVED_IDLE: Duration = Duration::from_secs(900);
/// ... and after this long at most, busy or not (ids are a bounded resource).
pub const REMOVED_MAX: Duration = Duration::from_secs(24 * 3600);

/// A server removed from the configuration whose flows may still run.
#[derive(Debug, Clone)]
pub(super) struct Departing {
    since: Instant,
    last_traffic: Instant,
    /// Forwarded packets at the last poll; `None` before the first.
    packets: Option<u64>,
}

impl Departing {
    pub fn new(now: Instant) -> Self {
        Departing {
            since: now,
            last_traffic: now,
            packets: None,
        }
    }

    /// The backend's forwarded-packet counter at `now`; more packets = flows still run.
    pub fn saw_packets(&mut self, packets: u64, now: Instant) {
        if self.packets.is_some_and(|p| packets > p) {
            self.last_traffic = now;
        }
        self.packets = Some(packets);
    }

    /// When its id is freed.
    pub fn deadline(&self) -> Instant {
        (self.last_traffic + REMOVED_IDLE).min(self.since + REMOVED_MAX)
    }
}

impl ServiceRt {
    /// Keeps `departing` in step with the servers, given the addresses `published` for
    /// this service: a published backend no longer among the servers starts departing;
    /// a departing address added again stops.
    fn sync_departing(&mut self, published: impl Iterator<Item = SocketAddr>, now: Instant) {
        let servers = &self.servers;
        self.departing.retain(|a, _| !servers.contains_key(a));
        for addr in published {
            if !self.servers.contains_key(&addr) {
                self.departing
                    .entry(addr)
                    .or_insert_with(|| Departing::new(now));
            }
        }
    }

    /// [`ServiceRt::sync_departing`] for `addr` alone (`published`: whether it is a
    /// published backend of this service). Returns whether it started or stopped
    /// departing.
    fn sync_departing_one(&mut self, addr: SocketAddr, published: bool, now: Instant) -> bool {
        if self.servers.contains_key(&addr) {
            self.departing.remove(&addr).is_some()
        } else if published && !self.departing.contains_key(&addr) {
            self.departing.insert(addr, Departing::new(now));
            true
        } else {
            false
        }
    }
}

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// Keeps every service's departing backends in step with its servers. Called where
    /// servers are added or removed (config, API, DNS), not per verdict.
    pub(super) fn sync_departing(&mut self, now: Instant) {
        let publisher = self.publishing.publisher();
        for svc in &mut self.services {
            let published = publisher.backend_addrs(&svc.cfg.name);
            svc.sync_departing(published, now);
        }
        self.deadlines.clear();
    }

    /// [`Agent::sync_departing`] for one address of one service, after an admin add or
    /// remove: only that address can start or stop departing, so the work is one lookup,
    /// not a walk over every service's published backends.
    pub(super) fn sync_departing_server(&mut self, si: usize, addr: SocketAddr, now: Instant) {
        let svc = &mut self.services[si];
        let published = self
            .publishing
            .publisher()
            .has_backend(&svc.cfg.name, &addr);
        if svc.sync_departing_one(addr, published, now) {
            self.deadlines.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_postpones_the_end_up_to_the_maximum() {
        let t0 = Instant::now();
        let mut d = Departing::new(t0);
        assert_eq!(d.deadline(), t0 + REMOVED_IDLE);
        d.saw_packets(10, t0 + Duration::from_secs(1));
        assert_eq!(
            d.deadline(),
            t0 + REMOVED_IDLE,
            "the first poll is a baseline"
        );
        d.saw_packets(10, t0 + Duration::from_secs(100));
        assert_eq!(d.deadline(), t0 + REMOVED_IDLE, "no new packet");
        d.saw_packets(11, t0 + Duration::from_secs(200));
        assert_eq!(d.deadline(), t0 + Duration::from_secs(200) + REMOVED_IDLE);
        d.saw_packets(12, t0 + REMOVED_MAX);
        assert_eq!(d.deadline(), t0 + REMOVED_MAX, "never beyond the maximum");
    }
}
