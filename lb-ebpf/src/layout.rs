//! The tables' layout set at load: `LB_FLOWS`' and `LB_NAT`'s bucket counts and bucket-hash
//! seeds (`lb_common::table::TableLayout`), a `.rodata` global the loader writes
//! (`EbpfLoader::override_global`) before the map is frozen, so the verifier reads its fields
//! as constants and a bucket index is bounded by the size the maps were created with.

use core::ptr::{addr_of, read_volatile};

use lb_common::table::TableLayout;

/// The layout; the object's own value is the built-in one (a loader that sets nothing
/// gets the compiled sizes and the public seeds of earlier releases).
#[unsafe(no_mangle)]
static LB_TABLE_LAYOUT: TableLayout = TableLayout::BUILT_IN;

// Volatile reads: LLVM must not fold the object's initial value into the code.

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
