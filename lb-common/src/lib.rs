//! Types, constants and pure helpers shared by the XDP program (`lb-ebpf`) and the agent.
//!
//! Layout:
//! - [`keys`]: the VIP and 5-tuple keys (re-exported by [`maps`]);
//! - [`maps`]: key and value types of every BPF map, with their sizes asserted;
//! - [`counters`]: indices and names of the global per-CPU outcome counters;
//! - [`events`]: the passive-failure and connection records sent through ring buffers;
//! - [`csum`]: one's-complement checksum folding and RFC 1624 incremental updates;
//! - [`hash`]: the flow hash used for Maglev slots and NAT port choice;
//! - [`schema`]: the schema version of each map a new agent adopts;
//! - [`layout`]: the tables' bucket counts and seeds (`TableLayout`, re-exported by [`table`]);
//! - [`table`]: the set-associative `ARRAY` tables (`LB_NAT`): layout and key search.
//!
//! Each module uses only those below it: [`keys`] ← [`hash`] ← [`layout`] ← [`maps`] ←
//! [`table`].
//!
//! Everything here is `#![no_std]`, `#[repr(C)]` and fixed width so that the kernel and
//! user copies are the same bytes. The `user` feature adds `aya::Pod` impls.
#![no_std]

/// `unsafe impl aya::Pod` for each type named (the `user` feature's map keys and values).
/// Each must be `#[repr(C)]` and `Copy`, its fields integers, arrays of integers or other
/// such types, and its size (asserted next to it) the sum of its fields' sizes, any
/// padding being an explicit `_pad` field: then every bit pattern is a valid value and no
/// byte is uninitialised, which is what `aya::Pod` requires.
#[cfg(feature = "user")]
macro_rules! impl_pod {
    ($($ty:ty),+ $(,)?) => {
        $(
            // SAFETY: the callers name only types of the shape the macro's documentation
            // requires (`#[repr(C)]`, integers only, no implicit padding).
            unsafe impl aya::Pod for $ty {}
        )+
    };
}

pub mod counters;
pub mod csum;
pub mod events;
pub mod hash;
pub mod keys;
pub mod layout;
pub mod maps;
pub mod schema;
pub mod table;

/// The Maglev table sizes a service may have (primes, as Maglev requires, ascending).
/// Each service gets the smallest one with at least [`MAGLEV_SLOTS_PER_BACKEND`] slots
/// per backend ([`maglev_size_for`]) unless its configuration names one; the largest
/// holds 2,621 backends at that ratio (more backends still work, less evenly).
pub const MAGLEV_SIZES: [u32; 4] = [4099, 16411, 65537, 262147];
/// The size tests and tools use when they need one fixed table size (one of
/// [`MAGLEV_SIZES`]: the default for 165 to 655 backends).
pub const MAGLEV_RING_SIZE: u32 = 65537;
/// Maglev's paper: a table of M >= 100 N slots keeps the imbalance between N backends
/// at about 1 % or less.
pub const MAGLEV_SLOTS_PER_BACKEND: u32 = 100;

/// The default table size for a service of `backends` backends: the smallest of
/// [`MAGLEV_SIZES`] with at least [`MAGLEV_SLOTS_PER_BACKEND`] slots per backend, or the
/// largest.
pub const fn maglev_size_for(backends: u32) -> u32 {
    let want = backends.saturating_mul(MAGLEV_SLOTS_PER_BACKEND);
    let mut i = 0;
    while i < MAGLEV_SIZES.len() {
        if MAGLEV_SIZES[i] >= want {
            return MAGLEV_SIZES[i];
        }
        i += 1;
    }
    MAGLEV_SIZES[MAGLEV_SIZES.len() - 1]
}

/// Whether `size` is one of [`MAGLEV_SIZES`].
pub const fn is_maglev_size(size: u32) -> bool {
    let mut i = 0;
    while i < MAGLEV_SIZES.len() {
        if MAGLEV_SIZES[i] == size {
            return true;
        }
        i += 1;
    }
    false
}

