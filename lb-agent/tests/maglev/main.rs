//! lb-agent's Maglev tests in one binary: the weighted tables' properties, and flow
//! survival across nodes built on them.

mod multinode_flow_survival;
mod tables;
