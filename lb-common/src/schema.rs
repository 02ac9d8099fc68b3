//! Schema versions of the maps a new agent adopts from a previous one (docs/upgrades.md).
//!
//! A map's *layout* (key size, value size, entries, flags, type) is what the kernel can
//! check; its *schema* is what the bytes mean. A build that changes the meaning of a map
//! without changing its sizes (a field reused, a slot reinterpreted, another hash) bumps
//! the map's version here, and an agent never adopts a map whose recorded version
//! differs from its own: it creates that map fresh and says so.
//!
//! The agent records the versions it loaded in a small hash map, [`META_MAP`] (key: the
//! map's name, zero-padded to [`NAME_LEN`] bytes; value: its `u32` version), bound to the
//! loaded programs so that the next agent finds it among the attached program's maps.
//! [`META_MAP`] records its own format under its own name. A previous program without
//! [`META_MAP`] (a build from before versions were recorded) counts as [`BASELINE`] for
//! every map: its maps are judged by layout alone.

use crate::map_names;

/// Name of the metadata map (kernel names keep 15 bytes; this one fits).
pub const META_MAP: &str = "LB_SCHEMA";
/// Version of [`META_MAP`]'s own format, recorded under the key [`META_MAP`].
pub const META_FORMAT: u32 = 1;
/// The version of every map in a build that records none.
pub const BASELINE: u32 = 1;
/// Key size of [`META_MAP`]: the longest map name (`LB_BACKEND_STATS`) without a NUL.
pub const NAME_LEN: usize = 16;

/// The schema version of every adopted map in this build. Bump a map's number whenever
/// its bytes change meaning; a layout (size) change is detected without it.
pub const VERSIONS: [(&str, u32); 15] = [
    (map_names::VIP_INDEX, BASELINE),
    (map_names::VIP_GEN, BASELINE),
    (map_names::VIP_HDR, BASELINE),
    (map_names::MAGLEV, BASELINE),
    (map_names::MAGLEV_GEN, BASELINE),
    (map_names::BACKENDS, BASELINE),
    (map_names::FLOWS, BASELINE),
    (map_names::NAT, BASELINE),
    (map_names::COUNTERS, BASELINE),
    (map_names::SERVICE_STATS, BASELINE),
    (map_names::BACKEND_STATS, BASELINE),
    (map_names::EVENTS, BASELINE),
    (map_names::PEER_FLOWS, BASELINE),
    (map_names::PEER_NAT, BASELINE),
    (map_names::CONN_EVENTS, BASELINE),
];

/// This build's version of map `name`, if it is an adopted map.
pub fn version(name: &str) -> Option<u32> {
    VERSIONS.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
}

/// [`META_MAP`]'s key for map `name`: its bytes, zero-padded (cut at [`NAME_LEN`]).
pub fn key(name: &str) -> [u8; NAME_LEN] {
    let mut key = [0u8; NAME_LEN];
    let n = name.len().min(NAME_LEN);
    key[..n].copy_from_slice(&name.as_bytes()[..n]);
    key
}

// Every name must fit the key whole, or two maps could share one.
const _: () = {
    let mut i = 0;
    while i < VERSIONS.len() {
        assert!(VERSIONS[i].0.len() <= NAME_LEN);
        i += 1;
    }
    assert!(META_MAP.len() <= NAME_LEN);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_names_zero_padded_and_every_adopted_map_has_a_version() {
        assert_eq!(&key(map_names::BACKEND_STATS), b"LB_BACKEND_STATS");
        assert_eq!(&key(META_MAP)[..10], b"LB_SCHEMA\0");
        assert_eq!(version(map_names::FLOWS), Some(BASELINE));
        assert_eq!(version(map_names::CLOCK), None);
        let mut keys = [[0u8; NAME_LEN]; VERSIONS.len()];
        for (i, (name, _)) in VERSIONS.iter().enumerate() {
            keys[i] = key(name);
        }
        for i in 0..keys.len() {
            for j in i + 1..keys.len() {
                assert_ne!(keys[i], keys[j]);
            }
        }
    }
}
