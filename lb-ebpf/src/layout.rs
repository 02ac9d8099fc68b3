//! What is set at load: the tables' layout — `LB_FLOWS`' and `LB_NAT`'s bucket counts and
//! bucket-hash seeds (`lb_common::table::TableLayout`) — and the `CONFIG_F_*` flags (cluster
//! mode), `.rodata` globals the loader writes (`EbpfLoader::override_global`) before the map
//! is frozen, so the verifier reads them as constants: a bucket index is bounded by the
//! size the maps were created with, and the code of a mode the program was not loaded
//! with is never explored, nor run.

use core::ptr::{addr_of, read_volatile};

use lb_common::{
    maps::CONFIG_F_CLUSTER,
    table::{TableLayout, peer_buckets},
};

/// The layout; the object's own value is the built-in one (a loader that sets nothing
/// gets the compiled sizes and the public seeds of earlier releases).
#[unsafe(no_mangle)]
static LB_TABLE_LAYOUT: TableLayout = TableLayout::BUILT_IN;

/// `DataplaneConfig::flags` as loaded (`CONFIG_F_*`); the object's own value is none.
#[unsafe(no_mangle)]
static LB_DATAPLANE_FLAGS: u32 = 0;

// Volatile reads: LLVM must not fold the object's initial value into the code.

/// Whether the program was loaded in cluster mode (`CONFIG_F_CLUSTER`).
#[inline(always)]
pub fn cluster() -> bool {
    // SAFETY: a static.
    let flags = unsafe { read_volatile(addr_of!(LB_DATAPLANE_FLAGS)) };
    flags & CONFIG_F_CLUSTER != 0
}

/// Mask of an `LB_FLOWS` bucket index (buckets - 1).
#[inline(always)]
pub fn flow_mask() -> u32 {
    // SAFETY: a static's field.
    unsafe { read_volatile(addr_of!(LB_TABLE_LAYOUT.flow_buckets)) }.wrapping_sub(1)
}

/// Seed of the `LB_FLOWS` bucket hash.
#[inline(always)]
pub fn flow_seed() -> u32 {
    // SAFETY: as above.
    unsafe { read_volatile(addr_of!(LB_TABLE_LAYOUT.flow_seed)) }
}

/// Mask of an `LB_NAT` bucket index (buckets - 1).
#[inline(always)]
pub fn nat_mask() -> u32 {
    // SAFETY: as above.
    unsafe { read_volatile(addr_of!(LB_TABLE_LAYOUT.nat_buckets)) }.wrapping_sub(1)
}

/// Seed of the `LB_NAT` bucket hash.
#[inline(always)]
pub fn nat_seed() -> u32 {
    // SAFETY: as above.
    unsafe { read_volatile(addr_of!(LB_TABLE_LAYOUT.nat_seed)) }
}

/// Mask of a peer table's bucket index (buckets - 1; `lb_common::table::peer_buckets`).
#[inline(always)]
pub fn peer_mask() -> u32 {
    // SAFETY: as above.
    peer_buckets(unsafe { read_volatile(addr_of!(LB_TABLE_LAYOUT.flow_buckets)) }).wrapping_sub(1)
}
