//! [`MapSizes`]: the sizes chosen at load time — the backend maps (`agent.max_backends`),
//! the flow, nat and source tables (`agent.max_flows`), and in cluster mode the peer tables
//! and the connection-event ring — with the tables' hash seeds and the program's
//! `CONFIG_F_*` flags.
//!
//! The object is compiled with `lb_common::MAX_BACKENDS` entries in `LB_BACKENDS` and
//! `LB_BACKEND_STATS` and with the built-in table layout
//! (`lb_common::table::TableLayout::BUILT_IN`); the loader gives these maps the configured
//! sizes instead and writes the layout (bucket counts and seeds) into the program's
//! `.rodata`, so the program masks bucket indexes by the size the maps got. Adopting a
//! previous program's maps compares their size with these (a different size is a layout
//! change: the map is created fresh, and the flow and nat tables' live entries are
//! copied over, [`super::adopt::flow_tables`]). No size needs a rebuild.
//!
//! Ratios (per flow of `max_flows`, rounded up to a power of two): `LB_FLOWS` 1 bucket
//! of 4 ways (4 ways per flow, as the compiled 262,144 flows in 1,048,576 ways), `LB_NAT`
//! half a bucket (2 ways per flow), `LB_SOURCES` a quarter of an entry; in cluster mode
//! `LB_PEER_FLOWS` and `LB_PEER_NAT` half a bucket each (another node's connections, two
//! ways each, `lb_common::table::peer_buckets`), without it one bucket in all (the
//! kernel's least) and a page of `LB_CONN_EVENTS`.

use aya::EbpfLoader;
use lb_common::{
    BACKEND_ENTRIES_LIMIT, CONN_EVENT_RING_BYTES, FLOW_TABLE_SIZE, MAX_BACKENDS, SOURCE_TABLE_SIZE,
    map_names,
    maps::{CONFIG_F_CLUSTER, SourceBucket, SourceKey},
    table::{FlowBucket, NatBucket, PeerFlowBucket, TableLayout},
};

/// Smallest `agent.max_flows`.
pub const MIN_MAX_FLOWS: u32 = 1024;
/// Largest `agent.max_flows` (16,777,216: 4.5 GiB of `LB_FLOWS`, 3.3 GiB of `LB_NAT`).
pub const MAX_MAX_FLOWS: u32 = 1 << 24;
/// The default's floor: the size of earlier releases, whatever the host's memory.
pub const DEFAULT_FLOWS_FLOOR: u32 = FLOW_TABLE_SIZE;
/// The default's share of the host's physical memory for the three tables: 1/400
/// (0.25 %, Cilium's `bpf-map-dynamic-size-ratio` default).
pub const DEFAULT_MEMORY_DIVISOR: u64 = 400;
/// The name of the program's layout global (`lb-ebpf/src/layout.rs`).
pub const LAYOUT_GLOBAL: &str = "LB_TABLE_LAYOUT";
/// The name of the program's `CONFIG_F_*` flags global (`lb-ebpf/src/layout.rs`).
pub const FLAGS_GLOBAL: &str = "LB_DATAPLANE_FLAGS";

/// Kernel bytes per `LB_SOURCES` entry: 96 as this kernel charges them (`memlock` of
/// the map, fixture `tables::the_kernel_charges_what_the_sizes_say`): the LRU hash
/// element's header and its key and value (24 + 8 bytes, rounded to 8).
const SOURCE_ENTRY_BYTES: u64 = 96;
const _: () = assert!(size_of::<SourceKey>() <= 24 && size_of::<SourceBucket>() <= 8);

/// Kernel bytes of a bucket of both peer tables (`LB_PEER_FLOWS` and `LB_PEER_NAT`, array
/// values, as the kernel allocates them).
const PEER_BUCKET_BYTES: u64 = (size_of::<PeerFlowBucket>() + size_of::<NatBucket>()) as u64;

