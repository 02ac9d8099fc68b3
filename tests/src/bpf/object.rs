//! A loaded copy of lb's XDP object for BPF_PROG_TEST_RUN fixtures: its own maps, typed
//! helpers to fill them and to read counters (summed over CPUs) and events.
//!
//! Loading runs the verifier over every program, the slow part of a fixture. So
//! [`Lb::load`] verifies once per process: a dropped `Lb` returns its object to a
//! process-wide pool, and the next `Lb::load` takes it back with every map as a fresh
//! load leaves it ([`Lb::recycled`]). Each `Lb` alive at a time has its own object, so
//! tests can still run in parallel. [`Lb::load_sized`] is always a fresh load.

use std::{
    collections::BTreeMap,
    mem::ManuallyDrop,
    net::IpAddr,
    os::fd::AsFd,
    sync::{Mutex, OnceLock},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, PerCpuArray, PerCpuValues, RingBuf},
    programs::{ProgramError, TestRun, TestRunOptions, Xdp},
};
use lb_agent::dataplane::{
    MapSizes,
    peers::{PeerConnection, PeerWriter},
    sizing::random_seeds,
    tables::{
        maglev_pool::{Pool, pair_blocks},
        vip_index,
    },
};
use lb_common::{
    FAMILY_V4, FAMILY_V6, MAGLEV_BLOCK_SLOTS, MAGLEV_BLOCKS, MAGLEV_RING_SIZE, MaglevBlock,
    counters,
    events::{ConnEvent, PassiveEvent},
    hash::flow_cache_slot,
    is_maglev_size, maglev_block_index, map_names,
    maps::{
        Backend, BackendStats, DataplaneConfig, FlowCacheEntry, FlowKey, FlowValue, NatValue,
        ServiceMeta, ServiceStats, TickClock, VipIndexHeader, VipKey, VipSlot,
    },
    table::{
        Bucket, FlowBucket, FlowSlot, NatBucket, NatSlot, SLOT_LIVE, SLOT_LOCK, TableLayout,
        find_way, free_word, live_word,
    },
};

/// XDP return codes.
pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;

/// Name of an XDP action, for messages.
pub fn action_name(action: u32) -> &'static str {
    match action {
        XDP_ABORTED => "XDP_ABORTED",
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        XDP_TX => "XDP_TX",
        4 => "XDP_REDIRECT",
        _ => "unknown",
    }
}

/// An address as the maps hold it: wire bytes, IPv4 in word 0.
pub fn addr_words(ip: IpAddr) -> [u32; 4] {
    match ip {
        IpAddr::V4(a) => [u32::from_ne_bytes(a.octets()), 0, 0, 0],
        IpAddr::V6(a) => {
            let o = a.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            [w(0), w(4), w(8), w(12)]
        }
    }
}

pub fn family(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 }
}

/// A map key for `src:sport -> dst:dport` (ports in host order here, stored in network order).
pub fn flow_key(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, proto: u8) -> FlowKey {
    FlowKey {
        src: addr_words(src),
        dst: addr_words(dst),
        sport: sport.to_be(),
        dport: dport.to_be(),
        proto,
        family: family(src),
        _pad: [0; 2],
    }
}

/// The result of one program run.
#[derive(Debug)]
pub struct Run {
    pub action: u32,
    /// The packet as the program left it.
    pub out: Vec<u8>,
}

/// Objects loaded with [`pooled_sizes`], free for the next [`Lb::load`].
static POOL: Mutex<Vec<Ebpf>> = Mutex::new(Vec::new());

/// The sizes [`Lb::load`] loads with: tables for 16,384 flows (`agent.max_flows =
/// 16384`, a size operators may set; every reset and table read of a fixture is a
/// sixteenth of the compiled 262,144's) and secret table seeds drawn once per process,
/// as a first start draws them. The fixtures of other sizes load their own
/// (`bpf_fixtures/tables.rs`, `flood.rs`, `bpf_flood_full_size`).
fn pooled_sizes() -> MapSizes {
    static SIZES: OnceLock<MapSizes> = OnceLock::new();
    *SIZES.get_or_init(|| {
        let (flow, nat) = random_seeds().expect("getrandom");
        MapSizes::default()
            .with_flows(16_384)
            .expect("in range")
            .with_seeds(flow, nat)
    })
}

/// One load of the XDP object with its programs ready to test-run.
pub struct Lb {
    ebpf: ManuallyDrop<Ebpf>,
    /// Whether the object goes back to [`POOL`] when this is dropped.
    pooled: bool,
    /// The services added, and the VIP index table last written for them.
    services: BTreeMap<VipKey, ServiceMeta>,
    vip_table: Option<vip_index::Layout>,
    /// The `LB_MAGLEV` pool's allocation (as the agent's data plane keeps it) and each
    /// service id's pair of tables: (base block, size).
    pool: Pool,
    pairs: BTreeMap<u32, (u32, u32)>,
    /// The sizes and table layout it was loaded with.
    sizes: MapSizes,
    /// The peer tables' writer, once [`Lb::install_peer`] mapped them.
    peers: Option<PeerWriter>,
}

