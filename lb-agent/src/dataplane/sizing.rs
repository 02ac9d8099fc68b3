//! [`MapSizes`]: the backend maps' size, chosen at load time (`agent.max_backends`).
//!
//! The object is compiled with `lb_common::MAX_BACKENDS` entries in `LB_BACKENDS` and
//! `LB_BACKEND_STATS`; the loader gives both the configured size instead, and adopting a
//! previous program's maps compares their size with it (a different size is a layout
//! change: the map is created fresh). The XDP program bounds backend ids by the map it
//! reads, so any size works without recompiling it.

use aya::EbpfLoader;
use lb_common::{BACKEND_ENTRIES_LIMIT, MAX_BACKENDS, map_names};

/// Sizes of the maps whose size is a deployment choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Entries of `LB_BACKENDS` and `LB_BACKEND_STATS` (ids `1..backend_entries`).
    backend_entries: u32,
}

impl Default for MapSizes {
    /// The compiled size: 16,383 backends.
    fn default() -> Self {
        Self {
            backend_entries: MAX_BACKENDS,
        }
    }
}

impl MapSizes {
    /// Room for `max_backends` backends (ids `1..=max_backends`); `None` outside
    /// `1..BACKEND_ENTRIES_LIMIT`.
    pub const fn for_backends(max_backends: u32) -> Option<Self> {
        if max_backends == 0 || max_backends >= BACKEND_ENTRIES_LIMIT {
            return None;
        }
        Some(Self {
            backend_entries: max_backends + 1,
        })
    }

    /// How many backends the maps hold (the highest id).
    pub const fn max_backends(&self) -> u32 {
        self.backend_entries - 1
    }

    /// The size map `name` is created with, when it is not the object's.
    pub fn entries(&self, name: &str) -> Option<u32> {
        (name == map_names::BACKENDS || name == map_names::BACKEND_STATS)
            .then_some(self.backend_entries)
    }

    /// Tells the loader the sizes that differ from the object's.
    pub(super) fn apply(&self, loader: &mut EbpfLoader<'_>) {
        for name in [map_names::BACKENDS, map_names::BACKEND_STATS] {
            loader.map_max_entries(name, self.backend_entries);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_compiled_size_and_the_range_is_checked() {
        assert_eq!(MapSizes::default().max_backends(), MAX_BACKENDS - 1);
        assert_eq!(
            MapSizes::for_backends(MAX_BACKENDS - 1),
            Some(MapSizes::default())
        );
        assert_eq!(MapSizes::for_backends(0), None);
        assert_eq!(MapSizes::for_backends(BACKEND_ENTRIES_LIMIT), None);
        let big = MapSizes::for_backends(131_071).expect("in range");
        assert_eq!(big.entries(map_names::BACKENDS), Some(131_072));
        assert_eq!(big.entries(map_names::BACKEND_STATS), Some(131_072));
        assert_eq!(big.entries(map_names::FLOWS), None);
    }
}
