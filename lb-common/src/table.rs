//! The set-associative tables kept in `ARRAY` maps (`LB_FLOWS`, `LB_NAT`): slot layout, slot-word
//! bits, the bucket hash, and a userspace mirror of the program's key search.
//!
//! A table is an array of [`Bucket`]s (one map value each, so that one inlined lookup
//! reaches every way) of `TABLE_WAYS` [`Slot`]s; a key lives in one of the ways of
//! bucket `table_hash(key, seed) % buckets`. Each slot's `word` says
//! whether it holds a key ([`SLOT_LIVE`]), counts its rewrites (a generation in bits
//! 2..32, so a reader can tell that the slot changed under it), carries the key's whole
//! 32-bit hash as a tag in its high half (a way whose tag differs is skipped without a
//! key compare), and, in way 0 only, the bucket's writer lock ([`SLOT_LOCK`]). The protocol is in
//! lb-ebpf's `slots` module and docs/internals/fast-path.md.

pub use crate::layout::{
    FLOW_BUCKETS, NAT_BUCKETS, SEED_FLOW_TABLE, SEED_NAT_TABLE, TableLayout, peer_buckets,
};
use crate::maps::{FLOW_F_UNCONFIRMED, FlowKey, FlowValue, NatValue, PeerFlow};

/// Ways (slots) per bucket. Four: a bucket scan stays short for the verifier and a
/// bucket of `LB_NAT` is 416 bytes (6.5 cache lines).
pub const TABLE_WAYS: u32 = 4;

/// At most this many ways of an `LB_FLOWS` bucket hold unconfirmed flows (waiting for
/// their handshake or their proof, `FLOW_F_UNCONFIRMED`, not yet reclaimable): a flood
/// from spoofed sources, of SYNs, ACKs or datagrams, fills at most half of each bucket,
/// and never takes a confirmed flow's way (lb-ebpf's `slots::claim_admitted`,
/// docs/internals/fast-path.md "Floods", docs/capacity.md).
pub const PENDING_WAYS_MAX: u32 = 2;

/// Slot word bit: the slot holds a key (its key and value are complete).
pub const SLOT_LIVE: u64 = 1 << 0;
/// Slot word bit, way 0 only: a writer holds the bucket (taken with compare-and-swap).
pub const SLOT_LOCK: u64 = 1 << 1;
/// The slot's generation starts at this bit; every claim or release adds one.
pub const SLOT_GEN_SHIFT: u32 = 2;
/// One generation step.
pub const SLOT_GEN: u64 = 1 << SLOT_GEN_SHIFT;
/// The generation's bits (2..32; it wraps within them).
pub const SLOT_GEN_MASK: u64 = 0xffff_fffc;
/// The key's tag (its whole table hash) is the word's high half.
pub const SLOT_TAG_SHIFT: u32 = 32;

/// The word of a live slot holding a key with hash `hash`, after a word `old`: the next
/// generation, the tag, the lock bit kept.
#[inline(always)]
pub const fn live_word(old: u64, hash: u32) -> u64 {
    ((hash as u64) << SLOT_TAG_SHIFT)
        | ((old & SLOT_GEN_MASK).wrapping_add(SLOT_GEN) & SLOT_GEN_MASK)
        | (old & SLOT_LOCK)
        | SLOT_LIVE
}

/// The word of a slot freed after a word `old`: next generation, lock bit kept.
#[inline(always)]
pub const fn free_word(old: u64) -> u64 {
    ((old & SLOT_GEN_MASK).wrapping_add(SLOT_GEN) & SLOT_GEN_MASK) | (old & SLOT_LOCK)
}

/// Slots of `LB_NAT` ([`NAT_BUCKETS`] buckets).
pub const NAT_SLOTS: u32 = NAT_BUCKETS * TABLE_WAYS;

