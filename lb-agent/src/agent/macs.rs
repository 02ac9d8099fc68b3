//! Backend MACs (`Agent::macs`): resolved through [`super::Neighbors`], a bounded number
//! at once, retried while some are unknown (a backend without one takes no traffic).

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use tokio::time::Instant;
use tracing::warn;

use super::{Agent, Neighbors};
use crate::{dataplane::Dataplane, probe::Prober, publish::PublishError};

/// MAC lookups in flight at once.
const MAC_LOOKUPS: usize = 32;

impl<D: Dataplane, P: Prober, N: Neighbors> Agent<D, P, N> {
    /// Resolves MACs not known yet (all of them concurrently).
    pub async fn refresh_macs(&mut self) {
        let wanted: Vec<IpAddr> = self.unknown_macs();
        let mut jobs = tokio::task::JoinSet::new();
        // Bounded: each kernel lookup may spawn `ip` and wait up to its timeout.
        let slots = Arc::new(tokio::sync::Semaphore::new(MAC_LOOKUPS));
        for ip in wanted {
            let n = self.neighbors.clone();
            let slots = slots.clone();
            jobs.spawn(async move {
                let _slot = slots.acquire_owned().await;
                (ip, n.resolve(ip).await)
            });
        }
        while let Some(done) = jobs.join_next().await {
            match done {
                Ok((ip, Ok(mac))) => {
                    self.macs.insert(ip, mac);
                }
                Ok((ip, Err(err))) => {
                    warn!(backend = %ip, error = %err, "backend MAC unknown: not selectable until resolved")
                }
                Err(err) => warn!(error = %err, "MAC resolution task failed"),
            }
        }
        self.unknown_mac_count = self.unknown_macs().len();
        self.neighbors.follow(self.server_ips());
    }

    /// [`Agent::refresh_macs`] after a server at `ip` was added: when every other MAC is
    /// known (`unknown_mac_count` is 0; the set of unknown MACs only grows by added
    /// servers), `ip`'s is the only one to resolve, without a pass over every server.
    pub(super) async fn refresh_macs_after_add(&mut self, ip: IpAddr) {
        if self.unknown_mac_count > 0 {
            return self.refresh_macs().await;
        }
        self.neighbors.follow_one(ip);
        if self.macs.contains_key(&ip) {
            return;
        }
        // Bounded like `refresh_macs`: one lookup.
        match self.neighbors.resolve(ip).await {
            Ok(mac) => {
                self.macs.insert(ip, mac);
            }
            Err(err) => {
                warn!(backend = %ip, error = %err, "backend MAC unknown: not selectable until resolved");
                self.unknown_mac_count = 1;
            }
        }
    }

    pub(super) fn unknown_macs(&self) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = self
            .services
            .iter()
            .flat_map(|s| s.servers.keys().map(SocketAddr::ip))
            .filter(|ip| !self.macs.contains_key(ip))
            .collect();
        ips.sort();
        ips.dedup();
        ips
    }

    /// Whether some backend MAC is still unknown (the caller retries periodically).
    /// Cached: the run loop asks on every turn.
    pub fn has_unknown_macs(&self) -> bool {
        self.unknown_mac_count > 0
    }

    /// Re-resolves unknown MACs and republishes if any were found.
    pub async fn retry_macs(&mut self) -> Result<(), PublishError> {
        let before = self.macs.len();
        self.refresh_macs().await;
        if self.macs.len() != before {
            self.recompute(Instant::now(), std::time::Instant::now())?;
        }
        Ok(())
    }
}
