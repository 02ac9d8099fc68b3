//! The flow and nat tables across restarts: the layout (sizes, secret seeds) a previous
//! program recorded in its `LB_CONFIG`, the layout this start uses, and the copy of a
//! previous table's live entries into a fresh one when the layout changed.
//!
//! A restart keeps the recorded seeds, so with an unchanged `agent.max_flows` both
//! tables are adopted as they are. With another size (or from a release whose tables
//! used the public built-in seeds) they are created fresh and every live entry is
//! re-hashed into the new table before the new program is swapped in (`copy`); entries
//! the old program writes between the copy and the swap are not carried over (those
//! flows' next packets pin them again, by the same Maglev choice).

use std::collections::BTreeMap;

use aya::{
    Pod,
    maps::{Array, Map, MapData},
};
use lb_common::{
    map_names,
    maps::{DataplaneConfig, FlowKey, FlowValue, NatValue},
    table::{Bucket, SLOT_LIVE, Slot, TABLE_WAYS, TableLayout, live_word},
};

use super::AttachedProgram;
use crate::dataplane::{DataplaneError, sizing::MapSizes};

/// What a previous program left of its tables: its layout and the two maps.
#[derive(Debug)]
pub struct PreviousTables {
    /// The layout its tables were built with (`TableLayout::BUILT_IN` for a release
    /// that recorded none).
    pub layout: TableLayout,
    /// Whether `layout` was recorded (else: an earlier release's built-in one).
    pub recorded: bool,
    /// Whether the previous program is an earlier release whose `LB_CONFIG` held only
    /// the MAC: its tables were hashed with the public built-in seeds, known here.
    pub legacy: bool,
    pub flows: Option<MapData>,
    pub nat: Option<MapData>,
}

/// Opens the previous program's `LB_CONFIG`, `LB_FLOWS` and `LB_NAT` by id.
pub fn previous_tables(program: &AttachedProgram) -> Result<PreviousTables, DataplaneError> {
    let mut out = PreviousTables {
        layout: TableLayout::BUILT_IN,
        recorded: false,
        legacy: false,
        flows: None,
        nat: None,
    };
    for &id in program.map_ids() {
        let Ok(map) = MapData::from_id(id) else {
            continue;
        };
        let Ok(info) = map.info() else { continue };
        let name = info.name();
        if name == map_names::FLOWS.as_bytes() {
            out.flows = Some(map);
        } else if name == map_names::NAT.as_bytes() {
            out.nat = Some(map);
        } else if name == map_names::CONFIG.as_bytes() && info.value_size() == LEGACY_CONFIG_SIZE {
            out.legacy = true;
        } else if name == map_names::CONFIG.as_bytes()
            && info.value_size() as usize == size_of::<DataplaneConfig>()
        {
            let config: Array<_, DataplaneConfig> =
                Array::try_from(Map::Array(map)).map_err(|source| DataplaneError::Map {
                    name: map_names::CONFIG,
                    source,
                })?;
            let value = config.get(&0, 0).map_err(|source| DataplaneError::Map {
                name: map_names::CONFIG,
                source,
            })?;
            if value.tables.is_valid() {
                out.layout = value.tables;
                out.recorded = true;
            }
        }
    }
    Ok(out)
}

/// `LB_CONFIG`'s value size in releases before the tables' layout was recorded (the
/// MAC, padding and flags).
const LEGACY_CONFIG_SIZE: u32 = 12;

/// The sizes for this start: `configured`'s sizes with the previous install's seeds
/// when it recorded them; the public built-in seeds when the previous program is an
/// earlier release whose tables keep their sizes ([`inherits_public_seeds`]); else two
/// fresh secret seeds.
pub fn with_seeds(
    configured: MapSizes,
    previous: Option<&PreviousTables>,
) -> Result<MapSizes, DataplaneError> {
    if let Some(p) = previous.filter(|p| p.recorded) {
        return Ok(configured.with_seeds(p.layout.flow_seed, p.layout.nat_seed));
    }
    if inherits_public_seeds(configured, previous) {
        let b = TableLayout::BUILT_IN;
        return Ok(configured.with_seeds(b.flow_seed, b.nat_seed));
    }
    let (flow, nat) =
        crate::dataplane::sizing::random_seeds().map_err(|source| DataplaneError::Io {
            what: "drawing the flow and nat tables' seeds (getrandom)",
            source,
        })?;
    Ok(configured.with_seeds(flow, nat))
}

/// Whether this start keeps the public built-in seeds of an earlier release's tables:
/// the previous program is such a release and the configured sizes are its sizes. The
/// tables are then adopted as they are, so that neither the upgrade nor a rollback to
/// that release loses a flow (a rollback could not find flows hashed with a secret
/// seed: its nat connections would break). A new `agent.max_flows` or `--reset` draws
/// this install's own seeds (docs/capacity.md).
pub fn inherits_public_seeds(configured: MapSizes, previous: Option<&PreviousTables>) -> bool {
    let built_in = TableLayout::BUILT_IN;
    let now = configured.tables();
    previous.is_some_and(|p| p.legacy && !p.recorded)
        && now.flow_buckets == built_in.flow_buckets
        && now.nat_buckets == built_in.nat_buckets
}

