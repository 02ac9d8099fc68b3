//! Every BPF map of the data plane, declared as BTF maps under the names in `lb_common::map_names`.

use aya_ebpf::{
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
    macros::btf_map,
};
use lb_common::{
    BPF_F_MMAPABLE, BPF_F_NO_COMMON_LRU, CONN_EVENT_RING_MIN_BYTES, DECAP_ADDRS_MAX,
    DECAP_COUNTERS, EVENT_RING_BYTES, FLOW_CACHE_SLOTS, MAGLEV_BLOCKS, MAX_BACKENDS, MAX_SERVICES,
    MaglevBlock, PEER_ENTRIES_MIN, PROGRAM_SLOTS, SOURCE_TABLE_SIZE, VIP_INDEX_SLOTS,
    VIP_INDEX_TABLES, counters,
    events::{ConnEvent, PassiveEvent},
    maps::{
        Backend, BackendStats, ClusterMembers, DataplaneConfig, DecapAddr, FlowCacheEntry,
        NatValue, ServiceStats, SourceBucket, SourceKey, TickClock, VipIndexHeader, VipSlot,
    },
    table::{FLOW_BUCKETS, FlowBucket, NAT_BUCKETS, NatBucket, PeerFlowBucket},
};

/// Services and nat source addresses: two tables (see `LB_VIP_GEN`) of
/// `VIP_INDEX_BUCKETS` buckets of `VIP_INDEX_WAYS` slots; a key lives in bucket
/// `vip_hash(key, seed) % VIP_INDEX_BUCKETS` (seed in `LB_VIP_HDR`). An array, not a
/// hash map: the verifier inlines its lookups (no call into the kernel's hash table).
/// The agent writes the table that is not live through `mmap`, then flips
/// `LB_VIP_GEN`, as for `LB_MAGLEV`.
#[btf_map]
pub static LB_VIP_INDEX: Array<
    VipSlot,
    { (VIP_INDEX_TABLES * VIP_INDEX_SLOTS) as usize },
    { BPF_F_MMAPABLE as usize },
> = Array::new();

/// Which `LB_VIP_INDEX` table (and `LB_VIP_HDR` entry) is live: bit 0.
#[btf_map]
pub static LB_VIP_GEN: Array<u64, 1, { BPF_F_MMAPABLE as usize }> = Array::new();

/// Each `LB_VIP_INDEX` table's hash seed and nat port range.
#[btf_map]
pub static LB_VIP_HDR: Array<
    VipIndexHeader,
    { VIP_INDEX_TABLES as usize },
    { BPF_F_MMAPABLE as usize },
> = Array::new();

/// Every service's two Maglev tables (slot -> backend id, `NO_BACKEND` = 0 for none),
/// 16 slots per value, at `lb_common::maglev_block_index(service, generation, slot)`.
/// The agent writes the table that is not live through `mmap`, then flips
/// `LB_MAGLEV_GEN`; a packet reads the generation once, so it sees the old table or the
/// new one, never a mix. (An array-of-maps swap would be atomic too, but the kernel ends
/// every update of such a map with `synchronize_rcu()` — 5 to 10 ms here — which
/// breaks the sub-millisecond propagation budget.)
#[btf_map]
pub static LB_MAGLEV: Array<MaglevBlock, { MAGLEV_BLOCKS as usize }, { BPF_F_MMAPABLE as usize }> =
    Array::new();

/// Service id -> which of its two tables in `LB_MAGLEV` is live (bit 0). `u64` because
/// array values are 8-byte strided: the agent addresses them through `mmap`.
#[btf_map]
pub static LB_MAGLEV_GEN: Array<u64, { MAX_SERVICES as usize }, { BPF_F_MMAPABLE as usize }> =
    Array::new();

/// Backend id -> backend (address, port, MAC, flags). Id 0 is never used.
#[btf_map]
pub static LB_BACKENDS: Array<Backend, { MAX_BACKENDS as usize }> = Array::new();

/// Client 5-tuple -> pinned backend. A set-associative table in an array
/// (`lb_common::table`, `slots`), like `LB_NAT`: the verifier inlines its reads, a new
/// flow claims a way under the bucket's compare-and-swap lock (a free way, an idle
/// flow's, else the longest-idle flow's), and all CPUs share it.
#[btf_map]
pub static LB_FLOWS: Array<FlowBucket, { FLOW_BUCKETS as usize }> = Array::new();

/// Each CPU's cache of settled flows in front of `LB_FLOWS` (see `cache`): a per-CPU
/// array, so the verifier inlines its lookup and no CPU contends for it.
#[btf_map]
pub static LB_FLOW_CACHE: PerCpuArray<FlowCacheEntry, { FLOW_CACHE_SLOTS as usize }> =
    PerCpuArray::new();

/// nat: reply 5-tuple (`backend:port -> snat:nat_port`) -> what the client must see.
/// A set-associative table in an array (`lb_common::table`, `slots`): the verifier
/// inlines its reads, slots are claimed under a per-bucket compare-and-swap lock, and
/// all CPUs share it, so a reply handled on another CPU finds the entry.
#[btf_map]
pub static LB_NAT: Array<NatBucket, { NAT_BUCKETS as usize }> = Array::new();

