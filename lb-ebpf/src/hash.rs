//! `lb_common::hash::flow_hash` computed one round after the other: each round reads
//! its key word only once the previous round's hash exists, so LLVM cannot hoist the ten
//! word loads and multiplications ahead of the chain and spill them (up to ten 8-byte
//! stack slots each time the hash is inlined: the largest part of `lb_xdp_full`'s frame
//! at its deepest point, docs/internals/fast-path.md "Stack budget"). Same function, same
//! values: the fixtures compare Maglev slots and nat ports with `lb_common`'s
//! (`flows::maglev_slot_is_the_flow_hash_modulo_the_ring`, `maglev_pool`, `nat_ports`).

use lb_common::maps::FlowKey;

use crate::stack_order::after;

/// murmur3's round, as `lb_common::hash`.
#[inline(always)]
const fn mix(h: u32, k: u32) -> u32 {
    let k = k
        .wrapping_mul(0xcc9e_2d51)
        .rotate_left(15)
        .wrapping_mul(0x1b87_3593);
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

/// murmur3's finaliser, as `lb_common::hash`.
#[inline(always)]
const fn finish(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// `key`, read only once `h` exists ([`after`]).
#[inline(always)]
fn after_h(key: &FlowKey, h: u32) -> &FlowKey {
    // SAFETY: the same reference, passed through `after`.
    unsafe { &*after(key, h as u64) }
}

/// `lb_common::hash::flow_hash(key, seed)`, round by round (see above).
#[inline(always)]
pub fn flow_hash(key: &FlowKey, seed: u32) -> u32 {
    let mut h = seed;
    let mut i = 0;
    while i < 4 {
        h = mix(h, after_h(key, h).src[i]);
        h = mix(h, after_h(key, h).dst[i]);
        i += 1;
    }
    let k = after_h(key, h);
    h = mix(h, ((k.sport as u32) << 16) | k.dport as u32);
    let k = after_h(key, h);
    h = mix(h, ((k.proto as u32) << 8) | k.family as u32);
    finish(h)
}
