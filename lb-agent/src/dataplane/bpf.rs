//! [`BpfDataplane`]: loads the embedded XDP object, attaches it, and owns its maps.

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, PerCpuArray, RingBuf},
    programs::Xdp,
};
use lb_common::{
    MAGLEV_RING_SIZE, PROGRAM_NAME, counters, map_names,
    maps::{Backend, BackendStats, DataplaneConfig, ServiceMeta, ServiceStats, VipKey},
};

use super::{
    AttachMode, Dataplane, DataplaneError, EventStream, attach,
    batch::PerCpuBatchReader,
    maglev_table,
    pin::{self, PinDir},
};

/// The loaded and attached XDP program with every map handle.
pub struct BpfDataplane {
    /// Keeps the program and its XDP link alive; dropping it detaches.
    ebpf: Ebpf,
    /// Interface and mode once attached.
    attached: Option<(String, AttachMode)>,
    services: HashMap<MapData, VipKey, ServiceMeta>,
    maglev: maglev_table::MaglevTables,
    backends: Array<MapData, Backend>,
    counters: PerCpuArray<MapData, u64>,
    service_stats: PerCpuArray<MapData, ServiceStats>,
    backend_stats: PerCpuArray<MapData, BackendStats>,
    /// The same map, read for all backends at once (`backend_stats_below`).
    backend_stats_batch: PerCpuBatchReader,
    events: Option<RingBuf<MapData>>,
    /// Where maps and link are pinned (hitless restarts), if anywhere.
    pins: Option<PinDir>,
}

/// Every map of the object (all are pinned when pinning is on).
const ALL_MAPS: [&str; 10] = [
    map_names::SERVICES,
    map_names::MAGLEV,
    map_names::MAGLEV_GEN,
    map_names::BACKENDS,
    map_names::FLOWS,
    map_names::NAT,
    map_names::COUNTERS,
    map_names::SERVICE_STATS,
    map_names::BACKEND_STATS,
    map_names::EVENTS,
];

/// The maps' published content, as read back.
#[derive(Clone, Debug, Default)]
pub struct PublishedState {
    pub services: Vec<(VipKey, ServiceMeta)>,
    pub backends: Vec<(u32, Backend)>,
}

impl BpfDataplane {
    /// Loads the embedded object and attaches `lb_xdp` to `interface`.
    pub fn load_and_attach(interface: &str, mode: AttachMode) -> Result<Self, DataplaneError> {
        let mut dp = Self::load()?;
        dp.attach(interface, mode)?;
        Ok(dp)
    }

    /// Loads the embedded object into the kernel without attaching it (benchmarks and
    /// BPF_PROG_TEST_RUN fixtures drive it through [`BpfDataplane::program_mut`]).
    pub fn load() -> Result<Self, DataplaneError> {
        Self::load_with(None)
    }

