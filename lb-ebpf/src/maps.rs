//! Every BPF map of the data plane, declared as BTF maps under the names in `lb_common::map_names`.

use aya_ebpf::{
    btf_maps::{Array, ArrayOfMaps, HashMap, LruHashMap, PerCpuArray, RingBuf},
    macros::btf_map,
};
use lb_common::{
    BPF_F_MMAPABLE, BPF_F_NO_COMMON_LRU, EVENT_RING_BYTES, FLOW_TABLE_SIZE, MAGLEV_RING_SIZE,
    MAX_BACKENDS, MAX_SERVICES, NAT_TABLE_SIZE, counters,
    events::PassiveEvent,
    maps::{
        Backend, BackendStats, FlowKey, FlowValue, NatValue, ServiceMeta, ServiceStats, VipKey,
    },
};

/// One service's Maglev lookup table: slot -> backend id (`NO_BACKEND` = 0 for none).
/// The agent fills a fresh one through `mmap` and swaps it into `LB_MAGLEV`, so the
/// inner maps must be created with exactly these parameters (type ARRAY, key u32,
/// value u32, `MAGLEV_RING_SIZE` entries, `BPF_F_MMAPABLE`).
pub type MaglevTable = Array<u32, { MAGLEV_RING_SIZE as usize }, { BPF_F_MMAPABLE as usize }>;

/// VIP (address, port, protocol, family) -> service.
#[btf_map]
pub static LB_SERVICES: HashMap<VipKey, ServiceMeta, { MAX_SERVICES as usize }> = HashMap::new();

/// Service id -> that service's current Maglev table (an inner map swapped atomically).
#[btf_map]
pub static LB_MAGLEV: ArrayOfMaps<MaglevTable, { MAX_SERVICES as usize }> = ArrayOfMaps::new();

/// Backend id -> backend (address, port, MAC, flags). Id 0 is never used.
#[btf_map]
pub static LB_BACKENDS: Array<Backend, { MAX_BACKENDS as usize }> = Array::new();

/// Client 5-tuple -> pinned backend. Per-CPU LRU lists: no global lock on insert.
#[btf_map]
pub static LB_FLOWS: LruHashMap<
    FlowKey,
    FlowValue,
    { FLOW_TABLE_SIZE as usize },
    { BPF_F_NO_COMMON_LRU as usize },
> = LruHashMap::new();

/// nat: reply 5-tuple (`backend:port -> snat:nat_port`) -> what the client must see.
/// One shared LRU list, so a reply handled on another CPU finds the entry.
#[btf_map]
pub static LB_NAT: LruHashMap<FlowKey, NatValue, { NAT_TABLE_SIZE as usize }> = LruHashMap::new();

/// Global outcome counters, indexed by `lb_common::counters::*`.
#[btf_map]
pub static LB_COUNTERS: PerCpuArray<u64, { counters::COUNT as usize }> = PerCpuArray::new();

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
