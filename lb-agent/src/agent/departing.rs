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

use super::{Agent, Neighbors};
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

impl<D: Dataplane, P: Prober, N: Neighbors> Agent<D, P, N> {
    /// Keeps `departing` in step with the servers: a published backend no longer among a
    /// service's servers starts departing; a departing address added again stops. Called
    /// where servers are added or removed (config, API, DNS), not per verdict.
    pub(super) fn sync_departing(&mut self, now: Instant) {
        for svc in &mut self.services {
            let servers = &svc.servers;
            svc.departing.retain(|a, _| !servers.contains_key(a));
            for addr in self.publishing.publisher().backend_addrs(&svc.cfg.name) {
                if !svc.servers.contains_key(&addr) {
                    svc.departing
                        .entry(addr)
                        .or_insert_with(|| Departing::new(now));
                }
            }
        }
        self.deadlines.clear();
    }

    /// [`Agent::sync_departing`] for one address of one service, after an admin add or
    /// remove: only that address can start or stop departing, so the work is one lookup,
    /// not a walk over every service's published backends.
    pub(super) fn sync_departing_server(&mut self, si: usize, addr: SocketAddr, now: Instant) {
        let svc = &mut self.services[si];
        let changed = if svc.servers.contains_key(&addr) {
            svc.departing.remove(&addr).is_some()
        } else if self
            .publishing
            .publisher()
            .has_backend(&svc.cfg.name, &addr)
            && !svc.departing.contains_key(&addr)
        {
            svc.departing.insert(addr, Departing::new(now));
            true
        } else {
            false
        };
        if changed {
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
