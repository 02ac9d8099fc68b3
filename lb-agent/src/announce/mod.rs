//! Announcement of VIPs to the routers, driven by health: this node attracts a VIP while
//! one of its services can serve, and gives it up when none can, when the operator drains
//! the node, or on a stop (docs/multi-node.md).
//!
//! The coupling to the routing daemon is one host route per announced VIP: the VIP as a
//! `/32` (`/128`) address on an interface the agent owns ([`routes`]); BIRD's `direct`
//! protocol (or FRR/GoBGP with zebra) exports it. The daemon's sessions are read back for
//! status from `birdc show protocols` ([`bird`]). [`fingerprint`] hashes a Maglev table so
//! operators can check that every node picks the same backend for the same flow.
//!
//! # Rules
//!
//! Per VIP address (several services — ports, protocols — may share one):
//! - the node is drained → withdrawn, reason `node drained`;
//! - else one of its services has a server taking new flows → announced, `serving`;
//! - else one of them spreads traffic in fail-open → announced, `fail-open`;
//! - else → withdrawn, `no usable server`.
//!
//! A VIP is withdrawn only when no service on it can serve: withdrawing it for one
//! failed service would black-hole the others sharing the address.

pub mod bird_sessions;
pub mod fingerprint;
pub mod routes;
pub mod rtnl;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::PathBuf,
};

use tracing::{info, warn};

pub use routes::{KernelRoutes, MemoryRoutes, RouteError, VipRoutes};

use crate::view::{AnnounceStatus, VipStatus};

/// What one service can do right now, as membership decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Serve {
    /// No server takes new flows.
    Nothing,
    /// No server is usable; fail-open spreads traffic over all of them.
    FailOpen,
    /// Some server takes new flows.
    Serving,
}

/// Why a VIP is (not) announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Serving,
    FailOpen,
    NoUsableServer,
    NodeDrained,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Serving => "serving",
            Reason::FailOpen => "fail-open",
            Reason::NoUsableServer => "no usable server",
            Reason::NodeDrained => "node drained",
        }
    }

    pub fn announces(self) -> bool {
        matches!(self, Reason::Serving | Reason::FailOpen)
    }
}

/// The decision for one VIP given what each of its services can do and the node's drain.
pub fn decide(serves: impl IntoIterator<Item = Serve>, drained: bool) -> Reason {
    if drained {
        return Reason::NodeDrained;
    }
    match serves.into_iter().max().unwrap_or(Serve::Nothing) {
        Serve::Serving => Reason::Serving,
        Serve::FailOpen => Reason::FailOpen,
        Serve::Nothing => Reason::NoUsableServer,
    }
}

/// One VIP as the announcer tracks it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Vip {
    reason: Reason,
    /// The route is on the interface (as far as the last operation knows).
    installed: bool,
    /// The last route operation failed (retried at the next update).
    error: Option<String>,
}

/// An announced/withdrawn transition, for the event log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub vip: IpAddr,
    pub announced: bool,
    pub reason: &'static str,
}

/// Keeps the announced VIPs on the route interface in step with health and drain.
#[derive(Default)]
pub struct Announcer {
    /// `None`: announcing is off (no `announce_interface`) or not started yet.
    routes: Option<Box<dyn VipRoutes + Send>>,
    drained: bool,
    /// Where the drain is kept across restarts (exists = drained).
    drain_file: Option<PathBuf>,
    vips: BTreeMap<IpAddr, Vip>,
    /// Last input, so a drain change can be applied without new membership.
    last_input: Vec<(IpAddr, Serve)>,
    bgp: Option<bird_sessions::Sessions>,
    /// Host addresses on the interface when announcing started.
    present: BTreeSet<IpAddr>,
}

impl Announcer {
    /// Starts announcing through `routes`: routes already there for VIPs count as
    /// installed (a restart keeps them, so it withdraws nothing). `drain_file`, when
    /// given, keeps the node's drain across restarts; it is read now.
    pub fn start(&mut self, routes: Box<dyn VipRoutes + Send>, drain_file: Option<PathBuf>) {
        self.drained = drain_file.as_deref().is_some_and(|p| p.exists());
        if self.drained {
            info!("the node was drained by the previous run: its VIPs stay withdrawn");
        }
        let present: BTreeSet<IpAddr> = match routes.list() {
            Ok(list) => list.into_iter().collect(),
            Err(err) => {
                warn!(error = %err, "cannot list the announced VIPs; assuming none");
                BTreeSet::new()
            }
        };
        for (ip, vip) in &mut self.vips {
            vip.installed = present.contains(ip);
        }
        // Addresses no service claims (yet) are not ours to touch (`::1` on `lo`); a
        // VIP first seen in `update` starts from what is there.
        self.present = present;
        self.routes = Some(routes);
        self.drain_file = drain_file;
    }

    /// Whether [`Announcer::start`] ran.
    pub fn is_on(&self) -> bool {
        self.routes.is_some()
    }

    pub fn drained(&self) -> bool {
        self.drained
    }