/// Whether a previous `name` table (`LB_FLOWS`, `LB_NAT` or, in cluster mode, a peer
/// table) can be adopted as it is: same buckets and same seeds. Else it is created fresh
/// (and the entries of `LB_FLOWS` and `LB_NAT` are copied). Without cluster mode the peer
/// tables are one empty bucket each, whatever their seeds.
pub fn same_table(name: &str, was: &TableLayout, now: &TableLayout, cluster: bool) -> bool {
    match name {
        map_names::FLOWS => was.flow_buckets == now.flow_buckets && was.flow_seed == now.flow_seed,
        map_names::NAT => was.nat_buckets == now.nat_buckets && was.nat_seed == now.nat_seed,
        // Hashed with `LB_FLOWS`' and `LB_NAT`'s seeds (their size follows `LB_FLOWS`',
        // which the layout check compares; never copied: the resync installs the other
        // nodes' connections again).
        map_names::PEER_FLOWS | map_names::PEER_NAT => {
            !cluster || (was.flow_seed == now.flow_seed && was.nat_seed == now.nat_seed)
        }
        _ => true,
    }
}

/// What a copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    /// Live entries written into the new table.
    pub kept: u64,
    /// Live entries whose new bucket was already full (a smaller table): the ones
    /// seen longest ago are left out.
    pub dropped: u64,
    /// The previous table's entries have another layout (an upgrade changed the slot):
    /// nothing was copied.
    pub incompatible: bool,
}

/// Copies the live flows of `old` (an `LB_FLOWS` of any size) into `new` (empty,
/// laid out by `now`), each in its bucket under `now`'s seed; where more than four
/// land in one bucket, the four most recently seen are kept.
pub fn copy_flows(
    old: MapData,
    new: &mut Map,
    now: &TableLayout,
) -> Result<Copied, DataplaneError> {
    copy::<FlowValue>(
        old,
        new,
        map_names::FLOWS,
        now.flow_buckets,
        |k| now.flow_hash(k),
        |v| v.last_seen_ns,
    )
}

/// [`copy_flows`] for `LB_NAT` (recency: the entry's `last_seen` seconds).
pub fn copy_nat(old: MapData, new: &mut Map, now: &TableLayout) -> Result<Copied, DataplaneError> {
    copy::<NatValue>(
        old,
        new,
        map_names::NAT,
        now.nat_buckets,
        |k| now.nat_hash(k),
        |v| u64::from(v.last_seen),
    )
}

fn copy<V>(
    old: MapData,
    new: &mut Map,
    name: &'static str,
    buckets: u32,
    hash: impl Fn(&FlowKey) -> u32,
    recency: impl Fn(&V) -> u64,
) -> Result<Copied, DataplaneError>
where
    V: Copy + Default,
    Bucket<V>: Pod,
{
    let err = |source| DataplaneError::Map { name, source };
    let info = old.info().map_err(err)?;
    if info.value_size() as usize != size_of::<Bucket<V>>() {
        return Ok(Copied {
            incompatible: true,
            ..Copied::default()
        });
    }
    let old_len = info.max_entries();
    let old: Array<_, Bucket<V>> = Array::try_from(Map::Array(old)).map_err(err)?;
    let mut by_bucket: BTreeMap<u32, Vec<Slot<V>>> = BTreeMap::new();
    for i in 0..old_len {
        let bucket = old.get(&i, 0).map_err(err)?;
        for s in bucket.ways {
            if s.word & SLOT_LIVE != 0 {
                let h = hash(&s.key);
                let slot = Slot {
                    word: live_word(0, h),
                    key: s.key,
                    value: s.value,
                };
                by_bucket.entry(h & (buckets - 1)).or_default().push(slot);
            }
        }
    }
    let mut new: Array<&mut MapData, Bucket<V>> = Array::try_from(new).map_err(err)?;
    let mut copied = Copied::default();
    for (index, mut slots) in by_bucket {
        slots.sort_by_key(|s| std::cmp::Reverse(recency(&s.value)));
        let fit = slots.len().min(TABLE_WAYS as usize);
        copied.dropped += (slots.len() - fit) as u64;
        copied.kept += fit as u64;
        let mut bucket = Bucket::<V>::default();
        bucket.ways[..fit].copy_from_slice(&slots[..fit]);
        new.set(index, &bucket, 0).map_err(err)?;
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(flow_buckets: u32, flow_seed: u32, nat_seed: u32) -> TableLayout {
        TableLayout {
            flow_buckets,
            nat_buckets: flow_buckets / 2,
            flow_seed,
            nat_seed,
        }
    }

    #[test]
    fn the_peer_tables_are_kept_whenever_their_seeds_are_or_unused() {
        let was = layout(1 << 18, 7, 11);
        for name in [map_names::PEER_FLOWS, map_names::PEER_NAT] {
            // A new max_flows alone: their size is the layout check's.
            assert!(
                same_table(name, &was, &layout(1 << 12, 7, 11), true),
                "{name}"
            );
            assert!(
                !same_table(name, &was, &layout(1 << 18, 8, 11), true),
                "{name}"
            );
            assert!(
                !same_table(name, &was, &layout(1 << 18, 7, 12), true),
                "{name}"
            );
            // Without cluster mode: one empty bucket, whatever the seeds.
            assert!(
                same_table(name, &was, &layout(1 << 18, 8, 12), false),
                "{name}"
            );
        }
        assert!(!same_table(
            map_names::FLOWS,
            &was,
            &layout(1 << 12, 7, 11),
            false
        ));
    }
}