    /// Loads the embedded object; with `pins`, every map is opened from (or created and
    /// pinned in) that directory, so a restart finds the published state again.
    pub fn load_with(pins: Option<PinDir>) -> Result<Self, DataplaneError> {
        let mut loader = EbpfLoader::new();
        let paths: Vec<(&'static str, std::path::PathBuf)> = pins
            .iter()
            .flat_map(|p| ALL_MAPS.iter().map(|&name| (name, p.map(name))))
            .collect();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader
            .load(crate::EBPF_OBJECT)
            .map_err(DataplaneError::Load)?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(DataplaneError::MissingProgram { name: PROGRAM_NAME })?
            .try_into()
            .map_err(|source| DataplaneError::Program {
                name: PROGRAM_NAME,
                source,
            })?;
        prog.load().map_err(|source| DataplaneError::Program {
            name: PROGRAM_NAME,
            source,
        })?;
        let (backend_stats, backend_stats_batch) = take_backend_stats(&mut ebpf)?;
        Ok(Self {
            services: take(&mut ebpf, map_names::SERVICES)?,
            maglev: maglev_table::MaglevTables::new(
                take_array(&mut ebpf, map_names::MAGLEV)?,
                take_array(&mut ebpf, map_names::MAGLEV_GEN)?,
            )?,
            backends: take(&mut ebpf, map_names::BACKENDS)?,
            counters: take(&mut ebpf, map_names::COUNTERS)?,
            service_stats: take(&mut ebpf, map_names::SERVICE_STATS)?,
            backend_stats,
            backend_stats_batch,
            events: Some(take(&mut ebpf, map_names::EVENTS)?),
            ebpf,
            attached: None,
            pins,
        })
    }

    /// Attaches the loaded program to `interface` (through the pinned link if there is
    /// one, swapping the program atomically).
    pub fn attach(&mut self, interface: &str, mode: AttachMode) -> Result<(), DataplaneError> {
        // Before attaching: the program balances only frames addressed to this MAC.
        let mac = crate::hwaddr::of(interface).map_err(|source| match source.raw_os_error() {
            Some(libc::ENODEV) => DataplaneError::NoSuchInterface {
                interface: interface.to_string(),
            },
            _ => DataplaneError::Io {
                what: "reading the interface's MAC address",
                source,
            },
        })?;
        self.set_interface_mac(mac)?;
        let pins = self.pins.clone();
        let prog = self.program_mut()?;
        let mode = match &pins {
            Some(p) => pin::attach_pinned(prog, interface, mode, p)?,
            None => attach::attach(prog, interface, mode)?.0,
        };
        tracing::info!(interface, mode = mode.name(), "XDP program attached");
        self.attached = Some((interface.to_string(), mode));
        Ok(())
    }

    /// Tells the program the interface's MAC (`LB_CONFIG`; all zero: no check).
    pub fn set_interface_mac(&mut self, mac: [u8; 6]) -> Result<(), DataplaneError> {
        let name = map_names::CONFIG;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(DataplaneError::MissingMap { name })?;
        let mut config: Array<_, DataplaneConfig> = Array::try_from(map).map_err(map_err(name))?;
        let value = DataplaneConfig {
            mac,
            ..DataplaneConfig::default()
        };
        config.set(0, value, 0).map_err(map_err(name))
    }

    /// The pin directory, if the state is pinned.
    pub fn pins(&self) -> Option<&PinDir> {
        self.pins.as_ref()
    }

    /// What is published in the maps now (non-empty after a restart on pinned maps).
    pub fn published_state(&self) -> Result<PublishedState, DataplaneError> {
        let mut services = Vec::new();
        for item in self.services.iter() {
            services.push(item.map_err(map_err(map_names::SERVICES))?);
        }
        let mut backends = Vec::new();
        for id in 1..lb_common::MAX_BACKENDS {
            let b = self
                .backends
                .get(&id, 0)
                .map_err(map_err(map_names::BACKENDS))?;
            if b != Backend::default() {
                backends.push((id, b));
            }
        }
        Ok(PublishedState { services, backends })
    }

    /// The balancer program (for BPF_PROG_TEST_RUN).
    pub fn program_mut(&mut self) -> Result<&mut Xdp, DataplaneError> {
        self.ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(DataplaneError::MissingProgram { name: PROGRAM_NAME })?
            .try_into()
            .map_err(|source| DataplaneError::Program {
                name: PROGRAM_NAME,
                source,
            })
    }

    /// The interface the program is attached to ("" before `attach`).
    pub fn interface(&self) -> &str {
        self.attached.as_ref().map_or("", |(i, _)| i)
    }

    /// The attach mode in use (never `Auto`; `Auto` before `attach`).
    pub fn mode(&self) -> AttachMode {
        self.attached.as_ref().map_or(AttachMode::Auto, |(_, m)| *m)
    }

    /// A copy of a service's live Maglev table.
    pub fn live_table(&self, service_id: u32) -> Vec<u32> {
        self.maglev.live_table(service_id)
    }

    /// Takes the passive-event stream (once).
    pub fn take_events(&mut self) -> Option<Result<EventStream, DataplaneError>> {
        self.events.take().map(EventStream::new)
    }
}

fn take<M>(ebpf: &mut Ebpf, name: &'static str) -> Result<M, DataplaneError>
where
    M: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or(DataplaneError::MissingMap { name })?;
    M::try_from(map).map_err(|source| DataplaneError::Map { name, source })
}

/// The raw data of an array map (the Maglev maps are used through `mmap`).
fn take_array(ebpf: &mut Ebpf, name: &'static str) -> Result<MapData, DataplaneError> {
    match ebpf.take_map(name) {
        Some(Map::Array(data)) => Ok(data),
        Some(_) => Err(DataplaneError::Map {
            name,
            source: aya::maps::MapError::InvalidMapType { map_type: 0 },
        }),
        None => Err(DataplaneError::MissingMap { name }),
    }
}

/// `LB_BACKEND_STATS` as a typed map, and a batch reader of it.
fn take_backend_stats(
    ebpf: &mut Ebpf,
) -> Result<(PerCpuArray<MapData, BackendStats>, PerCpuBatchReader), DataplaneError> {
    let name = map_names::BACKEND_STATS;
    let map = ebpf
        .take_map(name)
        .ok_or(DataplaneError::MissingMap { name })?;
    let Map::PerCpuArray(data) = &map else {
        return Err(DataplaneError::Map {
            name,
            source: aya::maps::MapError::InvalidMapType { map_type: 0 },
        });
    };
    let batch = PerCpuBatchReader::new(data).map_err(|source| DataplaneError::Io {
        what: "duplicating the descriptor of map `LB_BACKEND_STATS`",
        source,
    })?;
    let typed = PerCpuArray::try_from(map).map_err(map_err(name))?;
    Ok((typed, batch))
}

fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> DataplaneError {
    move |source| DataplaneError::Map { name, source }
}

impl Dataplane for BpfDataplane {
    fn upsert_service(&mut self, vip: &VipKey, meta: &ServiceMeta) -> Result<(), DataplaneError> {
        self.services
            .insert(vip, meta, 0)
            .map_err(map_err(map_names::SERVICES))
    }