/// Slots of `LB_FLOWS` ([`FLOW_BUCKETS`] buckets).
pub const FLOW_SLOTS: u32 = FLOW_BUCKETS * TABLE_WAYS;
/// A flow idle this long (no `last_seen_ns` refresh) holds its way only until its
/// bucket needs it: a new flow takes it like a free way (not counted as an eviction).
/// TCP's established timeout of IPVS, as for established nat entries.
pub const FLOW_IDLE_NS: u64 = 900_000_000_000;
/// How long a handshake may wait (`FLOW_F_SYN_PENDING`, counted from the SYN that started
/// the wait, `FlowValue::last_seen_ns`): the latest a client's same-ISN SYN is still taken
/// for a retransmission, and the age at which a flow that still waits has failed and
/// holds its way only until its bucket needs it (as an idle flow, [`flow_reclaimable`]).
///
/// Linux (`tcp_syn_retries` 6, the default) resends a SYN 1, 3, 7, 15, 31 and 63 s
/// after the first and gives up at 127 s; the BSDs/macOS and Windows give up sooner.
/// 66 s is the last resend plus 3 s for the flow clock (one tick late at most) and timer
/// slack. docs/passive-signals.md, "Which SYN is a resend".
pub const SYN_WAIT_MAX_NS: u64 = 66_000_000_000;
const _: () = assert!(
    SYN_WAIT_MAX_NS > 63_000_000_000,
    "Linux's last resend is inside"
);

/// One slot of a table: the word, the 5-tuple, the value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot<V> {
    /// [`SLOT_LIVE`], [`SLOT_LOCK`] (way 0) and the generation.
    pub word: u64,
    pub key: FlowKey,
    pub value: V,
}

/// One map value: a bucket's ways.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket<V> {
    pub ways: [Slot<V>; TABLE_WAYS as usize],
}

/// One way of an `LB_NAT` bucket.
pub type NatSlot = Slot<NatValue>;
const _: () = assert!(core::mem::size_of::<NatSlot>() == 104);
/// `LB_NAT` value.
pub type NatBucket = Bucket<NatValue>;
const _: () = assert!(core::mem::size_of::<NatBucket>() == 416);

/// One way of an `LB_FLOWS` bucket.
pub type FlowSlot = Slot<FlowValue>;
const _: () = assert!(core::mem::size_of::<FlowSlot>() == 72);
/// `LB_FLOWS` value.
pub type FlowBucket = Bucket<FlowValue>;
const _: () = assert!(core::mem::size_of::<FlowBucket>() == 288);

/// One way of an `LB_PEER_FLOWS` bucket.
pub type PeerFlowSlot = Slot<PeerFlow>;
const _: () = assert!(core::mem::size_of::<PeerFlowSlot>() == 56);
/// `LB_PEER_FLOWS` value.
pub type PeerFlowBucket = Bucket<PeerFlow>;
const _: () = assert!(core::mem::size_of::<PeerFlowBucket>() == 224);

