//! Applying a (new or reloaded) configuration: services and servers matched by name and
//! address, kept servers keep their health unless their probes changed, runtime admin
//! state re-applied on top (docs/admin-state.md); and the start of a server's runtime
//! (health, shared signals, probe tasks, report key).

use std::{collections::HashMap, net::SocketAddr};

use tokio::time::Instant;
use tracing::info;

use super::{Agent, Configured, Neighbours, ReapplyReport, ServerRt, ServiceRt, resolve};
use crate::{
    config::{Config, ServiceConfig},
    dataplane::Dataplane,
    health::StartState,
    probe::Prober,
    publish::{PublishError, Publisher},
};

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// Applies a (new or reloaded) configuration: services and servers are matched by
    /// name and address; kept servers keep their health unless their probes changed
    /// (then they restart as after a reload: `persistent` probes skipped if they were
    /// up). Runtime admin changes (drain, down, weight, spare, servers added at runtime)
    /// are re-applied on top of the file (docs/admin-state.md); the returned report says
    /// what was re-applied and what was dropped (and is logged).
    pub async fn apply_config(&mut self, cfg: &Config) -> Result<(), PublishError> {
        self.apply_config_reporting(cfg).await.map(drop)
    }

    /// [`Agent::apply_config`], returning what happened to the runtime admin state.
    pub async fn apply_config_reporting(
        &mut self,
        cfg: &Config,
    ) -> Result<ReapplyReport, PublishError> {
        // In a cluster each node hands out its own slice of the nat source ports.
        let own_share;
        let cfg = match &mut self.cluster {
            Some(node) => {
                node.set_shared_snat(cfg);
                own_share = node.sync().members().own_share(cfg);
                &own_share
            }
            None => cfg,
        };
        let mut admin_report = ReapplyReport::default();
        let now = Instant::now();
        let mut old: HashMap<String, ServiceRt> = self
            .services
            .drain(..)
            .map(|s| (s.cfg.name.clone(), s))
            .collect();
        for svc_cfg in &cfg.services {
            let addrs =
                expand_servers(svc_cfg, self.discovery.with_resolver(cfg.agent.resolver)).await;
            let publisher = self.publishing.publisher();
            let kept = self.persistence.passive_kept();
            let probing = &mut self.probing;
            let mut new_server =
                |addr, conf, start| probing.start(svc_cfg, addr, conf, start, now, kept);
            let mut rt = match old.remove(&svc_cfg.name) {
                Some(mut prev) => {
                    let probes_changed = prev.cfg.probes != svc_cfg.probes
                        || prev.cfg.max_fails != svc_cfg.max_fails
                        || prev.cfg.fail_timeout != svc_cfg.fail_timeout;
                    let mut servers = Vec::with_capacity(addrs.len());
                    for (addr, conf) in addrs {
                        let server = match prev.servers.remove(&addr) {
                            Some(mut s) if !probes_changed && !rechecked(svc_cfg, &s) => {
                                s.weight = conf.weight;
                                s.spare = conf.spare;
                                s.backup = conf.backup;
                                s.configured = Some(conf);
                                s
                            }
                            Some(s) => {
                                let mut fresh = new_server(addr, conf, restart_state(&s));
                                fresh.admin = s.admin;
                                fresh
                            }
                            // Added to a running service: held back until every probe passes.
                            None => new_server(addr, conf, prev.added_start(addr)),
                        };
                        servers.push((addr, server));
                    }
                    for (addr, s) in std::mem::take(&mut prev.servers) {
                        // Added at runtime: kept, with its health (`admin_state.rs`).
                        if s.configured.is_none()
                            && self.persistence.admin_state().is_added(&svc_cfg.name, addr)
                        {
                            let kept = if probes_changed || rechecked(svc_cfg, &s) {
                                let conf = Configured {
                                    weight: s.weight,
                                    spare: s.spare,
                                    backup: s.backup,
                                };
                                let mut fresh = new_server(addr, conf, restart_state(&s));
                                fresh.configured = None;
                                fresh
                            } else {
                                s
                            };
                            servers.push((addr, kept));
                        } else {
                            info!(service = svc_cfg.name, server = %addr, "server removed by reload");
                        }
                    }
                    prev.servers = servers.into_iter().collect();
                    prev.cfg = svc_cfg.clone();
                    prev
                }
                None => {
                    let servers = addrs
                        .into_iter()
                        .map(|(addr, conf)| {
                            let start = adopted_start(publisher, svc_cfg, addr);
                            (addr, new_server(addr, conf, start))
                        })
                        .collect();
                    ServiceRt::new(svc_cfg.clone(), servers)
                }
            };
            let probing = &mut self.probing;
            self.persistence.reapply(
                svc_cfg,
                &mut rt.servers,
                |addr, conf, kept| {
                    // Restored after a restart: like a configured server, it keeps
                    // traffic if the previous run's pinned state had it live.
                    let start = adopted_start(publisher, svc_cfg, addr);
                    probing.start(svc_cfg, addr, conf, start, now, kept)
                },
                &mut admin_report,
            );
            rt.outcome = None;
            self.services.push(rt);
        }
        self.probing.place(&self.services);
        self.persistence.applied(
            cfg.services.iter().map(|s| s.name.as_str()),
            &mut admin_report,
        );
        self.sync_departing(now);
        self.refresh_macs().await;
        self.recompute(now, std::time::Instant::now())?;
        self.publish_snapshot();
        Ok(admin_report)
    }
}

/// How a server of `svc` at `addr` starts in a service new to this run: as after a
/// reload when the previous run's pinned maps had it (live: it keeps its traffic), else
/// new.
fn adopted_start(publisher: &Publisher, svc: &ServiceConfig, addr: SocketAddr) -> StartState {
    match publisher.adopted_live(svc.vip, svc.protocol.ip_proto(), addr) {
        Some(true) => StartState::ReloadedWasUp,
        Some(false) => StartState::ReloadedWasDown,
        None => StartState::New,
    }
}

/// A server kept by a reload with its probes unchanged still starts its health again
/// when it is up and its service has an essential probe that is not `persistent`: that
/// probe must pass again before the server takes new flows (Angie; docs/probes.md).
fn rechecked(svc: &ServiceConfig, s: &ServerRt) -> bool {
    s.health.usable() && svc.probes.iter().any(|p| p.essential && !p.persistent)
}

/// How a server whose probes changed at a reload starts again: `persistent` probes
/// skipped if it was up, checking again if it never passed.
fn restart_state(s: &ServerRt) -> StartState {
    if s.health.usable() {
        StartState::ReloadedWasUp
    } else if s.health.state() == crate::health::HealthState::Checking {
        StartState::New
    } else {
        StartState::ReloadedWasDown
    }
}

/// The addresses a service's server entries stand for, every name looked up now
/// (`resolve = true` ones through DNS, SRV expanded; [`crate::discovery`] keeps the
/// answers for re-resolution, see `resolve.rs`).
async fn expand_servers(
    svc: &ServiceConfig,
    discovery: &mut crate::discovery::Discovery,
) -> Vec<(SocketAddr, Configured)> {
    let found = discovery.expand(svc).await;
    found
        .iter()
        .map(|e| (e.addr, resolve::configured(e)))
        .collect()
}