/// Sizes of the maps whose size is a deployment choice, and the tables' seeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Entries of `LB_BACKENDS` and `LB_BACKEND_STATS` (ids `1..backend_entries`).
    backend_entries: u32,
    /// Buckets and seeds of `LB_FLOWS` and `LB_NAT`.
    tables: TableLayout,
    /// Entries of `LB_SOURCES`.
    source_entries: u32,
    /// The program's `CONFIG_F_*` flags. Cluster mode (`CONFIG_F_CLUSTER`): the peer
    /// tables hold `max_flows` connections.
    flags: u32,
}

impl Default for MapSizes {
    /// The compiled sizes: 16,383 backends, 262,144 flows, the built-in (public) seeds.
    fn default() -> Self {
        Self {
            backend_entries: MAX_BACKENDS,
            tables: TableLayout::BUILT_IN,
            source_entries: SOURCE_TABLE_SIZE,
            flags: 0,
        }
    }
}

/// Kernel memory the tables take, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableMemory {
    pub flows: u64,
    pub nat: u64,
    pub sources: u64,
    /// `LB_PEER_FLOWS` and `LB_PEER_NAT` (cluster mode; 0 without it).
    pub peers: u64,
}

impl TableMemory {
    pub fn total(&self) -> u64 {
        self.flows + self.nat + self.sources + self.peers
    }
}

impl MapSizes {
    /// Room for `max_backends` backends (ids `1..=max_backends`); `None` outside
    /// `1..BACKEND_ENTRIES_LIMIT`.
    pub const fn for_backends(max_backends: u32) -> Option<Self> {
        if max_backends == 0 || max_backends >= BACKEND_ENTRIES_LIMIT {
            return None;
        }
        Some(Self {
            backend_entries: max_backends + 1,
            tables: TableLayout::BUILT_IN,
            source_entries: SOURCE_TABLE_SIZE,
            flags: 0,
        })
    }

    /// The same with tables for `max_flows` live flows (rounded up to a power of two;
    /// seeds kept); `None` outside `MIN_MAX_FLOWS..=MAX_MAX_FLOWS`.
    pub const fn with_flows(self, max_flows: u32) -> Option<Self> {
        if max_flows < MIN_MAX_FLOWS || max_flows > MAX_MAX_FLOWS {
            return None;
        }
        let flows = max_flows.next_power_of_two();
        Some(Self {
            tables: TableLayout {
                flow_buckets: flows,
                nat_buckets: flows / 2,
                ..self.tables
            },
            source_entries: flows / 4,
            ..self
        })
    }

    /// The same with the tables' bucket-hash seeds.
    pub const fn with_seeds(self, flow_seed: u32, nat_seed: u32) -> Self {
        Self {
            tables: TableLayout {
                flow_seed,
                nat_seed,
                ..self.tables
            },
            ..self
        }
    }

    /// The same in cluster mode: the peer tables sized by `max_flows` and the program
    /// loaded with `CONFIG_F_CLUSTER`.
    pub const fn with_cluster(self) -> Self {
        Self {
            flags: self.flags | CONFIG_F_CLUSTER,
            ..self
        }
    }

    /// Whether the program is loaded in cluster mode.
    pub const fn cluster(&self) -> bool {
        self.flags & CONFIG_F_CLUSTER != 0
    }

    /// The `CONFIG_F_*` flags the program is loaded with (`DataplaneConfig::flags`).
    pub const fn flags(&self) -> u32 {
        self.flags
    }

    /// Buckets of each peer table: half of `max_flows` in cluster mode
    /// (`lb_common::table::peer_buckets`), so that they hold `max_flows` connections;
    /// without it the object's one (`lb_common::PEER_ENTRIES_MIN`).
    pub const fn peer_buckets(&self) -> u32 {
        if self.cluster() {
            self.tables.peer_buckets()
        } else {
            lb_common::PEER_ENTRIES_MIN
        }
    }

