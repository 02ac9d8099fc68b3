//! What the publisher remembers of what it wrote: per service its id, VIP, backends
//! (id and last entry), home and live tables and the walk state; the id pools; what a
//! previous run left in pinned maps, until the first apply matches it.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::SocketAddr,
};

use lb_common::maps::{Backend, ServiceMeta, VipKey};

use super::{DesiredService, failover};
use crate::maglev::MaglevBackend;

#[derive(Debug)]
pub(super) struct PublishedBackend {
    pub(super) id: u32,
    /// Last entry written; `None` until the first write.
    pub(super) entry: Option<Backend>,
    /// Its position in the service's last want (meaningful while that is `Some`).
    pub(super) want_index: usize,
}

#[derive(Debug)]
pub(super) struct PublishedService {
    pub(super) id: u32,
    pub(super) vip: VipKey,
    /// Last `LB_SERVICES` value written; `None` until the VIP is in the map.
    pub(super) meta: Option<ServiceMeta>,
    pub(super) backends: BTreeMap<SocketAddr, PublishedBackend>,
    /// Backends the home table was built from (sorted), and the home table: weighted
    /// Maglev over every configured backend, rebuilt only when that set changes.
    pub(super) home_members: Vec<MaglevBackend>,
    pub(super) home: Vec<u32>,
    /// Sorted ids of the backends taking new flows, and the live table published.
    pub(super) active: Vec<u32>,
    pub(super) live: Vec<u32>,
    /// Slots of the live table per backend id (the status page's Maglev share), counted
    /// when first asked for after a publish: a verdict must not pay a pass over the table.
    pub(super) live_slots: std::cell::OnceCell<HashMap<u32, u32>>,
    /// What the last apply wanted: an identical want is skipped without any work.
    pub(super) last_want: Option<DesiredService>,
    /// Bumped at every publish of `live` (fingerprint caching).
    pub(super) live_version: u64,
    /// The walk state that lets a change of `active` rewrite only the slots it changes
    /// (`None`: the next change computes `live` whole and publishes the whole table).
    pub(super) failover: Option<failover::Failover>,
    /// `live` may differ from the table in the map (a slot write failed): the next
    /// publish writes the whole table.
    pub(super) table_stale: bool,
}

impl PublishedService {
    /// A service `id` at `vip` with `meta` (adopted) or none yet, `backends` as written,
    /// and no table computed: the next publish builds its tables whole.
    pub(super) fn new(
        id: u32,
        vip: VipKey,
        meta: Option<ServiceMeta>,
        backends: BTreeMap<SocketAddr, PublishedBackend>,
    ) -> Self {
        PublishedService {
            id,
            vip,
            meta,
            backends,
            home_members: Vec::new(),
            home: Vec::new(),
            active: Vec::new(),
            live: Vec::new(),
            live_slots: Default::default(),
            last_want: None,
            live_version: 0,
            failover: None,
            table_stale: false,
        }
    }
}

/// Hands out ids, reusing freed ones as late as possible (oldest freed first), so that a
/// stale flow pinned to a freed id is unlikely to meet a new backend under it.
#[derive(Debug)]
pub(super) struct IdPool {
    pub(super) next: u32,
    pub(super) end: u32,
    pub(super) freed: VecDeque<u32>,
}

impl IdPool {
    pub(super) fn new(first: u32, end: u32) -> Self {
        Self {
            next: first,
            end,
            freed: VecDeque::new(),
        }
    }

    pub(super) fn take(&mut self) -> Option<u32> {
        if self.next < self.end {
            self.next += 1;
            Some(self.next - 1)
        } else {
            self.freed.pop_front()
        }
    }

    pub(super) fn give_back(&mut self, id: u32) {
        self.freed.push_back(id);
    }

    /// Marks `id` as taken (adopting a previous run's assignment).
    pub(super) fn reserve(&mut self, id: u32) {
        if id >= self.next && id < self.end {
            self.freed.extend(self.next..id);
            self.next = id + 1;
        } else {
            self.freed.retain(|&f| f != id);
        }
    }
}

/// A service found in pinned maps, not yet matched to the configuration.
#[derive(Debug)]
pub(super) struct AdoptedService {
    pub(super) id: u32,
    pub(super) meta: ServiceMeta,
    pub(super) backends: BTreeMap<SocketAddr, (u32, Backend)>,
}

/// `PublishedBackend::want_index` of a backend not (yet) found in the want being applied.
pub(super) const NOT_WANTED: usize = usize::MAX;
