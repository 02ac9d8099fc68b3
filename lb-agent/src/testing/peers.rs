//! [`MemoryPeers`]: the data plane's side of cluster mode in memory, for the agent's
//! tests: the other nodes' connections installed, and the own nat entries a test says
//! carried traffic.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use lb_common::maps::{ClusterMembers, FlowKey, NatValue};

use crate::dataplane::{
    DataplaneError,
    peers::{PeerConnection, PeerStore},
};

/// The peer tables and the own `LB_NAT` entries, shared with the test that made them.
#[derive(Clone, Default)]
pub struct MemoryPeers {
    inner: Arc<Mutex<Tables>>,
}

#[derive(Default)]
struct Tables {
    /// Installed connections by client 5-tuple.
    installed: HashMap<FlowKey, PeerConnection>,
    /// This node's own entries: reply 5-tuple, value (its `last_seen` says when).
    own: Vec<(FlowKey, NatValue)>,
    /// What `LB_CLUSTER` would hold.
    members: ClusterMembers,
}

impl MemoryPeers {
    /// The connections installed now, by client 5-tuple.
    pub fn installed(&self) -> HashMap<FlowKey, PeerConnection> {
        self.lock().installed.clone()
    }

    /// The members as last written.
    pub fn members(&self) -> ClusterMembers {
        self.lock().members
    }

    /// Sets this node's own nat entries (the refresh scans read them).
    pub fn set_own(&self, entries: Vec<(FlowKey, NatValue)>) {
        self.lock().own = entries;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PeerStore for MemoryPeers {
    fn install(&mut self, conns: &[PeerConnection]) -> Result<(), DataplaneError> {
        let mut tables = self.lock();
        for c in conns {
            tables.installed.insert(c.client, *c);
        }
        Ok(())
    }

    fn remove(&mut self, keys: &[(FlowKey, FlowKey)]) -> Result<(), DataplaneError> {
        let mut tables = self.lock();
        for (client, _reply) in keys {
            tables.installed.remove(client);
        }
        Ok(())
    }

    fn set_members(&mut self, members: &ClusterMembers) -> Result<(), DataplaneError> {
        self.lock().members = *members;
        Ok(())
    }

    fn nat_seen_since(&self, since: u32) -> Result<Vec<(FlowKey, NatValue)>, DataplaneError> {
        Ok(self
            .lock()
            .own
            .iter()
            .filter(|(_, v)| v.last_seen.wrapping_sub(since) as i32 >= 0)
            .copied()
            .collect())
    }
}