    /// How many backends the maps hold (the highest id).
    pub const fn max_backends(&self) -> u32 {
        self.backend_entries - 1
    }

    /// How many live flows the tables are sized for (`agent.max_flows` rounded up to a
    /// power of two): one `LB_FLOWS` bucket of four ways each.
    pub const fn max_flows(&self) -> u32 {
        self.tables.flow_buckets
    }

    /// The tables' layout: bucket counts and seeds.
    pub const fn tables(&self) -> TableLayout {
        self.tables
    }

    /// Entries of `LB_SOURCES`.
    pub const fn source_entries(&self) -> u32 {
        self.source_entries
    }

    /// Kernel memory of `LB_FLOWS`, `LB_NAT` (array values, as the kernel allocates
    /// them), `LB_SOURCES` and in cluster mode the peer tables (per element, as this
    /// kernel charges it).
    pub fn table_memory(&self) -> TableMemory {
        let peers = if self.cluster() {
            u64::from(self.peer_buckets()) * PEER_BUCKET_BYTES
        } else {
            0
        };
        TableMemory {
            flows: u64::from(self.tables.flow_buckets) * size_of::<FlowBucket>() as u64,
            nat: u64::from(self.tables.nat_buckets) * size_of::<NatBucket>() as u64,
            sources: u64::from(self.source_entries) * SOURCE_ENTRY_BYTES,
            peers,
        }
    }

    /// Kernel memory per connection another node made that the peer tables hold (their
    /// buckets over `max_flows`: two ways of each table).
    pub const fn peer_connection_bytes() -> u64 {
        PEER_BUCKET_BYTES / 2
    }

    /// What status shows of the tables.
    pub fn status(&self) -> crate::view::TablesStatus {
        crate::view::TablesStatus {
            max_flows: self.max_flows(),
            flow_buckets: self.tables.flow_buckets,
            nat_buckets: self.tables.nat_buckets,
            source_entries: self.source_entries,
            memory_bytes: self.table_memory().total(),
        }
    }

    /// The size map `name` is created with, when it is not the object's.
    pub fn entries(&self, name: &str) -> Option<u32> {
        match name {
            map_names::BACKENDS | map_names::BACKEND_STATS => Some(self.backend_entries),
            map_names::FLOWS => Some(self.tables.flow_buckets),
            map_names::NAT => Some(self.tables.nat_buckets),
            map_names::SOURCES => Some(self.source_entries),
            map_names::PEER_FLOWS | map_names::PEER_NAT if self.cluster() => {
                Some(self.peer_buckets())
            }
            map_names::CONN_EVENTS if self.cluster() => Some(CONN_EVENT_RING_BYTES),
            _ => None,
        }
    }

    /// Tells the loader the sizes that differ from the object's, the tables' layout and
    /// the program's flags.
    pub fn apply<'a>(&'a self, loader: &mut EbpfLoader<'a>) {
        for name in [
            map_names::BACKENDS,
            map_names::BACKEND_STATS,
            map_names::FLOWS,
            map_names::NAT,
            map_names::SOURCES,
            map_names::PEER_FLOWS,
            map_names::PEER_NAT,
            map_names::CONN_EVENTS,
        ] {
            if let Some(n) = self.entries(name) {
                loader.map_max_entries(name, n);
            }
        }
        loader.override_global(LAYOUT_GLOBAL, &self.tables, true);
        loader.override_global(FLAGS_GLOBAL, &self.flags, true);
    }
}

/// The default `agent.max_flows` on a host with `memory` bytes of physical memory: the
/// largest power of two whose three tables fit in 1/[`DEFAULT_MEMORY_DIVISOR`] of it, at
/// least [`DEFAULT_FLOWS_FLOOR`], at most [`MAX_MAX_FLOWS`].
pub fn default_max_flows(memory: u64) -> u32 {
    let budget = memory / DEFAULT_MEMORY_DIVISOR;
    let mut flows = DEFAULT_FLOWS_FLOOR;
    while flows < MAX_MAX_FLOWS {
        let next = MapSizes::default().with_flows(flows * 2).expect("in range");
        if next.table_memory().total() > budget {
            break;
        }
        flows *= 2;
    }
    flows
}

