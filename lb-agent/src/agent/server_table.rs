//! A service's servers in one address-ordered vector: lookups by address (binary search)
//! as a `BTreeMap` gives them, and lookups by position, which a probe report's route
//! (`report_routes.rs`) uses so that it does not search for its server at all.

use std::{
    net::SocketAddr,
    sync::atomic::{AtomicU64, Ordering},
};

use super::server::ServerRt;

/// Bumped by every change of any table's layout (a server added or removed, a table
/// built): report routes computed before it may point at the wrong position.
/// Process-wide, so it only ever causes a spare re-route, never a missed one.
static LAYOUT_EPOCH: AtomicU64 = AtomicU64::new(0);

/// The current layout epoch (compare with the one routes were computed at).
pub(super) fn layout_epoch() -> u64 {
    LAYOUT_EPOCH.load(Ordering::Relaxed)
}

fn layout_changed() {
    LAYOUT_EPOCH.fetch_add(1, Ordering::Relaxed);
}

/// Servers by address, in ascending address order.
#[derive(Default)]
pub(super) struct ServerTable {
    entries: Vec<(SocketAddr, ServerRt)>,
}

impl ServerTable {
    fn find(&self, addr: &SocketAddr) -> Result<usize, usize> {
        self.entries.binary_search_by(|(a, _)| a.cmp(addr))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn contains_key(&self, addr: &SocketAddr) -> bool {
        self.find(addr).is_ok()
    }

    pub fn get(&self, addr: &SocketAddr) -> Option<&ServerRt> {
        self.find(addr).ok().map(|i| &self.entries[i].1)
    }

    pub fn get_mut(&mut self, addr: &SocketAddr) -> Option<&mut ServerRt> {
        self.find(addr).ok().map(|i| &mut self.entries[i].1)
    }

    /// The server at `index` (its position in address order), if there is one.
    pub fn at(&self, index: usize) -> Option<&ServerRt> {
        self.entries.get(index).map(|(_, s)| s)
    }

    /// [`ServerTable::at`], mutable.
    pub fn at_mut(&mut self, index: usize) -> Option<&mut ServerRt> {
        self.entries.get_mut(index).map(|(_, s)| s)
    }

    /// Adds or replaces the server at `addr`; returns the one replaced.
    pub fn insert(&mut self, addr: SocketAddr, server: ServerRt) -> Option<ServerRt> {
        match self.find(&addr) {
            Ok(i) => {
                layout_changed();
                Some(std::mem::replace(&mut self.entries[i].1, server))
            }
            Err(i) => {
                layout_changed();
                self.entries.insert(i, (addr, server));
                None
            }
        }
    }

    pub fn remove(&mut self, addr: &SocketAddr) -> Option<ServerRt> {
        let i = self.find(addr).ok()?;
        layout_changed();
        Some(self.entries.remove(i).1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&SocketAddr, &ServerRt)> {
        self.entries.iter().map(|(a, s)| (a, s))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&SocketAddr, &mut ServerRt)> {
        self.entries.iter_mut().map(|(a, s)| (&*a, s))
    }

    pub fn keys(&self) -> impl Iterator<Item = &SocketAddr> {
        self.entries.iter().map(|(a, _)| a)
    }

    pub fn values(&self) -> impl Iterator<Item = &ServerRt> {
        self.entries.iter().map(|(_, s)| s)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut ServerRt> {
        self.entries.iter_mut().map(|(_, s)| s)
    }
}

impl FromIterator<(SocketAddr, ServerRt)> for ServerTable {
    /// As a `BTreeMap` collects: in address order, the last of equal addresses kept.
    fn from_iter<I: IntoIterator<Item = (SocketAddr, ServerRt)>>(iter: I) -> Self {
        let mut entries: Vec<(SocketAddr, ServerRt)> = iter.into_iter().collect();
        // Stable: equal addresses stay in arrival order, and the last one is kept.
        entries.sort_by_key(|e| e.0);
        let mut kept: Vec<(SocketAddr, ServerRt)> = Vec::with_capacity(entries.len());
        for e in entries {
            match kept.last_mut() {
                Some(last) if last.0 == e.0 => *last = e,
                _ => kept.push(e),
            }
        }
        layout_changed();
        ServerTable { entries: kept }
    }
}

impl IntoIterator for ServerTable {
    type Item = (SocketAddr, ServerRt);
    type IntoIter = std::vec::IntoIter<(SocketAddr, ServerRt)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}