/// Tables per service in `LB_MAGLEV`: the live one and the one the agent writes next.
/// `LB_MAGLEV_GEN[service]` says which is live; the agent fills the other through
/// `mmap`, then flips the generation with one aligned store.
pub const MAGLEV_TABLES_PER_SERVICE: u32 = 2;
/// Slots per `LB_MAGLEV` value. The kernel pads every array value to 8 bytes, so a table
/// of bare `u32`s would waste half its memory and not be contiguous through `mmap`;
/// 16 slots (one 64-byte cache line) per value make each table one contiguous run of
/// `u32`s in the mapping.
pub const MAGLEV_BLOCK_SLOTS: u32 = 16;
/// One `LB_MAGLEV` value: 16 consecutive slots of one table.
pub type MaglevBlock = [u32; MAGLEV_BLOCK_SLOTS as usize];

/// Values (blocks) one table of `size` slots takes (the last one partly unused).
#[inline(always)]
pub const fn maglev_table_blocks(size: u32) -> u32 {
    size.div_ceil(MAGLEV_BLOCK_SLOTS)
}

/// Entries of `LB_MAGLEV`: the pool every service's pair of tables is allocated from
/// (contiguous runs of blocks; docs/internals/fast-path.md "Maglev tables"). 64 MiB: 128
/// services of 65,537 slots fill it, as do 32 of 262,147; 1,024 services of 4,099 slots
/// take half of it.
pub const MAGLEV_BLOCKS: u32 = 128 * MAGLEV_TABLES_PER_SERVICE * maglev_table_blocks(65537);

/// Index in `LB_MAGLEV` of the block holding `slot` of table `generation` (bit 0 is
/// used) of the pair of `size`-slot tables at block `base` (the service's
/// `ServiceMeta::maglev_base` and `maglev_size`); the slot is element
/// `slot % MAGLEV_BLOCK_SLOTS` of it.
#[inline(always)]
pub const fn maglev_block_index(base: u32, size: u32, generation: u64, slot: u32) -> u32 {
    base + (generation & 1) as u32 * maglev_table_blocks(size) + slot / MAGLEV_BLOCK_SLOTS
}

/// Buckets of one `LB_VIP_INDEX` table (a power of two).
pub const VIP_INDEX_BUCKETS: u32 = 8192;
/// Ways (slots) per bucket: a key lives in one of the ways of bucket
/// `vip_hash(key, seed) % VIP_INDEX_BUCKETS`.
pub const VIP_INDEX_WAYS: u32 = 4;
/// Slots of one `LB_VIP_INDEX` table.
pub const VIP_INDEX_SLOTS: u32 = VIP_INDEX_BUCKETS * VIP_INDEX_WAYS;
/// Tables in `LB_VIP_INDEX`: the live one and the one the agent writes next
/// (`LB_VIP_GEN` says which is live, as for Maglev).
pub const VIP_INDEX_TABLES: u32 = 2;

/// Index in `LB_VIP_INDEX` of way 0 of the bucket `hash` falls in, in table
/// `generation` (bit 0 is used).
#[inline(always)]
pub const fn vip_bucket_index(generation: u64, hash: u32) -> u32 {
    (generation & 1) as u32 * VIP_INDEX_SLOTS + (hash & (VIP_INDEX_BUCKETS - 1)) * VIP_INDEX_WAYS
}