    fn remove_service(&mut self, vip: &VipKey, service_id: u32) -> Result<(), DataplaneError> {
        match self.services.remove(vip) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(map_err(map_names::SERVICES)(e)),
        }
        // An all-empty table: stray packets for a re-used id find no backend.
        self.publish_table(
            service_id,
            &vec![lb_common::NO_BACKEND; MAGLEV_RING_SIZE as usize],
        )
    }

    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError> {
        self.backends
            .set(id, backend, 0)
            .map_err(map_err(map_names::BACKENDS))
    }

    fn publish_table(&mut self, service_id: u32, table: &[u32]) -> Result<(), DataplaneError> {
        self.maglev.publish(service_id, table)
    }

    fn counters(&self) -> Result<[u64; counters::COUNT as usize], DataplaneError> {
        let mut out = [0u64; counters::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            let per_cpu = self
                .counters
                .get(&(i as u32), 0)
                .map_err(map_err(map_names::COUNTERS))?;
            *slot = per_cpu.iter().sum();
        }
        counters::fill_rx(&mut out);
        Ok(out)
    }

    fn service_stats(&self, service_id: u32) -> Result<ServiceStats, DataplaneError> {
        let per_cpu = self
            .service_stats
            .get(&service_id, 0)
            .map_err(map_err(map_names::SERVICE_STATS))?;
        Ok(per_cpu.iter().copied().sum())
    }

    fn backend_stats(&self, backend_id: u32) -> Result<BackendStats, DataplaneError> {
        let per_cpu = self
            .backend_stats
            .get(&backend_id, 0)
            .map_err(map_err(map_names::BACKEND_STATS))?;
        Ok(per_cpu.iter().copied().sum())
    }

    fn backend_stats_below(&self, limit: u32) -> Result<Vec<BackendStats>, DataplaneError> {
        let mut all = self
            .backend_stats_batch
            .read_summed(limit)
            .map_err(|source| DataplaneError::Io {
                what: "reading map `LB_BACKEND_STATS` in one batch",
                source,
            })?;
        all.resize(limit as usize, BackendStats::default());
        Ok(all)
    }
}
