//! Cilium's per-connection maps, to weigh lb's memory per flow against on the same
//! kernel (`lb-fill-bench --memory`): the IPv4 conntrack table (`BPF_MAP_TYPE_HASH`,
//! 16-byte `ipv4_ct_tuple` keys, 56-byte `ct_entry` values) and the IPv4 SNAT table
//! (`HASH`, 16-byte keys, 40-byte `ipv4_nat_entry` values; two entries per nat
//! connection, one each way). Preallocated, as Cilium creates them by default. Katran's
//! flow table is [`super::lru`]'s. `lbr_anchor_maps` only keeps the maps in the object;
//! nothing runs it.

use aya_ebpf::{
    bindings::xdp_action, btf_maps::HashMap, macros::btf_map, macros::xdp, programs::XdpContext,
};

/// Entries of each map as compiled: few, so that loading the lab object costs nothing
/// for them; `lb-fill-bench --memory` sizes them as the table they are compared with.
pub const ANCHOR_ENTRIES: usize = 1024;

#[btf_map]
static LBR_CILIUM_CT4: HashMap<[u32; 4], [u64; 7], ANCHOR_ENTRIES> = HashMap::new();

#[btf_map]
static LBR_CILIUM_SNAT4: HashMap<[u32; 4], [u64; 5], ANCHOR_ENTRIES> = HashMap::new();

/// Looks up one key in both maps (`XDP_DROP` if either holds it), so the linker keeps
/// them.
#[xdp]
pub fn lbr_anchor_maps(_ctx: XdpContext) -> u32 {
    let key = [0u32; 4];
    if LBR_CILIUM_CT4.get_ptr(&key).is_some() || LBR_CILIUM_SNAT4.get_ptr(&key).is_some() {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}