/// The hash whose low bits index a key's second bucket in a two-choice table, from the
/// key's table hash (the first bucket's): the hash mixed again (a 32-bit finalizer), so
/// that keys sharing a first bucket spread over the others.
#[inline(always)]
pub const fn second_choice(hash: u32) -> u32 {
    let mut x = hash ^ (hash >> 16);
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Whether a flow last refreshed at `last_seen_ns` is idle at `now_ns` (its way may go
/// to a new flow). Signed: another CPU's clock may be a tick ahead.
#[inline(always)]
pub fn flow_idle(last_seen_ns: u64, now_ns: u64) -> bool {
    now_ns.wrapping_sub(last_seen_ns) as i64 > FLOW_IDLE_NS as i64
}

/// Whether flow `v` may give its way to a new flow at `now_ns`: idle ([`flow_idle`]),
/// or still unconfirmed ([`FLOW_F_UNCONFIRMED`]) [`SYN_WAIT_MAX_NS`] after the SYN that
/// started its wait or its last refresh (a failed handshake, a source that never proved
/// itself). Signed, as `flow_idle`.
#[inline(always)]
pub fn flow_reclaimable(v: &FlowValue, now_ns: u64) -> bool {
    let age = now_ns.wrapping_sub(v.last_seen_ns) as i64;
    let limit = if v.flags & FLOW_F_UNCONFIRMED != 0 {
        SYN_WAIT_MAX_NS
    } else {
        FLOW_IDLE_NS
    };
    age > limit as i64
}

/// Whether two 5-tuples are equal, word by word (no `memcmp` in BPF; the padding is
/// not compared).
#[inline(always)]
pub fn same_flow(a: &FlowKey, b: &FlowKey) -> bool {
    (a.src[0] == b.src[0])
        & (a.src[1] == b.src[1])
        & (a.src[2] == b.src[2])
        & (a.src[3] == b.src[3])
        & (a.dst[0] == b.dst[0])
        & (a.dst[1] == b.dst[1])
        & (a.dst[2] == b.dst[2])
        & (a.dst[3] == b.dst[3])
        & (a.sport == b.sport)
        & (a.dport == b.dport)
        & (a.proto == b.proto)
        & (a.family == b.family)
}

/// The way of `bucket` (its `TABLE_WAYS` slots, as read from the map) holding `key`
/// live, as the program searches: userspace's mirror for the agent and tests.
pub fn find_way<V>(bucket: &Bucket<V>, key: &FlowKey) -> Option<usize> {
    bucket
        .ways
        .iter()
        .position(|s| s.word & SLOT_LIVE != 0 && same_flow(&s.key, key))
}

#[cfg(feature = "user")]
mod pod {
    // `Bucket` and `Slot` are `#[repr(C)]` and `Copy`, made of a `u64`, a `FlowKey` and a
    // `NatValue` or `FlowValue` (maps.rs' `impl_pod!`); the slots' asserted sizes are the
    // sums of their fields'.
    impl_pod!(super::NatBucket, super::FlowBucket, super::PeerFlowBucket);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16) -> FlowKey {
        FlowKey {
            src: [0x0a00_0002, 0, 0, 0],
            dst: [0x0a00_0001, 0, 0, 0],
            sport: 80u16.to_be(),
            dport: port.to_be(),
            proto: crate::IPPROTO_TCP,
            family: crate::FAMILY_V4,
            _pad: [0; 2],
        }
    }

    /// Consecutive nat ports toward one backend spread over the buckets: 64,000 keys
    /// in 131,072 buckets put at most a handful in any one.
    #[test]
    fn nat_ports_spread_over_buckets() {
        let mut per_bucket = [0u8; NAT_BUCKETS as usize];
        for port in 1024..=65_023u16 {
            let b = TableLayout::BUILT_IN.nat_bucket(&key(port));
            per_bucket[b as usize] += 1;
        }
        let worst = per_bucket.iter().max().copied().unwrap_or(0);
        assert!(worst <= 6, "a bucket got {worst} keys");
    }

    #[test]
    fn a_flow_is_idle_only_past_the_timeout() {
        let now = 5_000 * 1_000_000_000;
        assert!(!flow_idle(now - FLOW_IDLE_NS, now), "exactly the timeout");
        assert!(flow_idle(now - FLOW_IDLE_NS - 1, now));
        assert!(!flow_idle(now + 4_000_000, now), "a stamp a tick ahead");
    }

    #[test]
    fn a_failed_handshake_is_reclaimable_after_the_last_resend() {
        let now = 5_000 * 1_000_000_000;
        let at = |age: u64, flags: u32| FlowValue {
            flags,
            last_seen_ns: now - age,
            ..FlowValue::default()
        };
        let pending = crate::maps::FLOW_F_SYN_PENDING;
        assert!(!flow_reclaimable(&at(SYN_WAIT_MAX_NS, pending), now));
        assert!(flow_reclaimable(&at(SYN_WAIT_MAX_NS + 1, pending), now));
        assert!(
            !flow_reclaimable(&at(SYN_WAIT_MAX_NS + 1, 0), now),
            "a settled flow keeps the idle timeout"
        );
        assert!(flow_reclaimable(&at(FLOW_IDLE_NS + 1, 0), now));
        let unproven = crate::maps::FLOW_F_UNPROVEN;
        assert!(!flow_reclaimable(&at(SYN_WAIT_MAX_NS, unproven), now));
        assert!(
            flow_reclaimable(&at(SYN_WAIT_MAX_NS + 1, unproven), now),
            "a source that never proved itself"
        );
    }

    #[test]
    fn find_way_needs_live_and_equal_key() {
        let mut bucket = NatBucket::default();
        bucket.ways[2].key = key(5000);
        assert_eq!(find_way(&bucket, &key(5000)), None, "not live");
        bucket.ways[2].word = SLOT_LIVE | (3 * SLOT_GEN);
        assert_eq!(find_way(&bucket, &key(5000)), Some(2));
        assert_eq!(find_way(&bucket, &key(5001)), None);
    }
}