    /// Sets the node's drain and applies it at once; returns the transitions.
    pub fn set_drained(&mut self, drained: bool) -> Result<Vec<Change>, std::io::Error> {
        if let Some(path) = &self.drain_file {
            if drained {
                std::fs::write(path, b"drained by `lb-agent node drain`\n")?;
            } else if path.exists() {
                std::fs::remove_file(path)?;
            }
        }
        if self.drained != drained {
            info!(drained, "node drain changed");
        }
        self.drained = drained;
        let input = std::mem::take(&mut self.last_input);
        Ok(self.update(input))
    }

    /// Applies the services' current state: `(vip address, what the service can do)` for
    /// every service. VIPs of no service any more are withdrawn and forgotten.
    pub fn update(&mut self, services: Vec<(IpAddr, Serve)>) -> Vec<Change> {
        let mut per_vip: BTreeMap<IpAddr, Vec<Serve>> = BTreeMap::new();
        for (ip, serve) in &services {
            per_vip.entry(*ip).or_default().push(*serve);
        }
        self.last_input = services;
        let mut changes = Vec::new();
        for (ip, serves) in &per_vip {
            let reason = decide(serves.iter().copied(), self.drained);
            let vip = self.vips.entry(*ip).or_insert(Vip {
                // Found on the interface: announced by the previous run, which
                // announces only what serves.
                reason: if self.present.contains(ip) {
                    Reason::Serving
                } else {
                    reason
                },
                installed: self.present.contains(ip),
                error: None,
            });
            let was = vip.installed;
            let before = vip.reason;
            vip.reason = reason;
            if let Some(routes) = &self.routes {
                sync(routes.as_ref(), *ip, vip);
                if was != vip.installed || (before != reason && vip.installed) {
                    changes.push(Change {
                        vip: *ip,
                        announced: vip.installed,
                        reason: reason.as_str(),
                    });
                }
            }
        }
        let gone: Vec<IpAddr> = self
            .vips
            .keys()
            .filter(|ip| !per_vip.contains_key(ip))
            .copied()
            .collect();
        for ip in gone {
            let mut vip = self.vips.remove(&ip).expect("listed above");
            if let Some(routes) = &self.routes
                && vip.installed
            {
                vip.reason = Reason::NoUsableServer;
                sync(routes.as_ref(), ip, &mut vip);
                if vip.installed {
                    // Could not remove it: keep tracking it so the next update retries.
                    self.vips.insert(ip, vip);
                } else {
                    changes.push(Change {
                        vip: ip,
                        announced: false,
                        reason: "no longer configured",
                    });
                }
            }
        }
        for c in &changes {
            info!(
                vip = %c.vip,
                announced = c.announced,
                reason = c.reason,
                "announcement"
            );
        }
        changes
    }

    /// Restarts the lifetime of every announced VIP (and puts back one the kernel let
    /// expire while the agent could not run). The running agent calls this well within
    /// `agent.announce_lifetime`; an agent that stays dead stops calling it, and the
    /// kernel withdraws the node.
    pub fn refresh(&mut self) {
        let Some(routes) = &self.routes else {
            return;
        };
        for (ip, vip) in &mut self.vips {
            if !vip.installed || !vip.reason.announces() {
                continue;
            }
            match routes.add(*ip) {
                Ok(()) => vip.error = None,
                Err(err) => {
                    warn!(vip = %ip, error = %err, "refreshing the VIP's lifetime failed");
                    vip.error = Some(err.to_string());
                }
            }
        }
    }

    /// Records the routing daemon's sessions as last read (`None`: not read).
    pub fn set_bgp(&mut self, sessions: Option<bird_sessions::Sessions>) {
        self.bgp = sessions;
    }

    /// What status shows.
    pub fn status(&self) -> AnnounceStatus {
        AnnounceStatus {
            enabled: self.routes.is_some(),
            interface: self
                .routes
                .as_ref()
                .map(|r| r.describe())
                .unwrap_or_default(),
            drained: self.drained,
            quiet_seconds: None,
            vips: self
                .vips
                .iter()
                .map(|(ip, v)| VipStatus {
                    vip: ip.to_string(),
                    announced: v.installed,
                    reason: v.reason.as_str().to_string(),
                    error: v.error.clone(),
                })
                .collect(),
            bgp: self.bgp.clone().map(|s| s.protocols).unwrap_or_default(),
            bgp_error: self.bgp.as_ref().and_then(|s| s.error.clone()),
        }
    }
}

/// Makes the route of `ip` match `vip.reason`.
fn sync(routes: &dyn VipRoutes, ip: IpAddr, vip: &mut Vip) {
    let want = vip.reason.announces();
    if want == vip.installed && vip.error.is_none() {
        return;
    }
    let result = if want {
        routes.add(ip)
    } else {
        routes.remove(ip)
    };
    match result {
        Ok(()) => {
            vip.installed = want;
            vip.error = None;
        }
        Err(err) => {
            warn!(vip = %ip, error = %err, announce = want, "changing the VIP's route failed");
            vip.error = Some(err.to_string());
        }
    }
}
