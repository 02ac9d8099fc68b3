//! Publishes the desired services into the data plane: service and backend ids, backend
//! entries, Maglev tables, VIPs — writing only what changed.
//!
//! Tables: each service has a *home* table, weighted Maglev over all its configured
//! backends (rebuilt only when that set or a weight changes), and a *live* table, the
//! home table with the slots of backends that must not take new flows failed over to
//! the others ([`crate::maglev::failover_table`]). A health verdict costs neither a Maglev
//! rebuild nor a pass over the table: the slots it changes are found from the failover
//! walks kept per slot ([`failover`]) and written in place.
//!
//! Order matters so that no packet sees a half-made service: a new service gets its
//! backends, then its table, then its VIP entry; a removed one loses its VIP first.
//!
//! Cost: a want that differs from the last one only in roles or MACs (a health verdict,
//! a membership change) takes the incremental path ([`incremental`]): work for the
//! changed backends only and the table slots that change; given the changed
//! backends alone ([`Publisher::apply_backends`]), no pass over the service. Anything else
//! (servers added or removed, a weight, the VIP) takes the full path, linear in the
//! service's backends. See docs/internals/publish.md.
//!
//! The [`Publisher`] owns what was written to the maps (the dataplane handle owns the
//! maps themselves); its rooms:
//!
//! | room | does |
//! |------|------|
//! | `want.rs` | what the agent asks for: [`DesiredService`], [`DesiredBackend`], [`Role`] |
//! | `plan.rs` | planning, pure: entries, service values, VIP keys, live table, slot counts |
//! | `write.rs` | writing, the full path: ids, entries, tables, VIPs, in a safe order |
//! | `incremental.rs`, `failover.rs` | writing, the incremental path: changed backends and slots |
//! | `state.rs` | what was written: per-service state, id pools, adopted services |
//! | `adopt.rs` | taking over a previous run's pinned maps |
//! | `queries.rs` | answers about what is published (ids, addresses, live slots) |

mod adopt;
mod failover;
mod incremental;
#[cfg(test)]
mod incremental_tests;
mod plan;
mod queries;
mod state;
#[cfg(test)]
mod tests;
mod want;
mod write;

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    time::Duration,
};

use lb_common::{MAX_BACKENDS, MAX_SERVICES, maps::VipKey};

pub use plan::{addr_words, vip_key, words_addr};
use state::{AdoptedService, IdPool, PublishedService};
pub use want::{DesiredBackend, DesiredService, NatSpec, Role, Tunnel};

use crate::dataplane::DataplaneError;

/// Why publishing failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error("more than {max} services", max = MAX_SERVICES)]
    TooManyServices,
    #[error("more than {max} backends (the data plane's size, `agent.max_backends`)")]
    TooManyBackends { max: u32 },
}

/// What one `apply` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Tables changed: written whole, or in place for the slots that changed.
    pub tables_published: usize,
    /// Table slots written (a whole table counts all its slots).
    pub slots_written: usize,
    pub backends_written: usize,
    pub services_written: usize,
    /// Backends whose entry was computed and compared: every backend of a service on the
    /// full path, only the changed ones on the incremental path.
    pub backends_examined: usize,
    /// Wanted services the caller described (all of them, or those a change concerns).
    pub services_given: usize,
    /// Wall time from the start of `apply` until the last map write.
    pub elapsed: Duration,
}

impl PublishReport {
    /// Adds what another apply of the same change did.
    pub fn absorb(&mut self, other: PublishReport) {
        self.tables_published += other.tables_published;
        self.slots_written += other.slots_written;
        self.backends_written += other.backends_written;
        self.services_written += other.services_written;
        self.backends_examined += other.backends_examined;
        self.services_given += other.services_given;
        self.elapsed += other.elapsed;
    }
}

/// The data-plane state the agent has published, and the diffing publisher.
#[derive(Debug)]
pub struct Publisher {
    services: BTreeMap<String, PublishedService>,
    service_ids: IdPool,
    backend_ids: IdPool,
    /// Published by a previous run (pinned maps), keyed by VIP; matched on first apply.
    adopted: HashMap<VipKey, AdoptedService>,
    /// Backend ids of a previous run that belong to no service; freed on first apply.
    orphans: Vec<u32>,
    /// Some adopted backend carries `BACKEND_F_SERVING`: the previous run knew the flag.
    /// Pinned maps of a version before it mark a backend in traffic with LIVE alone.
    adopted_serving_known: bool,
    /// `false`: every changed service takes the full path (tests compare the two).
    incremental: bool,
    /// Service name and address of every published backend id (passive events name ids).
    owners: HashMap<u32, (String, SocketAddr)>,
}

impl Default for Publisher {
    fn default() -> Self {
        Self {
            adopted: HashMap::new(),
            orphans: Vec::new(),
            adopted_serving_known: false,
            services: BTreeMap::new(),
            service_ids: IdPool::new(0, MAX_SERVICES),
            backend_ids: IdPool::new(1, MAX_BACKENDS),
            incremental: true,
            owners: HashMap::new(),
        }
    }
}

impl Publisher {
    /// A publisher for a data plane holding `max_backends` backends (ids
    /// `1..=max_backends`, [`crate::dataplane::Dataplane::max_backends`]).
    pub fn with_max_backends(max_backends: u32) -> Self {
        Self {
            backend_ids: IdPool::new(1, max_backends.saturating_add(1)),
            ..Self::default()
        }
    }

    /// How many backends the data plane holds.
    pub fn max_backends(&self) -> u32 {
        self.backend_ids.end - 1
    }
}