/// This host's physical memory in bytes (`sysconf`), if it tells.
pub fn host_memory() -> Option<u64> {
    // SAFETY: plain queries without pointers.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && page > 0).then(|| pages as u64 * page as u64)
}

/// Two fresh secret seeds from the kernel's random source (`getrandom(2)`).
pub fn random_seeds() -> std::io::Result<(u32, u32)> {
    let mut buf = [0u8; 8];
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: writes at most the rest of `buf`.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok((
        u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]),
        u32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_compiled_size_and_the_range_is_checked() {
        assert_eq!(MapSizes::default().max_backends(), MAX_BACKENDS - 1);
        assert_eq!(
            MapSizes::for_backends(MAX_BACKENDS - 1),
            Some(MapSizes::default())
        );
        assert_eq!(MapSizes::for_backends(0), None);
        assert_eq!(MapSizes::for_backends(BACKEND_ENTRIES_LIMIT), None);
        let big = MapSizes::for_backends(131_071).expect("in range");
        assert_eq!(big.entries(map_names::BACKENDS), Some(131_072));
        assert_eq!(big.entries(map_names::BACKEND_STATS), Some(131_072));
        assert_eq!(big.entries(map_names::COUNTERS), None);
    }

    #[test]
    fn flows_size_the_three_tables_by_their_ratios() {
        let compiled = MapSizes::default();
        assert_eq!(
            compiled.with_flows(FLOW_TABLE_SIZE),
            Some(compiled),
            "the compiled sizes are those of 262,144 flows"
        );
        let s = compiled.with_flows(1_000_000).expect("in range");
        assert_eq!(s.max_flows(), 1 << 20, "rounded up to a power of two");
        assert_eq!(s.entries(map_names::FLOWS), Some(1 << 20));
        assert_eq!(s.entries(map_names::NAT), Some(1 << 19));
        assert_eq!(s.entries(map_names::SOURCES), Some(1 << 18));
        assert!(s.tables().is_valid());
        let m = s.table_memory();
        assert_eq!(m.flows, 288 << 20);
        assert_eq!(m.nat, 208 << 20);
        assert_eq!(m.sources, 24 << 20);
        assert_eq!(compiled.with_flows(MIN_MAX_FLOWS - 1), None);
        assert_eq!(compiled.with_flows(MAX_MAX_FLOWS + 1), None);
        assert!(compiled.with_flows(MAX_MAX_FLOWS).is_some());
    }

    #[test]
    fn the_default_follows_host_memory_between_floor_and_cap() {
        const GIB: u64 = 1 << 30;
        assert_eq!(default_max_flows(0), DEFAULT_FLOWS_FLOOR);
        assert_eq!(default_max_flows(16 * GIB), DEFAULT_FLOWS_FLOOR);
        // 256 GiB: 655 MiB for the tables, 1,048,576 flows take ~512 MiB.
        assert_eq!(default_max_flows(256 * GIB), 1 << 20);
        assert_eq!(default_max_flows(u64::MAX), MAX_MAX_FLOWS);
        for mem in [64 * GIB, 256 * GIB, 4096 * GIB] {
            let flows = default_max_flows(mem);
            let used = MapSizes::default()
                .with_flows(flows)
                .expect("in range")
                .table_memory()
                .total();
            assert!(used <= mem / DEFAULT_MEMORY_DIVISOR || flows == DEFAULT_FLOWS_FLOOR);
        }
    }

    #[test]
    fn seeds_are_drawn_fresh() {
        let a = random_seeds().expect("getrandom");
        let b = random_seeds().expect("getrandom");
        assert_ne!(a, b, "two draws of 64 bits");
    }
}