/// Services (VIP, port, protocol) the data plane can hold; service ids are `0..MAX_SERVICES`.
pub const MAX_SERVICES: u32 = 1024;
/// Entries `LB_BACKENDS` and `LB_BACKEND_STATS` are compiled with: backend ids are
/// `1..MAX_BACKENDS` unless the agent sizes the maps otherwise at load time
/// (`agent.max_backends`, up to [`BACKEND_ENTRIES_LIMIT`]); id 0 means "no backend".
/// The data plane bounds ids by the maps' sizes, never by this constant.
pub const MAX_BACKENDS: u32 = 16384;
/// Most entries the backend maps may be given at load time (ids `1..BACKEND_ENTRIES_LIMIT`):
/// 32 MiB of `LB_BACKENDS` plus 32 MiB of `LB_BACKEND_STATS` per CPU at that size.
pub const BACKEND_ENTRIES_LIMIT: u32 = 1 << 20;
/// Backend id stored in a Maglev slot when the service has nothing to send to.
pub const NO_BACKEND: u32 = 0;
/// Flows the connection table (`LB_FLOWS`) is sized for: its array holds twice as
/// many ways (`table::FLOW_SLOTS`), so that this many live flows rarely fill a bucket.
pub const FLOW_TABLE_SIZE: u32 = 262_144;
/// Slots of each CPU's flow cache (`LB_FLOW_CACHE`, direct-mapped, a power of two).
pub const FLOW_CACHE_SLOTS: u32 = 4096;
/// Entries of the per-source fairness table (LRU; nat new-flow buckets per client).
pub const SOURCE_TABLE_SIZE: u32 = 65_536;
/// Bytes of the passive-event ring buffer (a power of two, multiple of the page size).
pub const EVENT_RING_BYTES: u32 = 256 * 1024;
/// Bytes of the connection-event ring buffer in cluster mode (a power of two, multiple of
/// the page size): 4 MiB, 27,594 events of 152 bytes (144 and the ring's 8-byte header),
/// a quarter of a second of 100,000 new connections per second (two events each)
/// between two reads by the agent.
pub const CONN_EVENT_RING_BYTES: u32 = 4 * 1024 * 1024;
/// What the connection-event ring buffer and the peer tables are compiled with, the size
/// they keep without cluster mode: one page of ring, one entry of each table (the
/// kernel refuses a map of none); in cluster mode the loader gives them
/// [`CONN_EVENT_RING_BYTES`] and `agent.max_flows` entries.
pub const CONN_EVENT_RING_MIN_BYTES: u32 = 4096;
/// Entries of `LB_PEER_FLOWS` and `LB_PEER_NAT` without cluster mode.
pub const PEER_ENTRIES_MIN: u32 = 1;
/// How many source ports the NAT path tries for a new flow before it gives up.
pub const NAT_PORT_ATTEMPTS: u32 = 8;
/// How long (in `maps::nat_seconds`, 2^30 ns: 2 is 1.07–2.1 s) a TCP nat entry still
/// waiting for its handshake (unanswered, or half-open) must have been silent before a
/// new TCP flow whose first `NAT_PORT_ATTEMPTS` candidates are all held may take its
/// pair over: a spoofed SYN flood holds a pair against real clients that long, not for
/// its lifecycle row's 4.3–8.6 s (docs/nat-ports.md, "Spoofed SYN floods").
pub const NAT_HANDSHAKE_DISPLACE: u32 = 2;

/// The step between a new flow's successive nat candidates in a space of `total`
/// (address, port) pairs (at most `maps::MAX_SNAT_ADDRS` x 65,536), from the flow's hash
/// `h`: 1 to `span`, drawn by `h`'s high half, with `span` the largest step whose
/// 2 x [`NAT_PORT_ATTEMPTS`] offsets `first + i * step` (the allocation's two passes) stay
/// within one turn of the space, so that they are distinct pairs whenever the space has
/// that many (consecutive, `1`, in a smaller one). A step drawn from the whole space has
/// short cycles instead: half of it visits 2 pairs, a quarter 4, and a client whose hash
/// draws one is refused with 2 pairs held (docs/nat-ports.md, "Allocation"). A multiply
/// and a shift, no division or branch: the XDP program's allocation has no stack or
/// verifier budget to spare.
#[inline(always)]
pub const fn nat_stride(h: u32, total: u32) -> u32 {
    let span = total.saturating_sub(1) / (2 * NAT_PORT_ATTEMPTS - 1);
    1 + (((h >> 16) * span) >> 16)
}

/// `BPF_F_NO_COMMON_LRU`: per-CPU LRU lists, no global lock on the hot path.
pub const BPF_F_NO_COMMON_LRU: u32 = 1 << 1;
/// `BPF_F_MMAPABLE`: the agent writes Maglev tables and generations through `mmap`.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// IP protocol numbers used in keys.
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_ICMPV6: u8 = 58;

/// Address family tags used in keys (not the OS's `AF_*` values, which differ by OS).
pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;