impl Lb {
    /// `lb_agent::EBPF_OBJECT` with its programs loaded, with the fixtures' sizes and
    /// secret table seeds ([`pooled_sizes`]), as a first start loads it: the
    /// object a dropped `Lb` left, reset ([`Lb::recycled`]), or a fresh load (which runs
    /// the verifier) when none is free.
    pub fn load() -> Self {
        let free = POOL.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match free {
            Some(ebpf) => Self::wrap(ebpf, pooled_sizes(), true).recycled(),
            None => {
                let mut lb = Self::load_sized(pooled_sizes());
                lb.pooled = true;
                lb
            }
        }
    }

    /// This object with every map as a fresh load leaves it — arrays zero, hash maps
    /// empty, the event ring drained, `LB_PROGRAMS` holding `lb_xdp_full` — and no
    /// service, table or pool allocation remembered.
    pub fn recycled(mut self) -> Self {
        crate::bpf::maps::reset_maps(&self.ebpf)
            .unwrap_or_else(|e| panic!("resetting the loaded object's maps: {e}"));
        for name in [map_names::EVENTS, map_names::CONN_EVENTS] {
            let mut ring =
                RingBuf::try_from(self.ebpf.map_mut(name).expect("ring")).expect("ring type");
            while ring.next().is_some() {}
        }
        self.fill_full_path();
        self.services.clear();
        self.vip_table = None;
        self.pool = Pool::new(MAGLEV_BLOCKS);
        self.pairs.clear();
        self.peers = None;
        self
    }

    /// Per map that [`Lb::recycled`] resets, how many array entries are not zero or
    /// how many keys a hash map holds (all 0 after a fresh load).
    pub fn dirty_maps(&self) -> Vec<(String, u64)> {
        crate::bpf::maps::dirty_entries(&self.ebpf)
            .unwrap_or_else(|e| panic!("reading the loaded object's maps: {e}"))
    }

    fn wrap(ebpf: Ebpf, sizes: MapSizes, pooled: bool) -> Self {
        Lb {
            ebpf: ManuallyDrop::new(ebpf),
            pooled,
            services: BTreeMap::new(),
            vip_table: None,
            pool: Pool::new(MAGLEV_BLOCKS),
            pairs: BTreeMap::new(),
            sizes,
            peers: None,
        }
    }

    /// [`Lb::load`] with the maps sized and the tables laid out by `sizes` (as the
    /// agent's loader does: `MapSizes::apply`).
    pub fn load_sized(sizes: MapSizes) -> Self {
        let mut loader = EbpfLoader::new();
        sizes.apply(&mut loader);
        let mut ebpf = loader
            .load(lb_agent::EBPF_OBJECT)
            .unwrap_or_else(|e| panic!("loading the eBPF object failed: {e:#?}"));
        for name in [
            lb_common::PROGRAM_NAME,
            lb_common::PASS_PROGRAM_NAME,
            lb_common::DECAP_PROGRAM_NAME,
        ] {
            let prog: &mut Xdp = ebpf
                .program_mut(name)
                .unwrap_or_else(|| panic!("program {name} missing from the object"))
                .try_into()
                .unwrap_or_else(|e| panic!("program {name} is not XDP: {e}"));
            if let Err(e) = prog.load() {
                panic!("loading {name} failed (verifier): {}", verifier_log(&e));
            }
        }
        // `lb_xdp_full`, and `LB_PROGRAMS` filled with it, as the agent's loader does.
        if let Err(e) = lb_agent::dataplane::attach::full_path::load(&mut ebpf) {
            match e {
                lb_agent::dataplane::DataplaneError::Program { source, .. } => {
                    panic!(
                        "loading lb_xdp_full failed (verifier): {}",
                        verifier_log(&source)
                    )
                }
                e => panic!("filling LB_PROGRAMS failed: {e}"),
            }
        }
        Self::wrap(ebpf, sizes, false)
    }

    /// [`Lb::load`]'s sizes in cluster mode (a fresh load: the verifier runs).
    pub fn load_cluster() -> Self {
        Self::load_sized(pooled_sizes().with_cluster())
    }

    /// How many instructions the verifier processed to load program `name`.
    pub fn verified_instructions(&self, name: &str) -> u32 {
        let prog: &Xdp = self
            .ebpf
            .program(name)
            .unwrap_or_else(|| panic!("program {name}"))
            .try_into()
            .expect("XDP");
        prog.info()
            .expect("program info")
            .verified_instruction_count()
            .unwrap_or_else(|| panic!("{name}: the kernel reports no verified count"))
    }

    /// Installs another node's connection into `LB_PEER_FLOWS` and `LB_PEER_NAT` with the
    /// agent's own writer (`PeerWriter::install`).
    pub fn install_peer(&mut self, c: &PeerConnection) {
        self.peer_writer()
            .install(std::slice::from_ref(c))
            .expect("writing the peer tables");
    }

    /// Removes another node's connection from `LB_PEER_FLOWS` and `LB_PEER_NAT`, as the
    /// agent does when its replica expires.
    pub fn remove_peer(&mut self, c: &PeerConnection) {
        self.peer_writer().remove(&[(c.client, c.reply)]);
    }

