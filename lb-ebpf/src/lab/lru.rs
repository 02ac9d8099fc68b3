//! Katran's flow table at the same fill as lb's (`lb-fill-bench`): a
//! `BPF_MAP_TYPE_LRU_HASH` of 40-byte 5-tuple keys and 16-byte values (Katran's
//! `flow_key` and `real_pos_lru`), one per forwarding CPU in Katran (`lru_mapping`), so
//! one here where one CPU runs. `lbr_lru_hit` is an established flow's lookup,
//! `lbr_lru_new` a new flow's lookup (a miss) and insert (`BPF_ANY`, which takes the
//! least recently used entry once the map is full), as Katran's `connection_table_lookup`
//! and `update_lru` do for TCP. Each reflects (`XDP_TX`) when the table did what the case
//! claims, `XDP_DROP` when not.

use aya_ebpf::{
    bindings::BPF_ANY, btf_maps::LruHashMap, macros::btf_map, macros::xdp, programs::XdpContext,
};
use lb_common::maps::FlowKey;

use crate::lab::reduced::reflect_after;

/// Katran's `real_pos_lru`: the backend's position and, for UDP, the last access time.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LruValue {
    pub pos: u32,
    pub _pad: u32,
    pub atime: u64,
}

/// Entries of the table: lb's table for 1,048,576 flows holds as many (the loader may
/// size it otherwise).
pub const LRU_ENTRIES: usize = 1 << 20;

#[btf_map]
static LBR_LRU: LruHashMap<FlowKey, LruValue, LRU_ENTRIES> = LruHashMap::new();

/// An established flow: the lookup hits (`XDP_DROP` on a miss).
#[xdp]
pub fn lbr_lru_hit(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| match LBR_LRU.get_ptr(&pkt.key) {
        // SAFETY: a value pointer the lookup returned, read once (as Katran reads `pos`).
        Some(v) => (unsafe { core::ptr::read_volatile(&(*v).pos) }) != u32::MAX,
        None => false,
    })
}

/// A new flow: the lookup misses, the insert succeeds (`XDP_DROP` if the key was there
/// or the insert failed).
#[xdp]
pub fn lbr_lru_new(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        if LBR_LRU.get_ptr(&pkt.key).is_some() {
            return false;
        }
        let value = LruValue {
            pos: pkt.key.sport as u32,
            _pad: 0,
            atime: 0,
        };
        LBR_LRU.insert(&pkt.key, &value, BPF_ANY as u64).is_ok()
    })
}
