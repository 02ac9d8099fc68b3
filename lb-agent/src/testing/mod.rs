//! Test doubles of the agent's dependencies: [`MemoryDataplane`], the in-memory data
//! plane that the agent's tests and the benchmarks publish into, with every write
//! recorded, and [`MemoryPeers`], cluster mode's peer tables in memory. `lb-agent run`
//! never uses them: it runs on [`crate::dataplane::BpfDataplane`] and its
//! [`crate::dataplane::peers::ClusterTables`].

mod memory;
mod peers;

pub use memory::{MemoryDataplane, Write};
pub use peers::MemoryPeers;