    /// The agent's writer of the peer tables, mapped on first use.
    fn peer_writer(&mut self) -> &mut PeerWriter {
        if self.peers.is_none() {
            let open = |name: &str| {
                let Some(aya::maps::Map::Array(data)) = self.ebpf.map(name) else {
                    panic!("{name}: an array");
                };
                let fd = data.fd().as_fd().try_clone_to_owned().expect("dup");
                aya::maps::MapData::from_fd(fd).unwrap_or_else(|e| panic!("{name}: {e}"))
            };
            let (flows, nat) = (open(map_names::PEER_FLOWS), open(map_names::PEER_NAT));
            let writer = PeerWriter::new(flows, nat, &self.sizes.tables())
                .unwrap_or_else(|e| panic!("mapping the peer tables: {e}"));
            self.peers = Some(writer);
        }
        self.peers.as_mut().expect("just made")
    }

    /// Writes `LB_CLUSTER` (the members, their MACs, the shared SNAT addresses), as the
    /// agent's `PeerTables::set_members` does.
    pub fn set_cluster_members(&mut self, members: &lb_common::maps::ClusterMembers) {
        let mut map: Array<_, lb_common::maps::ClusterMembers> =
            Array::try_from(self.ebpf.map_mut(map_names::CLUSTER).expect("LB_CLUSTER"))
                .expect("LB_CLUSTER type");
        map.set(0, members, 0).expect("writing LB_CLUSTER");
    }

    /// Every connection event currently in `LB_CONN_EVENTS` (consumed).
    pub fn drain_conn_events(&mut self) -> Vec<ConnEvent> {
        self.drain_ring(map_names::CONN_EVENTS)
    }

    /// The tables' layout (bucket counts, seeds) the program was loaded with.
    pub fn layout(&self) -> TableLayout {
        self.sizes.tables()
    }

    /// The sizes the maps were loaded with.
    pub fn sizes(&self) -> MapSizes {
        self.sizes
    }

    /// Map `name` as the kernel created it: (max_entries, bytes it charges, from
    /// `memlock:` in the descriptor's `/proc/self/fdinfo`).
    pub fn map_footprint(&self, name: &str) -> (u32, u64) {
        map_footprint(&self.ebpf, name)
    }

    /// Runs program `name` once on `packet`.
    pub fn run_prog(&mut self, name: &str, packet: &[u8]) -> Run {
        self.run_shared(name, packet)
    }

    /// Runs program `name` once on `packet` from a shared reference: several threads
    /// (on several CPUs) may run the same loaded program at once.
    pub fn run_shared(&self, name: &str, packet: &[u8]) -> Run {
        let prog: &Xdp = self
            .ebpf
            .program(name)
            .unwrap_or_else(|| panic!("program {name} missing"))
            .try_into()
            .expect("an XDP program");
        let mut out = vec![0u8; packet.len() + 256];
        let result = prog
            .test_run(TestRunOptions {
                data_in: Some(packet),
                data_out: Some(&mut out),
                ..TestRunOptions::default()
            })
            .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN of {name} failed: {e}"));
        out.truncate(result.data_size_out as usize);
        Run {
            action: result.return_value,
            out,
        }
    }

    /// Runs the balancer once on `packet`.
    pub fn run(&mut self, packet: &[u8]) -> Run {
        self.run_prog(lb_common::PROGRAM_NAME, packet)
    }