/// nat: per-source fairness buckets ((client address, service) -> next allowed time).
/// Per-CPU LRU lists: no global lock on insert; a source evicted under pressure
/// comes back with a full bucket.
#[btf_map]
pub static LB_SOURCES: LruHashMap<
    SourceKey,
    SourceBucket,
    { SOURCE_TABLE_SIZE as usize },
    { BPF_F_NO_COMMON_LRU as usize },
> = LruHashMap::new();

/// Global outcome counters, indexed by `lb_common::counters::*` (raw: readers see
/// `lb_common::counters::derive`'s figures).
#[btf_map]
pub static LB_COUNTERS: PerCpuArray<u64, { counters::RAW_COUNT as usize }> = PerCpuArray::new();

/// Per-service packets/bytes/new flows/no-backend drops, indexed by service id.
#[btf_map]
pub static LB_SERVICE_STATS: PerCpuArray<ServiceStats, { MAX_SERVICES as usize }> =
    PerCpuArray::new();

/// Per-backend packets/bytes/new flows/successful connections, indexed by backend id.
#[btf_map]
pub static LB_BACKEND_STATS: PerCpuArray<BackendStats, { MAX_BACKENDS as usize }> =
    PerCpuArray::new();

/// Passive-failure events to the agent. `EVENT_RING_BYTES` is the ring size in bytes
/// (`max_entries` of a ring buffer); the type parameter only types `output`.
#[btf_map]
pub static LB_EVENTS: RingBuf<PassiveEvent, { EVENT_RING_BYTES as usize }> = RingBuf::new();

/// The flow clock's per-CPU cache (see `clock`).
#[btf_map]
pub static LB_CLOCK: PerCpuArray<TickClock, 1> = PerCpuArray::new();

/// The attached interface's MAC (see `DataplaneConfig`), written by the agent at attach.
#[btf_map]
pub static LB_CONFIG: Array<DataplaneConfig, 1> = Array::new();

/// `lb_xdp_full` at `lb_common::FULL_PATH_INDEX`: `lb_xdp`'s tail call for every packet
/// it does not serve itself (see `full_path`); `lb_xdp_peer` at
/// `lb_common::PEER_PATH_INDEX`: `lb_xdp_full`'s in cluster mode for a packet of a
/// connection another node made (see `peer`). Filled by the loader before the program
/// is attached; never adopted from a previous program.
#[btf_map]
pub static LB_PROGRAMS: ProgramArray<{ PROGRAM_SLOTS as usize }> = ProgramArray::new();

/// Cluster mode: connections other nodes made, by client 5-tuple: how that node pinned
/// each (`PeerFlow`). A two-choice set-associative table (`lb_common::table`,
/// `slots::find_choice`) written by the agent only, through `mmap` (no `bpf(2)` call per
/// entry); one bucket without cluster mode (the loader sizes it by `agent.max_flows`
/// with it). The program reads it only when a client packet missed `LB_FLOWS`.
#[btf_map]
pub static LB_PEER_FLOWS: Array<
    PeerFlowBucket,
    { PEER_ENTRIES_MIN as usize },
    { BPF_F_MMAPABLE as usize },
> = Array::new();

/// Cluster mode: those connections' reverse entries, by reply 5-tuple, as the node that
/// made each holds it in its `LB_NAT`. Read when a reply missed `LB_NAT`, and by the
/// allocation (a pair held here is taken). Laid out and sized as `LB_PEER_FLOWS`.
#[btf_map]
pub static LB_PEER_NAT: Array<
    NatBucket,
    { PEER_ENTRIES_MIN as usize },
    { BPF_F_MMAPABLE as usize },
> = Array::new();

/// Cluster mode: per-CPU room for one reverse entry taken over from `LB_PEER_NAT`
/// (`peer::lb_peer_adopt_reverse` copies it here and claims it from here: its frame, on
/// `lb_xdp_peer`'s chain, has no room for it).
#[btf_map]
pub static LB_PEER_SCRATCH: PerCpuArray<NatValue, 1> = PerCpuArray::new();

/// Cluster mode: nat connections established and ended, to the agent (see
/// `conn_events`). One page without cluster mode; the loader gives it
/// `lb_common::CONN_EVENT_RING_BYTES` with it.
#[btf_map]
pub static LB_CONN_EVENTS: RingBuf<ConnEvent, { CONN_EVENT_RING_MIN_BYTES as usize }> =
    RingBuf::new();

/// Cluster mode: the members and the shared SNAT addresses (see `peer_bounce`), written
/// by the agent.
#[btf_map]
pub static LB_CLUSTER: Array<ClusterMembers, 1> = Array::new();

/// `lb_decap`: the host's addresses (outer destinations whose tunnel packets it strips),
/// written by `lb-agent decap attach`.
#[btf_map]
pub static LB_DECAP_ADDRS: HashMap<DecapAddr, u32, { DECAP_ADDRS_MAX as usize }> = HashMap::new();

/// `lb_decap`'s counters (`lb_common::DECAP_*`).
#[btf_map]
pub static LB_DECAP_COUNTERS: PerCpuArray<u64, { DECAP_COUNTERS as usize }> = PerCpuArray::new();
