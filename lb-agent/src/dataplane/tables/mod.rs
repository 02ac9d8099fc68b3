//! The tables the agent writes through `mmap`: the Maglev tables, a pair per service in
//! one block pool ([`maglev_pool`] allocates, `maglev_table` publishes), and the VIP
//! index the program finds services in ([`vip_index`]), and the peer tables of cluster mode
//! ([`peer_table`]).

pub mod maglev_pool;
pub(in crate::dataplane) mod maglev_table;
mod mapping;
pub mod peer_table;
pub mod vip_index;
