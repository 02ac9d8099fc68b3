//! Backend MACs ([`Macs`]): resolved through [`super::Neighbours`], a bounded number at
//! once, retried while some are unknown (a backend without one takes no traffic), and
//! followed as the kernel changes them (`neighbours.rs`).

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use tokio::time::Instant;
use tracing::warn;

use super::{Agent, Neighbours, ServiceRt};
use crate::{
    dataplane::Dataplane, neighbour::nexthops::MacUpdate, probe::Prober, publish::PublishError,
};

/// MAC lookups in flight at once.
const MAC_LOOKUPS: usize = 32;

/// The MAC table and where its addresses come from.
pub(super) struct Macs<N> {
    neighbours: Arc<N>,
    known: HashMap<IpAddr, [u8; 6]>,
    /// Backend addresses whose MAC is unknown, as of the last resolution round.
    unknown: usize,
}

impl<N: Neighbours> Macs<N> {
    pub fn new(neighbours: Arc<N>) -> Self {
        Macs {
            neighbours,
            known: HashMap::new(),
            unknown: 0,
        }
    }

    /// Where MACs come from (also for addresses that are not backends).
    pub fn neighbours(&self) -> &Arc<N> {
        &self.neighbours
    }

    /// The MACs known, by backend address.
    pub fn known(&self) -> &HashMap<IpAddr, [u8; 6]> {
        &self.known
    }

    /// Whether some backend MAC was still unknown after the last resolution.
    pub fn has_unknown(&self) -> bool {
        self.unknown > 0
    }

    /// Resolves the MACs of `backends` (every server's address, once) not known yet,
    /// concurrently, and follows them all from now on.
    pub async fn refresh(&mut self, backends: Vec<IpAddr>) {
        let mut jobs = tokio::task::JoinSet::new();
        // Bounded: each kernel lookup may spawn `ip` and wait up to its timeout.
        let slots = Arc::new(tokio::sync::Semaphore::new(MAC_LOOKUPS));
        for ip in self.unknown_among(&backends) {
            let n = self.neighbours.clone();
            let slots = slots.clone();
            jobs.spawn(async move {
                let _slot = slots.acquire_owned().await;
                (ip, n.resolve(ip).await)
            });
        }
        while let Some(done) = jobs.join_next().await {
            match done {
                Ok((ip, Ok(mac))) => {
                    self.known.insert(ip, mac);
                }
                Ok((ip, Err(err))) => {
                    warn!(backend = %ip, error = %err, "backend MAC unknown: not selectable until resolved")
                }
                Err(err) => warn!(error = %err, "MAC resolution task failed"),
            }
        }
        self.unknown = self.unknown_among(&backends).len();
        self.neighbours.follow(backends);
    }

    /// Resolves the MAC of one added backend at `ip` (when every other MAC is known:
    /// the set of unknown MACs only grows by added servers) and follows it.
    pub async fn resolve_added(&mut self, ip: IpAddr) {
        self.neighbours.follow_one(ip);
        if self.known.contains_key(&ip) {
            return;
        }
        // Bounded like `refresh`: one lookup.
        match self.neighbours.resolve(ip).await {
            Ok(mac) => {
                self.known.insert(ip, mac);
            }
            Err(err) => {
                warn!(backend = %ip, error = %err, "backend MAC unknown: not selectable until resolved");
                self.unknown = 1;
            }
        }
    }

    /// Takes in the kernel's MAC changes; returns those that changed the table (and
    /// recounts what `backends`, every server's address, still lack, taking them only
    /// then).
    pub fn follow<I: IntoIterator<Item = IpAddr>>(
        &mut self,
        updates: &[MacUpdate],
        backends: impl FnOnce() -> I,
    ) -> Vec<MacUpdate> {
        let mut changed = Vec::new();
        for u in updates {
            if self.known.get(&u.backend).copied() == u.mac {
                continue;
            }
            match u.mac {
                Some(mac) => self.known.insert(u.backend, mac),
                None => self.known.remove(&u.backend),
            };
            changed.push(*u);
        }
        if !changed.is_empty() {
            // Only the unknown addresses are collected and deduplicated (servers of
            // several services may share one), not every server's.
            let mut unknown: Vec<IpAddr> = backends()
                .into_iter()
                .filter(|ip| !self.known.contains_key(ip))
                .collect();
            unknown.sort_unstable();
            unknown.dedup();
            self.unknown = unknown.len();
        }
        changed
    }

    fn unknown_among(&self, backends: &[IpAddr]) -> Vec<IpAddr> {
        backends
            .iter()
            .filter(|ip| !self.known.contains_key(ip))
            .copied()
            .collect()
    }
}

/// Every server's address, once, in order.
pub(super) fn server_ips(services: &[ServiceRt]) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = services
        .iter()
        .flat_map(|s| s.servers.keys().map(SocketAddr::ip))
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// Resolves MACs not known yet (all of them concurrently).
    pub async fn refresh_macs(&mut self) {
        self.macs.refresh(server_ips(&self.services)).await;
    }

    /// [`Agent::refresh_macs`] after a server at `ip` was added: when every other MAC is
    /// known, `ip`'s is the only one to resolve, without a pass over every server.
    pub(super) async fn refresh_macs_after_add(&mut self, ip: IpAddr) {
        if self.macs.has_unknown() {
            return self.refresh_macs().await;
        }
        self.macs.resolve_added(ip).await;
    }

    /// Whether some backend MAC is still unknown (the caller retries periodically).
    /// Cached: the run loop asks on every turn.
    pub fn has_unknown_macs(&self) -> bool {
        self.macs.has_unknown()
    }

    /// Re-resolves unknown MACs and republishes if any were found.
    pub async fn retry_macs(&mut self) -> Result<(), PublishError> {
        let before = self.macs.known().len();
        self.refresh_macs().await;
        if self.macs.known().len() != before {
            self.recompute(Instant::now(), std::time::Instant::now())?;
        }
        Ok(())
    }
}
