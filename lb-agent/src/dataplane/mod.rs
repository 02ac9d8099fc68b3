//! The data plane: the XDP program, its maps, and the agent's only way to them.
//!
//! The agent publishes and reads counters through [`Dataplane`], and the process
//! (`lb-agent run`) attaches and watches the program through [`DataplaneLifecycle`];
//! [`BpfDataplane`] implements both on the kernel. Concerns, one module each:
//!
//! - [`attach`]: putting the program on the interface through netlink and keeping it
//!   there, the second program it jumps to, tunnel parameters, capabilities, and lb's
//!   decapsulation program for backends;
//! - [`adopt`]: restart adoption — the state a previous agent left on the interface,
//!   which of its maps a new build keeps, the flow and nat tables carried over, the
//!   one-owner locks and the optional pins;
//! - [`tables`]: the Maglev table pool and the VIP index, written through `mmap`;
//! - [`sizing`]: the map sizes chosen at load time and the tables' seeds;
//! - `events`: the passive-event and connection-event ring buffers as async streams;
//! - [`census`]: the flow and nat tables counted off the agent's task, and the nat
//!   entries seen since a given time;
//! - [`peers`]: cluster mode's peer tables, other nodes' connections;
//! - `bpf`: [`BpfDataplane`], which loads the object and owns every map handle;
//! - `batch`, `sys`: the `bpf(2)` calls aya does not offer.

pub mod adopt;
pub mod attach;
mod batch;
mod bpf;
pub mod census;
mod error;
mod events;
mod lifecycle;
pub mod peers;
pub mod sizing;
mod sys;
pub mod tables;

pub use adopt::AttachedProgram;
pub use attach::{AttachMode, LinkWatch, detach, if_index};
pub use batch::PerCpuBatchReader;
pub use bpf::{BpfDataplane, PublishedState};
pub use error::DataplaneError;
pub use events::{ConnEventStream, EventStream, RingStream};
pub use lifecycle::{DataplaneLifecycle, LinkCheck};
pub use sizing::MapSizes;

use lb_common::{
    counters,
    maps::{Backend, BackendStats, ServiceMeta, ServiceStats, VipKey},
};

/// What the agent writes into and reads from the data plane.
pub trait Dataplane {
    /// Adds or replaces a virtual service.
    fn upsert_service(&mut self, vip: &VipKey, meta: &ServiceMeta) -> Result<(), DataplaneError>;
    /// Removes a virtual service and its Maglev table.
    fn remove_service(&mut self, vip: &VipKey, service_id: u32) -> Result<(), DataplaneError>;
    /// How many backends the maps hold: ids `1..=max_backends()` (`agent.max_backends`).
    fn max_backends(&self) -> u32 {
        lb_common::MAX_BACKENDS - 1
    }
    /// Writes backend `id` (`1..=max_backends()`).
    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError>;
    /// Publishes a service's Maglev table atomically: a packet sees the old or the new
    /// table, never a mix.
    fn publish_table(&mut self, service_id: u32, table: &[u32]) -> Result<(), DataplaneError>;
    /// Writes `(slot, backend id)` into the service's live Maglev table in place, slot by
    /// slot: a packet reads each slot's old or new backend (one aligned `u32`), so the
    /// caller writes only slots whose old and new backend may both take the packet at
    /// that moment (docs/internals/publish.md, *Rewriting only the changed slots*). The service must
    /// have a published table holding every slot given.
    fn write_slots(&mut self, service_id: u32, slots: &[(u32, u32)]) -> Result<(), DataplaneError>;
    /// Global outcome counters, summed over CPUs, indexed by `lb_common::counters`.
    fn counters(&self) -> Result<[u64; counters::COUNT as usize], DataplaneError>;
    /// Per-service counters summed over CPUs.
    fn service_stats(&self, service_id: u32) -> Result<ServiceStats, DataplaneError>;
    /// Per-backend counters summed over CPUs.
    fn backend_stats(&self, backend_id: u32) -> Result<BackendStats, DataplaneError>;
    /// Per-backend counters of ids `0..limit`, index = id (an id never written reads as
    /// zero). The real data plane reads them all in one call.
    fn backend_stats_below(&self, limit: u32) -> Result<Vec<BackendStats>, DataplaneError> {
        (0..limit).map(|id| self.backend_stats(id)).collect()
    }
    /// The last count of the flow and nat tables (`None`: not counted, or not yet).
    fn table_census(&self) -> Option<std::sync::Arc<census::TableCensus>> {
        None
    }
}