    /// Runs the balancer once; the kernel's error if it refuses the input.
    pub fn try_run(&mut self, packet: &[u8]) -> Result<Run, ProgramError> {
        let prog: &Xdp = self
            .ebpf
            .program(lb_common::PROGRAM_NAME)
            .expect("lb_xdp")
            .try_into()
            .expect("an XDP program");
        let mut out = vec![0u8; packet.len() + 256];
        let result = prog.test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        })?;
        out.truncate(result.data_size_out as usize);
        Ok(Run {
            action: result.return_value,
            out,
        })
    }

    /// Empties `LB_PROGRAMS`: `lb_xdp`'s tail call into `lb_xdp_full` then fails (what
    /// the program must survive, counted `drop_no_full_path`).
    pub fn clear_full_path(&mut self) {
        self.clear_program(lb_common::FULL_PATH_INDEX);
    }

    /// Takes `lb_xdp_peer` out of `LB_PROGRAMS`: a packet handed over to it is dropped
    /// (`DROP_NO_FULL_PATH`), which shows that it was.
    pub fn clear_peer_path(&mut self) {
        self.clear_program(lb_common::PEER_PATH_INDEX);
    }

    fn clear_program(&mut self, index: u32) {
        let map = self.ebpf.map_mut(map_names::PROGRAMS).expect("LB_PROGRAMS");
        let mut array = aya::maps::ProgramArray::try_from(map).expect("LB_PROGRAMS type");
        array
            .clear_index(&index)
            .expect("emptying an entry of LB_PROGRAMS");
    }

    /// Puts `lb_xdp_full` back into `LB_PROGRAMS` (as loading did).
    pub fn fill_full_path(&mut self) {
        lb_agent::dataplane::attach::full_path::fill(&mut self.ebpf).expect("filling LB_PROGRAMS");
    }

    /// Sets the interface MAC the program checks destination MACs against (`LB_CONFIG`).
    pub fn set_interface_mac(&mut self, mac: [u8; 6]) {
        let mut map: Array<_, DataplaneConfig> =
            Array::try_from(self.ebpf.map_mut(map_names::CONFIG).expect("LB_CONFIG"))
                .expect("LB_CONFIG type");
        let value = DataplaneConfig {
            mac,
            ..DataplaneConfig::default()
        };
        map.set(0, &value, 0).expect("writing LB_CONFIG");
    }

    /// Writes the whole `LB_CONFIG` value (interface MAC, MTU, tunnel sources).
    pub fn set_config(&mut self, value: DataplaneConfig) {
        let mut map: Array<_, DataplaneConfig> =
            Array::try_from(self.ebpf.map_mut(map_names::CONFIG).expect("LB_CONFIG"))
                .expect("LB_CONFIG type");
        map.set(0, &value, 0).expect("writing LB_CONFIG");
    }

    /// `lb_decap`: adds `addr` to the host's addresses (`LB_DECAP_ADDRS`) as
    /// `lb-agent decap attach` does.
    pub fn add_decap_addr(&mut self, addr: IpAddr) {
        let mut map: aya::maps::HashMap<_, lb_common::maps::DecapAddr, u32> =
            aya::maps::HashMap::try_from(
                self.ebpf
                    .map_mut(map_names::DECAP_ADDRS)
                    .expect("LB_DECAP_ADDRS"),
            )
            .expect("LB_DECAP_ADDRS type");
        let key = lb_agent::dataplane::attach::decap::decap_key(addr);
        map.insert(&key, &1, 0).expect("writing LB_DECAP_ADDRS");
    }

    /// `lb_decap`'s counters summed over CPUs (`lb_common::DECAP_*`).
    pub fn decap_counters(&self) -> [u64; lb_common::DECAP_COUNTERS as usize] {
        let map: PerCpuArray<_, u64> = PerCpuArray::try_from(
            self.ebpf
                .map(map_names::DECAP_COUNTERS)
                .expect("LB_DECAP_COUNTERS"),
        )
        .expect("LB_DECAP_COUNTERS type");
        let mut out = [0u64; lb_common::DECAP_COUNTERS as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = map.get(&(i as u32), 0).expect("counter").iter().sum();
        }
        out
    }

    /// Adds a service: lays out the VIP index as the agent does (`vip_index::build`) and
    /// writes table 0 (live: `LB_VIP_GEN` stays 0) slot by slot where it changed. Its
    /// slot names the pair of Maglev tables `set_maglev` gave its id, if any (else size
    /// 0: no backend).
    pub fn add_service(&mut self, vip: IpAddr, port: u16, proto: u8, meta: ServiceMeta) {
        let key = VipKey {
            addr: addr_words(vip),
            port: port.to_be(),
            proto,
            family: family(vip),
        };
        let (maglev_base, maglev_size) =
            self.pairs.get(&meta.service_id).copied().unwrap_or((0, 0));
        let meta = ServiceMeta {
            maglev_base,
            maglev_size,
            ..meta
        };
        self.services.insert(key, meta);
        self.write_vip_index();
    }

    /// Removes the service at `vip:port/proto` from the VIP index (as `add_service`
    /// writes it); its VIP slot as it was, if there was one.
    pub fn remove_service(&mut self, vip: IpAddr, port: u16, proto: u8) -> Option<ServiceMeta> {
        let key = VipKey {
            addr: addr_words(vip),
            port: port.to_be(),
            proto,
            family: family(vip),
        };
        let meta = self.services.remove(&key);
        self.write_vip_index();
        meta
    }

    /// The VIP slot of the service at `vip:port/proto`, as last written.
    pub fn service_meta(&self, vip: IpAddr, port: u16, proto: u8) -> Option<ServiceMeta> {
        let key = VipKey {
            addr: addr_words(vip),
            port: port.to_be(),
            proto,
            family: family(vip),
        };
        self.services.get(&key).copied()
    }

    /// Writes the VIP index for `self.services` (see `add_service`).
    fn write_vip_index(&mut self) {
        let prefer = self.vip_table.as_ref().map_or(0, |t| t.header.seed);
        let table = vip_index::build(&self.services, prefer).expect("a VIP index seed fits");
        let mut slots: Array<_, VipSlot> = Array::try_from(
            self.ebpf
                .map_mut(map_names::VIP_INDEX)
                .expect("LB_VIP_INDEX"),
        )
        .expect("LB_VIP_INDEX type");
        for (i, slot) in table.slots.iter().enumerate() {
            let before = self
                .vip_table
                .as_ref()
                .map_or(VipSlot::default(), |t| t.slots[i]);
            if *slot != before {
                slots
                    .set(i as u32, slot, 0)
                    .expect("writing a VIP index slot");
            }
        }
        let mut headers: Array<_, VipIndexHeader> =
            Array::try_from(self.ebpf.map_mut(map_names::VIP_HDR).expect("LB_VIP_HDR"))
                .expect("LB_VIP_HDR type");
        headers
            .set(0, &table.header, 0)
            .expect("writing the VIP index header");
        self.vip_table = Some(table);
    }

    pub fn set_backend(&mut self, id: u32, backend: Backend) {
        let mut map: Array<_, Backend> =
            Array::try_from(self.ebpf.map_mut(map_names::BACKENDS).expect("LB_BACKENDS"))
                .expect("LB_BACKENDS type");
        map.set(id, &backend, 0).expect("writing a backend");
    }

    pub fn backend(&self, id: u32) -> Backend {
        let map: Array<_, Backend> =
            Array::try_from(self.ebpf.map(map_names::BACKENDS).expect("LB_BACKENDS"))
                .expect("LB_BACKENDS type");
        map.get(&id, 0).expect("reading a backend")
    }

    /// Publishes a Maglev table for `service_id` the way the agent does: a table of the
    /// size the service's pair has goes into the half that is not live, then
    /// `LB_MAGLEV_GEN` flips (here through syscalls; the agent uses `mmap`); a table of
    /// another size (or the first) gets a new pair from the pool, written whole, and the
    /// service's VIP slot is switched to it (the old pair is freed at once: a fixture
    /// runs no packet concurrently).
    pub fn set_maglev(&mut self, service_id: u32, table: &[u32]) {
        let size = table.len() as u32;
        assert!(is_maglev_size(size), "table size {size}");
        match self.pairs.get(&service_id).copied() {
            Some((base, s)) if s == size => self.flip_in(service_id, base, table),
            old => {
                let base = self
                    .pool
                    .alloc(pair_blocks(size))
                    .expect("room in the Maglev pool");
                self.write_table(base, size, 0, table);
                self.write_table(base, size, 1, table);
                self.pairs.insert(service_id, (base, size));
                for meta in self.services.values_mut() {
                    if meta.service_id == service_id {
                        (meta.maglev_base, meta.maglev_size) = (base, size);
                    }
                }
                self.write_vip_index();
                if let Some((old_base, old_size)) = old {
                    self.pool.free(old_base, pair_blocks(old_size));
                }
            }
        }
    }

    /// Where a service id's pair of Maglev tables is: (base block, size).
    pub fn maglev_pair(&self, service_id: u32) -> Option<(u32, u32)> {
        self.pairs.get(&service_id).copied()
    }

    /// Writes `table` into half `generation` of the pair at `base`.
    fn write_table(&mut self, base: u32, size: u32, generation: u64, table: &[u32]) {
        let mut tables: Array<_, MaglevBlock> =
            Array::try_from(self.ebpf.map_mut(map_names::MAGLEV).expect("LB_MAGLEV"))
                .expect("LB_MAGLEV type");
        for (i, chunk) in table.chunks(MAGLEV_BLOCK_SLOTS as usize).enumerate() {
            let mut block: MaglevBlock = [0; MAGLEV_BLOCK_SLOTS as usize];
            block[..chunk.len()].copy_from_slice(chunk);
            let slot = i as u32 * MAGLEV_BLOCK_SLOTS;
            tables
                .set(maglev_block_index(base, size, generation, slot), &block, 0)
                .expect("filling a Maglev table");
        }
    }

    /// Writes the half of the pair at `base` that is not live, then flips to it.
    fn flip_in(&mut self, service_id: u32, base: u32, table: &[u32]) {
        let next = {
            let gens: Array<_, u64> =
                Array::try_from(self.ebpf.map(map_names::MAGLEV_GEN).expect("LB_MAGLEV_GEN"))
                    .expect("LB_MAGLEV_GEN type");
            (gens.get(&service_id, 0).expect("reading a generation") ^ 1) & 1
        };
        self.write_table(base, table.len() as u32, next, table);
        let mut gens: Array<_, u64> = Array::try_from(
            self.ebpf
                .map_mut(map_names::MAGLEV_GEN)
                .expect("LB_MAGLEV_GEN"),
        )
        .expect("LB_MAGLEV_GEN type");
        gens.set(service_id, &next, 0)
            .expect("flipping the generation");
    }

    /// Publishes a table whose every slot is `backend_id`.
    pub fn set_maglev_all(&mut self, service_id: u32, backend_id: u32) {
        self.set_maglev(service_id, &vec![backend_id; MAGLEV_RING_SIZE as usize]);
    }

    /// Global counters summed over CPUs, indexed by `lb_common::counters::*`.
    pub fn counters(&self) -> [u64; counters::COUNT as usize] {
        let map: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map(map_names::COUNTERS).expect("LB_COUNTERS"))
                .expect("LB_COUNTERS type");
        let mut out = [0u64; counters::RAW_COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = map.get(&(i as u32), 0).expect("counter").iter().sum();
        }
        counters::derive(&out)
    }

    pub fn service_stats(&self, id: u32) -> ServiceStats {
        let map: PerCpuArray<_, ServiceStats> = PerCpuArray::try_from(
            self.ebpf
                .map(map_names::SERVICE_STATS)
                .expect("LB_SERVICE_STATS"),
        )
        .expect("LB_SERVICE_STATS type");
        map.get(&id, 0)
            .expect("service stats")
            .iter()
            .copied()
            .sum()
    }

    pub fn backend_stats(&self, id: u32) -> BackendStats {
        let map: PerCpuArray<_, BackendStats> = PerCpuArray::try_from(
            self.ebpf
                .map(map_names::BACKEND_STATS)
                .expect("LB_BACKEND_STATS"),
        )
        .expect("LB_BACKEND_STATS type");
        map.get(&id, 0)
            .expect("backend stats")
            .iter()
            .copied()
            .sum()
    }

    /// Backend stats of ids `0..limit` read the agent's way: one batch call.
    pub fn backend_stats_batched(&self, limit: u32) -> Vec<BackendStats> {
        let data = match self
            .ebpf
            .map(map_names::BACKEND_STATS)
            .expect("LB_BACKEND_STATS")
        {
            aya::maps::Map::PerCpuArray(data) => data,
            other => panic!("LB_BACKEND_STATS is {other:?}"),
        };
        lb_agent::dataplane::PerCpuBatchReader::new(data)
            .expect("batch reader")
            .read_summed::<BackendStats>(limit)
            .expect("batch read")
    }

    /// `key`'s pinned flow, found as the program finds it.
    pub fn flow(&self, key: &FlowKey) -> Option<FlowValue> {
        let (_, bucket) = self.flow_bucket_of(key);
        find_way(&bucket, key).map(|w| bucket.ways[w].value)
    }

    /// Live entries in `LB_FLOWS` (every bucket read: a fraction of a second).
    pub fn flow_count(&self) -> usize {
        self.flow_buckets()
            .iter()
            .map(|b| b.ways.iter().filter(|s| s.word & SLOT_LIVE != 0).count())
            .sum()
    }

    /// Every bucket of `LB_FLOWS`, read in a few syscalls.
    fn flow_buckets(&self) -> Vec<FlowBucket> {
        self.buckets(map_names::FLOWS)
    }

    /// Every bucket of the set-associative table `name` (`LB_FLOWS`, `LB_NAT` or a peer
    /// table), read in a few syscalls.
    pub fn buckets<V>(&self, name: &str) -> Vec<Bucket<V>>
    where
        Bucket<V>: aya::Pod,
    {
        let map = self.ebpf.map(name).unwrap_or_else(|| panic!("{name}"));
        let aya::maps::Map::Array(data) = map else {
            panic!("{name} is an array")
        };
        crate::bpf::maps::read_array(name, data).unwrap_or_else(|e| panic!("reading {name}: {e}"))
    }

    /// Every bucket of `LB_NAT`, read in a few syscalls.
    fn nat_buckets(&self) -> Vec<NatBucket> {
        self.buckets(map_names::NAT)
    }

    /// Every live flow of `LB_FLOWS`, bucket by bucket.
    pub fn for_each_flow(&self, mut f: impl FnMut(&FlowKey, &FlowValue)) {
        for b in self.flow_buckets() {
            for s in b.ways.iter().filter(|s| s.word & SLOT_LIVE != 0) {
                f(&s.key, &s.value);
            }
        }
    }

    /// Copies the live flows of `from`'s `LB_FLOWS` into this object's, as a restarted
    /// agent copies a previous program's table of another size
    /// (`lb_agent::dataplane::adopt::flow_tables::copy_flows`).
    pub fn copy_flows_from(
        &mut self,
        from: &Lb,
    ) -> lb_agent::dataplane::adopt::flow_tables::Copied {
        let id = match from.ebpf.map(map_names::FLOWS).expect("LB_FLOWS") {
            aya::maps::Map::Array(d) => d.info().expect("map info").id(),
            _ => panic!("LB_FLOWS is an array"),
        };
        let old = aya::maps::MapData::from_id(id).expect("opening LB_FLOWS by id");
        let layout = self.layout();
        let new = self.ebpf.map_mut(map_names::FLOWS).expect("LB_FLOWS");
        lb_agent::dataplane::adopt::flow_tables::copy_flows(old, new, &layout).expect("copying")
    }

    /// Writes bucket `index` of `LB_FLOWS` whole (its ways as given: the caller sets
    /// their words, e.g. with `live_word` and the layout's hash).
    pub fn set_flow_bucket(&mut self, index: u32, bucket: &FlowBucket) {
        self.flow_map_mut()
            .set(index, bucket, 0)
            .expect("writing LB_FLOWS");
    }

    fn flow_map(&self) -> Array<&aya::maps::MapData, FlowBucket> {
        Array::try_from(self.ebpf.map(map_names::FLOWS).expect("LB_FLOWS")).expect("LB_FLOWS type")
    }

    fn flow_map_mut(&mut self) -> Array<&mut aya::maps::MapData, FlowBucket> {
        Array::try_from(self.ebpf.map_mut(map_names::FLOWS).expect("LB_FLOWS"))
            .expect("LB_FLOWS type")
    }

    /// `key`'s `LB_FLOWS` bucket, with its index.
    pub fn flow_bucket_of(&self, key: &FlowKey) -> (u32, FlowBucket) {
        let index = self.layout().flow_bucket(key);
        (
            index,
            self.flow_map().get(&index, 0).expect("reading LB_FLOWS"),
        )
    }

    /// Writes way `way` of `LB_FLOWS` bucket `index` as the program publishes a slot
    /// (live, next generation; way 0's lock bit is left as it was).
    pub fn write_flow_way(&mut self, index: u32, way: usize, key: FlowKey, value: FlowValue) {
        let hash = self.layout().flow_hash(&key);
        let mut map = self.flow_map_mut();
        let mut bucket = map.get(&index, 0).expect("reading LB_FLOWS");
        let word = live_word(bucket.ways[way].word, hash);
        bucket.ways[way] = FlowSlot { word, key, value };
        map.set(index, &bucket, 0).expect("writing LB_FLOWS");
    }

    /// Live entries in `LB_NAT` (every bucket read: a fraction of a second).
    pub fn nat_count(&self) -> usize {
        self.nat_buckets()
            .iter()
            .map(|b| b.ways.iter().filter(|s| s.word & SLOT_LIVE != 0).count())
            .sum()
    }

    fn nat_map(&self) -> Array<&aya::maps::MapData, NatBucket> {
        Array::try_from(self.ebpf.map(map_names::NAT).expect("LB_NAT")).expect("LB_NAT type")
    }

    fn nat_map_mut(&mut self) -> Array<&mut aya::maps::MapData, NatBucket> {
        Array::try_from(self.ebpf.map_mut(map_names::NAT).expect("LB_NAT")).expect("LB_NAT type")
    }

    /// `key`'s `LB_NAT` bucket, with its index.
    pub fn nat_bucket_of(&self, key: &FlowKey) -> (u32, NatBucket) {
        let index = self.layout().nat_bucket(key);
        (
            index,
            self.nat_map().get(&index, 0).expect("reading LB_NAT"),
        )
    }

    /// Writes way `way` of `LB_NAT` bucket `index` as the program publishes a slot
    /// (live, next generation; way 0's lock bit is left as it was).
    pub fn write_nat_way(&mut self, index: u32, way: usize, key: FlowKey, value: NatValue) {
        let hash = self.layout().nat_hash(&key);
        let mut map = self.nat_map_mut();
        let mut bucket = map.get(&index, 0).expect("reading LB_NAT");
        let word = live_word(bucket.ways[way].word, hash);
        bucket.ways[way] = NatSlot { word, key, value };
        map.set(index, &bucket, 0).expect("writing LB_NAT");
    }

    /// Sets or clears the writer lock of `LB_NAT` bucket `index` (as another CPU's
    /// writer holding it would).
    pub fn set_nat_lock(&mut self, index: u32, held: bool) {
        let mut map = self.nat_map_mut();
        let mut bucket = map.get(&index, 0).expect("reading LB_NAT");
        let w = &mut bucket.ways[0].word;
        *w = if held {
            *w | SLOT_LOCK
        } else {
            *w & !SLOT_LOCK
        };
        map.set(index, &bucket, 0).expect("writing LB_NAT");
    }

    /// `key`'s reverse entry, found as the program finds it.
    pub fn nat_entry(&self, key: &FlowKey) -> Option<NatValue> {
        let (_, bucket) = self.nat_bucket_of(key);
        find_way(&bucket, key).map(|w| bucket.ways[w].value)
    }

    /// Writes `key`'s reverse entry: over its own slot, else into the bucket's first
    /// free way (panics when the bucket is full).
    pub fn insert_nat(&mut self, key: FlowKey, value: NatValue) {
        let (index, bucket) = self.nat_bucket_of(&key);
        let way = find_way(&bucket, &key)
            .or_else(|| bucket.ways.iter().position(|s| s.word & SLOT_LIVE == 0))
            .expect("a free way in the LB_NAT bucket");
        self.write_nat_way(index, way, key, value);
    }

    /// Removes `key`'s reverse entry (panics when absent).
    pub fn remove_nat(&mut self, key: &FlowKey) {
        let (index, mut bucket) = self.nat_bucket_of(key);
        let way = find_way(&bucket, key).expect("the entry in LB_NAT");
        let w = &mut bucket.ways[way].word;
        *w = free_word(*w);
        self.nat_map_mut()
            .set(index, &bucket, 0)
            .expect("writing LB_NAT");
    }

    /// Writes a flow entry (fixtures age one by moving `last_seen_ns` back): over its
    /// own way, else into the bucket's first free way (panics when the bucket is full).
    pub fn set_flow(&mut self, key: &FlowKey, value: FlowValue) {
        let (index, bucket) = self.flow_bucket_of(key);
        let way = find_way(&bucket, key)
            .or_else(|| bucket.ways.iter().position(|s| s.word & SLOT_LIVE == 0))
            .expect("a free way in the LB_FLOWS bucket");
        self.write_flow_way(index, way, *key, value);
        // As for any writer of LB_FLOWS outside the program: the CPUs' cached copies of
        // the flow must go (their slot is emptied on every CPU).
        self.clear_cache_slot(key);
    }

    /// Removes a flow entry behind the flow caches' back (an eviction; panics when
    /// absent).
    pub fn remove_flow(&mut self, key: &FlowKey) {
        let (index, mut bucket) = self.flow_bucket_of(key);
        let way = find_way(&bucket, key).expect("the flow in LB_FLOWS");
        let w = &mut bucket.ways[way].word;
        *w = free_word(*w);
        self.flow_map_mut()
            .set(index, &bucket, 0)
            .expect("writing LB_FLOWS");
    }

    /// Empties `key`'s slot of `LB_FLOW_CACHE` on every CPU.
    pub fn clear_cache_slot(&mut self, key: &FlowKey) {
        let mut map: PerCpuArray<_, FlowCacheEntry> = PerCpuArray::try_from(
            self.ebpf
                .map_mut(map_names::FLOW_CACHE)
                .expect("LB_FLOW_CACHE"),
        )
        .expect("LB_FLOW_CACHE type");
        let cpus = aya::util::nr_cpus().expect("number of CPUs");
        let empty = PerCpuValues::try_from(vec![FlowCacheEntry::default(); cpus.get() as usize])
            .expect("per-CPU values");
        map.set(flow_cache_slot(key), empty, 0)
            .expect("writing LB_FLOW_CACHE");
    }

    /// Writes `entry` into CPU `cpu`'s `LB_FLOW_CACHE` slot for `entry.key` (the other
    /// CPUs' copies stay).
    pub fn set_cached_flow(&mut self, cpu: usize, entry: FlowCacheEntry) {
        let mut map: PerCpuArray<_, FlowCacheEntry> = PerCpuArray::try_from(
            self.ebpf
                .map_mut(map_names::FLOW_CACHE)
                .expect("LB_FLOW_CACHE"),
        )
        .expect("LB_FLOW_CACHE type");
        let slot = flow_cache_slot(&entry.key);
        let mut values: Vec<FlowCacheEntry> = map
            .get(&slot, 0)
            .expect("reading LB_FLOW_CACHE")
            .iter()
            .copied()
            .collect();
        values[cpu] = entry;
        let values = PerCpuValues::try_from(values).expect("per-CPU values");
        map.set(slot, values, 0).expect("writing LB_FLOW_CACHE");
    }

    /// CPU `cpu`'s cache slot for `key`, if it holds that flow (valid or not).
    pub fn cached_flow(&self, cpu: usize, key: &FlowKey) -> Option<FlowCacheEntry> {
        let map: PerCpuArray<_, FlowCacheEntry> =
            PerCpuArray::try_from(self.ebpf.map(map_names::FLOW_CACHE).expect("LB_FLOW_CACHE"))
                .expect("LB_FLOW_CACHE type");
        let values = map
            .get(&flow_cache_slot(key), 0)
            .expect("reading LB_FLOW_CACHE");
        let e = values[cpu];
        (e.key == *key && e.backend_id != 0).then_some(e)
    }

    /// The flow clock's tick (`jiffies`) CPU `cpu` last read.
    pub fn clock_jiffies(&self, cpu: usize) -> u64 {
        let map: PerCpuArray<_, TickClock> =
            PerCpuArray::try_from(self.ebpf.map(map_names::CLOCK).expect("LB_CLOCK"))
                .expect("LB_CLOCK type");
        map.get(&0, 0).expect("reading LB_CLOCK")[cpu].jiffies
    }

    /// Every event currently in the ring buffer (consumed).
    pub fn drain_events(&mut self) -> Vec<PassiveEvent> {
        self.drain_ring(map_names::EVENTS)
    }

    /// Every record of type `T` currently in ring buffer `name` (consumed).
    fn drain_ring<T: aya::Pod>(&mut self, name: &str) -> Vec<T> {
        let mut ring = RingBuf::try_from(self.ebpf.map_mut(name).expect("ring buffer"))
            .expect("ring buffer type");
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            assert_eq!(item.len(), size_of::<T>(), "{name}: record size");
            // SAFETY: the record has T's size and every bit pattern is a T (`aya::Pod`).
            out.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<T>()) });
        }
        out
    }
}