/// Names of the maps in the eBPF object; the agent opens them by these names.
pub mod map_names {
    /// Services and nat source addresses (two tables of hashed buckets, mmapable).
    pub const VIP_INDEX: &str = "LB_VIP_INDEX";
    /// Which `LB_VIP_INDEX` table is live (bit 0 of its one `u64`, mmapable).
    pub const VIP_GEN: &str = "LB_VIP_GEN";
    /// Each `LB_VIP_INDEX` table's seed and nat port range (mmapable).
    pub const VIP_HDR: &str = "LB_VIP_HDR";
    pub const MAGLEV: &str = "LB_MAGLEV";
    pub const MAGLEV_GEN: &str = "LB_MAGLEV_GEN";
    pub const BACKENDS: &str = "LB_BACKENDS";
    pub const FLOWS: &str = "LB_FLOWS";
    pub const NAT: &str = "LB_NAT";
    pub const COUNTERS: &str = "LB_COUNTERS";
    pub const SERVICE_STATS: &str = "LB_SERVICE_STATS";
    pub const BACKEND_STATS: &str = "LB_BACKEND_STATS";
    pub const EVENTS: &str = "LB_EVENTS";
    /// nat per-source fairness buckets (not state worth keeping: never pinned).
    pub const SOURCES: &str = "LB_SOURCES";
    /// Each CPU's cache of settled flows (not state: never pinned nor read by the agent).
    pub const FLOW_CACHE: &str = "LB_FLOW_CACHE";
    /// The data plane's per-CPU clock cache (not state: never pinned nor read by the agent).
    pub const CLOCK: &str = "LB_CLOCK";
    /// The interface's MAC (`maps::DataplaneConfig`); written at every attach, not pinned.
    pub const CONFIG: &str = "LB_CONFIG";
    /// `lb_xdp`'s tail-call target, `lb_xdp_full` at [`super::FULL_PATH_INDEX`]; filled
    /// at every load, never adopted (docs/internals/fast-path.md, "Two programs").
    pub const PROGRAMS: &str = "LB_PROGRAMS";
    /// Cluster mode: connections other nodes made, by client 5-tuple (`maps::PeerFlow`);
    /// written by the agent only.
    pub const PEER_FLOWS: &str = "LB_PEER_FLOWS";
    /// Cluster mode: those connections' reverse entries, by reply 5-tuple
    /// (`maps::NatValue`); written by the agent only.
    pub const PEER_NAT: &str = "LB_PEER_NAT";
    /// Cluster mode: per-CPU room for the reverse entry `lb_xdp_peer` takes over from
    /// `LB_PEER_NAT` (not state: never pinned nor read by the agent).
    pub const PEER_SCRATCH: &str = "LB_PEER_SCRATCH";
    /// Cluster mode: nat connections established and ended (`events::ConnEvent`).
    pub const CONN_EVENTS: &str = "LB_CONN_EVENTS";
    /// Cluster mode: the members, their MACs and the shared SNAT addresses
    /// (`maps::ClusterMembers`); written by the agent at start and when a member's MAC
    /// changes, not pinned.
    pub const CLUSTER: &str = "LB_CLUSTER";
    /// `lb_decap`: the host's addresses whose tunnel packets it strips.
    pub const DECAP_ADDRS: &str = "LB_DECAP_ADDRS";
    /// `lb_decap`: its per-CPU counters (`DECAP_*`).
    pub const DECAP_COUNTERS: &str = "LB_DECAP_COUNTERS";
}

