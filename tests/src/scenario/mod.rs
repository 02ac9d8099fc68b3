//! Beds and pieces of scenario families: a bed of [`crate::net`] with backend servers,
//! a service and a running agent on it, and what the scenarios of one family share.
//!
//! - [`balance::Testbed`]: servers on every backend of a [`crate::net::topology`] and the
//!   weighted service of the balance scenarios (also the demo's base).
//! - [`syn_bed::SynBed`]: a nat service whose backends the SYN check and connect probe.
//! - [`realistic::Bed`]: HTTP backends as real ones behave, with passive health and the
//!   readings the `netns_traffic_*` scenarios and `lb-soak` judge by.
//! - [`neighbour_moves`]: backends resolved by ARP/NDP, and their MAC moves.
//! - [`pinned::PinnedToB1`]: three primaries with health listeners and a long-lived
//!   connection on b1, for the scenarios about what keeps an established connection.
//! - [`unnamed`]: when the maps stop naming a backend host, and what reached it after.
//! - [`health`], [`redundancy`], [`restart`], [`chaos`]: building blocks of the health,
//!   redundancy, restart/reload and chaos scenarios.

pub mod balance;
pub mod chaos;
pub mod health;
pub mod neighbour_moves;
pub mod pinned;
pub mod realistic;
pub mod redundancy;
pub mod restart;
pub mod syn_bed;
pub mod unnamed;
