//! Where the agent gets backend MAC addresses: the kernel (real runs) or a fixed table.

use std::{collections::HashMap, future::Future, net::IpAddr, time::Duration};

/// Resolves the link-layer address to use toward a backend.
pub trait Neighbors: Send + Sync + 'static {
    fn resolve(&self, ip: IpAddr) -> impl Future<Output = Result<[u8; 6], String>> + Send;
}

/// The kernel's neighbour table on the attached interface ([`crate::neighbor`]).
pub struct KernelNeighbors {
    pub interface: String,
    pub timeout: Duration,
}

impl Neighbors for KernelNeighbors {
    async fn resolve(&self, ip: IpAddr) -> Result<[u8; 6], String> {
        if ip.is_loopback() || ip.is_unspecified() {
            return Err(format!("{ip} cannot be reached through {}", self.interface));
        }
        crate::neighbor::resolve_mac(&self.interface, ip, self.timeout)
            .await
            .map_err(|e| e.to_string())
    }
}

/// A fixed table (tests; or every address gets `default` when set).
#[derive(Default)]
pub struct StaticNeighbors {
    pub table: HashMap<IpAddr, [u8; 6]>,
    pub default: Option<[u8; 6]>,
}

impl Neighbors for StaticNeighbors {
    async fn resolve(&self, ip: IpAddr) -> Result<[u8; 6], String> {
        self.table
            .get(&ip)
            .copied()
            .or(self.default)
            .ok_or_else(|| format!("no static MAC for {ip}"))
    }
}
