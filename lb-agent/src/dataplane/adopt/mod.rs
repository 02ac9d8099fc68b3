//! Restart adoption: finding the state a previous agent left on the interface
//! ([`attached_program`]) and loading the new program on its maps ([`adopt_maps`], with
//! the per-map decision in [`schema`] and the versions the kernel keeps in
//! `schema_map`), the aya hand-over of adopted maps (`staging`), the flow and nat
//! tables carried across a layout change ([`flow_tables`]), the one-owner locks
//! ([`owner`]) and the optional map pins ([`pin`]).

mod attached;
pub mod flow_tables;
pub mod owner;
pub mod pin;
pub mod schema;
pub(in crate::dataplane) mod schema_map;
pub(in crate::dataplane) mod staging;

pub use attached::{ADOPTED_MAPS, AdoptedMaps, AttachedProgram, adopt_maps, attached_program};
