//! Re-resolution of `resolve = true` servers while the agent runs: DNS answers expire
//! (TTL), lookups run in the background, and changed answers add, remove or re-level
//! servers like a reload limited to those entries ([`crate::discovery`] has the rules).
//!
//! The run loop drives it with one `select!` arm:
//! `_ = agent.resolve_ready() => agent.reresolve().await`.

use std::{collections::HashSet, net::SocketAddr};

use tokio::time::Instant;

use super::{Agent, server::Configured};
use crate::{
    dataplane::Dataplane,
    discovery::{self, Expanded},
    probe::Prober,
    publish::PublishError,
};

use super::Neighbours;

/// A discovered backend's settings as the agent keeps them.
pub(super) fn configured(e: &Expanded) -> Configured {
    Configured {
        weight: e.weight,
        spare: e.spare,
        backup: e.backup,
    }
}

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// When the next DNS answer expires or a failed lookup is retried (`None`: no
    /// `resolve = true` server, or every lookup is running).
    pub fn next_resolve_deadline(&self) -> Option<Instant> {
        self.discovery.next_deadline()
    }

    /// Completes when [`Agent::reresolve`] has work: an answer expired, a retry is due, or
    /// a background lookup came back. Cancel-safe; never completes without resolved servers.
    pub async fn resolve_ready(&mut self) {
        self.discovery.ready().await
    }

    /// Starts the DNS lookups that are due (in the background: the agent never waits for
    /// DNS here) and applies the answers that came back: new addresses become servers
    /// (`checking` or `up` as any new server), addresses gone from the answer are removed,
    /// and kept ones take a changed weight, level or spare flag. Settings changed at
    /// runtime through the API stay unless DNS changes that same setting. Servers added
    /// through the API are never removed by DNS.
    pub async fn reresolve(&mut self) -> Result<(), PublishError> {
        let started = std::time::Instant::now();
        let now = Instant::now();
        self.discovery.retain(self.services.iter().map(|s| &s.cfg));
        if !self.discovery.poll(now) {
            return Ok(());
        }
        let mut changed = false;
        let mut events = Vec::new();
        for si in 0..self.services.len() {
            let svc = &self.services[si];
            if !svc.cfg.servers.iter().any(|s| s.resolve) {
                continue;
            }
            let wanted = self.discovery.expand_cached(&svc.cfg);
            let keep: HashSet<SocketAddr> = wanted.iter().map(|e| e.addr).collect();
            let mut fresh = Vec::new();
            for e in &wanted {
                if !svc.servers.contains_key(&e.addr) {
                    let kept = self.persistence.passive_kept();
                    let server = self.probing.start(
                        &svc.cfg,
                        e.addr,
                        configured(e),
                        svc.added_start(e.addr),
                        now,
                        kept,
                    );
                    fresh.push(server);
                }
            }
            let svc = &mut self.services[si];
            let name = svc.cfg.name.clone();
            for e in &wanted {
                let conf = configured(e);
                let Some(s) = svc.servers.get_mut(&e.addr) else {
                    continue;
                };
                let before = s.configured;
                if before == Some(conf) {
                    continue;
                }
                if before.map(|c| c.weight) != Some(conf.weight) {
                    s.weight = conf.weight;
                }
                if before.map(|c| c.spare) != Some(conf.spare) {
                    s.spare = conf.spare;
                }
                if before.map(|c| c.backup) != Some(conf.backup) {
                    s.backup = conf.backup;
                }
                s.configured = Some(conf);
                changed = true;
                events.push((
                    name.clone(),
                    e.addr,
                    "-",
                    "updated",
                    format!(
                        "dns: weight {} backup {}{}",
                        conf.weight,
                        conf.backup,
                        if conf.spare { " spare" } else { "" }
                    ),
                ));
            }
            let gone: Vec<SocketAddr> = svc
                .servers
                .iter()
                .filter(|(a, s)| s.configured.is_some() && !keep.contains(a))
                .map(|(a, _)| *a)
                .collect();
            for a in gone {
                svc.servers.remove(&a);
                changed = true;
                events.push((name.clone(), a, "-", "removed", "dns".into()));
            }
            for server in fresh {
                events.push((name.clone(), server.addr, "-", "added", "dns".into()));
                svc.servers.insert(server.addr, server);
                changed = true;
            }
        }
        for (service, addr, from, to, cause) in events {
            self.record_names(&service, &addr.to_string(), from, to, &cause);
        }
        if !changed {
            return Ok(());
        }
        self.sync_departing(now);
        self.refresh_macs().await;
        self.recompute(now, started)
    }

    /// Changes discovery's timing (TTL clamp, retry backoff, query timeout).
    pub fn set_discovery_options(&mut self, opts: discovery::Options) {
        self.discovery.set_options(opts);
    }
}
