//! Test doubles of the agent's dependencies: [`MemoryDataplane`], the in-memory data
//! plane that the agent's tests and the benchmarks publish into, with every write
//! recorded. `lb-agent run` never uses it: it runs on [`crate::dataplane::BpfDataplane`].

mod memory;

pub use memory::{MemoryDataplane, Write};