/// Name of the XDP program function in the eBPF object.
pub const PROGRAM_NAME: &str = "lb_xdp";
/// Name of the whole-path XDP program `lb_xdp` tail-calls into for every packet it does
/// not serve itself (through `LB_PROGRAMS`; never attached).
pub const FULL_PROGRAM_NAME: &str = "lb_xdp_full";
/// `LB_PROGRAMS`' index of [`FULL_PROGRAM_NAME`].
pub const FULL_PATH_INDEX: u32 = 0;
/// Name of the cluster-mode program `lb_xdp_full` tail-calls into for a packet of a
/// connection another node made (through `LB_PROGRAMS`): it takes the connection over
/// from the peer tables and continues in [`FULL_PROGRAM_NAME`].
pub const PEER_PROGRAM_NAME: &str = "lb_xdp_peer";
/// `LB_PROGRAMS`' index of [`PEER_PROGRAM_NAME`].
pub const PEER_PATH_INDEX: u32 = 1;
/// Entries of `LB_PROGRAMS`.
pub const PROGRAM_SLOTS: u32 = 2;
/// Name of the pass-through XDP program (for veth peers).
pub const PASS_PROGRAM_NAME: &str = "lb_pass";
/// Name of the tc ingress program that sends out a tunnel service's merged segments, which
/// the XDP program encapsulated and passed in generic mode (docs/tunnel.md, "Offloads").
pub const TUNNEL_GSO_PROGRAM_NAME: &str = "lb_tunnel_gso";
/// Name of the backend-side decapsulation program (`lb-agent decap attach`).
pub const DECAP_PROGRAM_NAME: &str = "lb_decap";
/// `LB_DECAP_ADDRS` entries: addresses of one host.
pub const DECAP_ADDRS_MAX: u32 = 64;
/// `LB_DECAP_COUNTERS` index: a tunnel packet decapsulated and passed up the stack.
pub const DECAP_STRIPPED: u32 = 0;
/// `LB_DECAP_COUNTERS` index: a packet passed untouched (not a tunnel packet to one of
/// the host's addresses, or one whose inner header is cut or of no known family).
pub const DECAP_PASSED: u32 = 1;
/// `LB_DECAP_COUNTERS` slots.
pub const DECAP_COUNTERS: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_table_size_keeps_100_slots_per_backend() {
        assert_eq!(maglev_size_for(0), 4099);
        assert_eq!(maglev_size_for(40), 4099);
        assert_eq!(maglev_size_for(41), 16411);
        assert_eq!(maglev_size_for(164), 16411);
        assert_eq!(maglev_size_for(165), 65537);
        assert_eq!(maglev_size_for(655), 65537);
        assert_eq!(maglev_size_for(656), 262147);
        assert_eq!(maglev_size_for(u32::MAX), 262147, "the largest past it");
        for size in MAGLEV_SIZES {
            assert!(is_maglev_size(size));
            assert!(
                (2..size)
                    .take_while(|d| d * d <= size)
                    .all(|d| size % d != 0)
            );
        }
        assert!(!is_maglev_size(4100));
    }

    #[test]
    fn a_new_flows_nat_candidates_are_distinct_pairs() {
        const WALK: u32 = 2 * NAT_PORT_ATTEMPTS;
        let sizes = (1..=200).chain([9_999, 10_000, 31_744, 65_535, 126_976, 262_140]);
        for total in sizes {
            let want = total.min(WALK) as usize;
            for h in (0..2_000u32).map(|i| i.wrapping_mul(0x9e37_79b9) ^ (i << 16)) {
                let stride = nat_stride(h, total);
                let span = (total.saturating_sub(1) / (WALK - 1)).max(1);
                assert!((1..=span).contains(&stride), "total {total}: step {stride}");
                let mut seen = [0u32; WALK as usize];
                for (i, s) in seen.iter_mut().enumerate() {
                    *s = ((h % total) as u64 + i as u64 * stride as u64) as u32 % total;
                }
                seen.sort_unstable();
                let distinct = 1 + seen.windows(2).filter(|w| w[0] != w[1]).count();
                assert_eq!(distinct, want, "total {total}, hash {h:#x}: {seen:?}");
            }
        }
        // The steps still spread over the space's first fifteenth (not consecutive
        // probing).
        let mut drawn = [false; 10_000];
        for h in 0..=u16::MAX as u32 {
            drawn[nat_stride(h << 16, 10_000) as usize] = true;
        }
        assert_eq!(drawn.iter().filter(|d| **d).count(), 666);
    }

    #[test]
    fn a_pairs_second_table_follows_its_first() {
        assert_eq!(maglev_block_index(1000, 4099, 0, 0), 1000);
        assert_eq!(maglev_block_index(1000, 4099, 0, 4098), 1000 + 256);
        assert_eq!(maglev_block_index(1000, 4099, 1, 0), 1000 + 257);
        assert_eq!(maglev_block_index(1000, 4099, 3, 4098), 1000 + 257 + 256);
        assert_eq!(MAGLEV_BLOCKS, 1_048_832);
    }
}