impl Drop for Lb {
    fn drop(&mut self) {
        // SAFETY: this is `drop`: `self.ebpf` is taken once, here, and not touched after.
        let ebpf = unsafe { ManuallyDrop::take(&mut self.ebpf) };
        if self.pooled {
            POOL.lock().unwrap_or_else(|e| e.into_inner()).push(ebpf);
        }
    }
}

fn verifier_log(e: &ProgramError) -> String {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            format!("{io_error}\n{verifier_log}")
        }
        other => format!("{other:#?}"),
    }
}

/// Map `name` of `ebpf`: its entries and the bytes the kernel charges for it (`memlock`
/// in its fdinfo).
pub fn map_footprint(ebpf: &aya::Ebpf, name: &str) -> (u32, u64) {
    use std::os::fd::{AsFd, AsRawFd};
    let map = ebpf.map(name).unwrap_or_else(|| panic!("map {name}"));
    let data = match map {
        aya::maps::Map::Array(d)
        | aya::maps::Map::HashMap(d)
        | aya::maps::Map::LruHashMap(d)
        | aya::maps::Map::PerCpuArray(d) => d,
        _ => panic!("{name}: not an array or hash"),
    };
    let entries = data.info().expect("map info").max_entries();
    let fd = data.fd().as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
        .expect("reading the map's fdinfo");
    let memlock = info
        .lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name}: no memlock in fdinfo: {info}"));
    (entries, memlock)
}
