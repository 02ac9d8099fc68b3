//! Where the set-associative tables' buckets lie ([`TableLayout`]: bucket counts and
//! seeds, set at load) and the sizes and seeds the object is compiled with. Below both
//! [`crate::maps`] (`DataplaneConfig::tables` keeps a copy) and [`crate::table`] (which
//! re-exports it with the slot layout).

use crate::{hash::table_hash, keys::FlowKey};

/// Buckets of `LB_NAT` the object is compiled with (a power of two; the loader sets the
/// size, [`TableLayout`]): 131,072 x 4 ways = 524,288 slots, twice the
/// 262,144 entries the LRU map held, so a bucket is rarely full at that many live
/// entries (a full bucket only makes port allocation try its next candidate).
pub const NAT_BUCKETS: u32 = 1 << 17;
/// The public seed earlier releases used for the `LB_NAT` bucket hash ([`TableLayout::BUILT_IN`]);
/// installs draw their own.
pub const SEED_NAT_TABLE: u32 = 0x2f69_3a4d;

/// Buckets of `LB_FLOWS` the object is compiled with (a power of two; the loader sets
/// the size, [`TableLayout`]): 262,144 x 4 ways = 1,048,576 slots, four times
/// [`crate::FLOW_TABLE_SIZE`], so that at that many live flows a bucket is rarely full
/// (a full bucket gives its longest-idle way to the new flow, counted `FLOW_EVICTED`):
/// ~0.4 % of new flows at 262,144 live ones, against ~3.8 % with half the buckets.
pub const FLOW_BUCKETS: u32 = 1 << 18;
/// The public seed earlier releases used for the `LB_FLOWS` bucket hash
/// ([`TableLayout::BUILT_IN`]); installs draw their own.
pub const SEED_FLOW_TABLE: u32 = 0x6c07_8965;

/// Buckets of each peer table (`LB_PEER_FLOWS`, `LB_PEER_NAT`) beside an `LB_FLOWS` of
/// `flow_buckets`: half as many, so that the tables hold `flow_buckets` connections
/// (`agent.max_flows`) at half their ways. The peer tables are two-choice tables: the agent,
/// their only writer, puts a key into the less full of its two buckets ([`crate::table::second_choice`]),
/// which at that load leaves a key without a free way about never (docs/capacity.md).
pub const fn peer_buckets(flow_buckets: u32) -> u32 {
    if flow_buckets < 2 {
        1
    } else {
        flow_buckets / 2
    }
}

/// Where the tables' buckets lie and how keys are hashed into them: the bucket counts
/// of `LB_FLOWS` and `LB_NAT` (powers of two, chosen at load from `agent.max_flows`) and
/// the two bucket-hash seeds (secret, drawn once per install and kept with the maps).
///
/// The XDP program reads it from a frozen `.rodata` global (`LB_TABLE_LAYOUT`) that the
/// loader sets, so the verifier sees constants; the agent also keeps a copy in
/// `LB_CONFIG` (`DataplaneConfig::tables`) for the next agent to find.
/// All zero (`Default`): no layout recorded. `Debug` leaves the seeds out: they are the
/// install's secret, never logged.
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct TableLayout {
    /// Buckets of `LB_FLOWS` (a power of two).
    pub flow_buckets: u32,
    /// Buckets of `LB_NAT` (a power of two).
    pub nat_buckets: u32,
    /// Seed of the `LB_FLOWS` bucket hash.
    pub flow_seed: u32,
    /// Seed of the `LB_NAT` bucket hash.
    pub nat_seed: u32,
}
const _: () = assert!(core::mem::size_of::<TableLayout>() == 16);

impl core::fmt::Debug for TableLayout {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TableLayout")
            .field("flow_buckets", &self.flow_buckets)
            .field("nat_buckets", &self.nat_buckets)
            .finish_non_exhaustive()
    }
}

impl TableLayout {
    /// What the object is compiled with: [`FLOW_BUCKETS`], [`NAT_BUCKETS`] and the public
    /// seeds of earlier releases (a program loaded without a layout, and the tables
    /// such a release left behind).
    pub const BUILT_IN: TableLayout = TableLayout {
        flow_buckets: FLOW_BUCKETS,
        nat_buckets: NAT_BUCKETS,
        flow_seed: SEED_FLOW_TABLE,
        nat_seed: SEED_NAT_TABLE,
    };

    /// Whether both bucket counts are nonzero powers of two.
    pub const fn is_valid(&self) -> bool {
        self.flow_buckets.is_power_of_two() && self.nat_buckets.is_power_of_two()
    }

    /// `key`'s hash in `LB_FLOWS`: its bucket is `hash % flow_buckets`, its tag the whole.
    #[inline(always)]
    pub fn flow_hash(&self, key: &FlowKey) -> u32 {
        table_hash(key, self.flow_seed)
    }

    /// Index of `key`'s bucket in `LB_FLOWS`.
    #[inline(always)]
    pub fn flow_bucket(&self, key: &FlowKey) -> u32 {
        self.flow_hash(key) & (self.flow_buckets - 1)
    }

    /// `key`'s hash in `LB_NAT`: its bucket is `hash % nat_buckets`, its tag the whole.
    #[inline(always)]
    pub fn nat_hash(&self, key: &FlowKey) -> u32 {
        table_hash(key, self.nat_seed)
    }

    /// Buckets of each peer table ([`peer_buckets`]).
    pub const fn peer_buckets(&self) -> u32 {
        peer_buckets(self.flow_buckets)
    }

    /// Index of `key`'s bucket in `LB_NAT`.
    #[inline(always)]
    pub fn nat_bucket(&self, key: &FlowKey) -> u32 {
        self.nat_hash(key) & (self.nat_buckets - 1)
    }
}
