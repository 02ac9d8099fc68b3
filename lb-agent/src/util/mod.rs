//! Small helpers the agent's components share that know nothing of load balancing.

pub(crate) mod durable;
pub(crate) mod ordered_join;
pub(crate) mod prefetch;
