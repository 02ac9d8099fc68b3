//! The agent's cluster component: the [`Cluster`] that shares nat connections with the
//! peers of `[cluster]` (docs/internals/cluster-sync.md), held while the agent runs;
//! its status goes into the snapshot, and in cluster mode the services' SNAT addresses
//! are announced like VIPs.

use super::{Agent, Neighbours};
use crate::{cluster::Cluster, dataplane::Dataplane, probe::Prober};

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// Runs `cluster` as this agent's cluster component: from now on the nat services'
    /// SNAT addresses are announced like VIPs (the peers share them, and the backend
    /// side's routers spread replies over the nodes that announce them).
    pub fn start_cluster(&mut self, cluster: Cluster) {
        self.cluster = Some(cluster);
        self.announcement.announce_snat_addresses();
        self.announce();
        self.snapshot.changed();
    }

    /// The cluster component, when `[cluster]` is configured.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// The cluster component, to publish records and take the replicas' changes.
    pub fn cluster_mut(&mut self) -> Option<&mut Cluster> {
        self.cluster.as_mut()
    }
}
