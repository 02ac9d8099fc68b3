//! Where the agent gets backend MAC addresses: the kernel (real runs) or a fixed table;
//! and how the changes the kernel reports reach the maps ([`Agent::on_neighbour_changes`]).

use std::{collections::HashMap, future::Future, net::IpAddr, time::Duration};

use tokio::{sync::mpsc, time::Instant};
use tracing::{info, warn};

use super::Agent;
use crate::{
    dataplane::Dataplane,
    neighbour::{
        NeighbourError,
        nexthops::{MacUpdate, NeighbourChanges},
        rtnl::Rtnl,
        watch::{self, Follow},
    },
    probe::Prober,
    publish::PublishError,
};

/// Resolves the link-layer address to use toward a backend.
pub trait Neighbours: Send + Sync + 'static {
    fn resolve(&self, ip: IpAddr) -> impl Future<Output = Result<[u8; 6], String>> + Send;

    /// The backends whose MAC should be followed from now on (every server's address);
    /// changes come back through [`Agent::on_neighbour_changes`]. Nothing by default.
    fn follow(&self, _backends: Vec<IpAddr>) {}

    /// One more backend to follow (a server added at runtime).
    fn follow_one(&self, _backend: IpAddr) {}
}

/// The kernel's neighbour table on the attached interface ([`crate::neighbour`]), read
/// over rtnetlink, and followed by the netlink watch ([`crate::neighbour::watch`]).
pub struct KernelNeighbours {
    interface: String,
    timeout: Duration,
    rtnl: Rtnl,
    follow: Follow,
}

impl KernelNeighbours {
    /// Opens the netlink connection and starts the watch (inside a tokio runtime). The
    /// receiver carries the changes: feed each batch to [`Agent::on_neighbour_changes`].
    pub fn new(
        interface: &str,
        timeout: Duration,
    ) -> Result<(Self, mpsc::Receiver<NeighbourChanges>), NeighbourError> {
        let rtnl = Rtnl::new()?;
        let (follow, updates) = watch::spawn(interface, rtnl.clone())?;
        Ok((
            Self {
                interface: interface.to_string(),
                timeout,
                rtnl,
                follow,
            },
            updates,
        ))
    }
}

impl Neighbours for KernelNeighbours {
    async fn resolve(&self, ip: IpAddr) -> Result<[u8; 6], String> {
        if ip.is_loopback() || ip.is_unspecified() {
            return Err(format!("{ip} cannot be reached through {}", self.interface));
        }
        crate::neighbour::resolve_mac(&self.rtnl, &self.interface, ip, self.timeout)
            .await
            .map_err(|e| e.to_string())
    }

    fn follow(&self, backends: Vec<IpAddr>) {
        self.follow.set(backends);
    }

    fn follow_one(&self, backend: IpAddr) {
        self.follow.add(backend);
    }
}

/// A fixed table (tests; or every address gets `default` when set).
#[derive(Default)]
pub struct StaticNeighbours {
    pub table: HashMap<IpAddr, [u8; 6]>,
    pub default: Option<[u8; 6]>,
}

impl Neighbours for StaticNeighbours {
    async fn resolve(&self, ip: IpAddr) -> Result<[u8; 6], String> {
        self.table
            .get(&ip)
            .copied()
            .or(self.default)
            .ok_or_else(|| format!("no static MAC for {ip}"))
    }
}

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// One batch from the neighbour watch: the backends' MACs ([`Agent::on_mac_updates`]),
    /// then, in cluster mode, the neighbours that moved to another link-layer address
    /// ([`Agent::follow_neighbour_moves`]).
    pub fn on_neighbour_changes(&mut self, changes: &NeighbourChanges) -> Result<(), PublishError> {
        let published = self.on_mac_updates(&changes.backends);
        self.follow_neighbour_moves(&changes.moved);
        published
    }

    /// MACs the kernel changed: a new address goes into the maps at once (the same
    /// path a resolved MAC takes); `None` (FAILED, INCOMPLETE, deleted, no route) makes
    /// the backend unselectable exactly as an unknown MAC, until the kernel has an
    /// address again. Only the services with such a backend are recomputed.
    pub fn on_mac_updates(&mut self, updates: &[MacUpdate]) -> Result<(), PublishError> {
        let services = &self.services;
        let changed = self.macs.follow(updates, || {
            services
                .iter()
                .flat_map(|s| s.servers.keys().map(std::net::SocketAddr::ip))
        });
        if changed.is_empty() {
            return Ok(());
        }
        let ips: std::collections::HashSet<IpAddr> = changed.iter().map(|u| u.backend).collect();
        for svc in &mut self.services {
            if svc.servers.keys().any(|a| ips.contains(&a.ip())) {
                svc.mark();
            }
        }
        let published = self.recompute_marked(Instant::now(), std::time::Instant::now());
        // Logged once the maps hold it.
        for u in changed {
            match u.mac {
                Some(mac) => {
                    info!(backend = %u.backend, mac = %fmt_mac(mac), "backend MAC follows the kernel's neighbour table")
                }
                None => {
                    warn!(backend = %u.backend, "backend's next hop unresolved (neighbour FAILED, INCOMPLETE or gone): not selectable until resolved")
                }
            }
        }
        published
    }
}

pub(super) fn fmt_mac(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}
