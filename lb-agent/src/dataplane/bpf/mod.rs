//! [`BpfDataplane`]: loads the embedded XDP object (adopting a previous program's maps)
//! and owns its maps; it implements [`super::Dataplane`] in `maps` and
//! [`super::DataplaneLifecycle`] (attach, watch, events, census) in `lifecycle`.

mod lifecycle;
mod maps;

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, Map, MapData, PerCpuArray, RingBuf},
    programs::Xdp,
};
use lb_common::{
    FULL_PROGRAM_NAME, PROGRAM_NAME, map_names,
    maps::{
        Backend, BackendStats, CONFIG_F_NATIVE, DataplaneConfig, ServiceMeta, ServiceStats, VipKey,
    },
};

use std::net::IpAddr;

use crate::netlink::XdpAttached;

use super::{
    ConnEventStream, DataplaneError,
    adopt::{self, AdoptedMaps, flow_tables, pin::PinDir, schema_map, staging::Staging},
    attach::{full_path, tunnel::TunnelConfig},
    batch::PerCpuBatchReader,
    census::TableReader,
    peers::{PeerTables, PeerWriter},
    sizing::MapSizes,
    tables::{
        maglev_table::{self, Pair},
        vip_index,
    },
};

/// The loaded and attached XDP program with every map handle.
///
/// The agent uses it through [`super::Dataplane`] and [`super::DataplaneLifecycle`]; its
/// own methods load it, take over a previous program's state (`copy_tables`,
/// `published_state`), and give fixtures and benchmarks the programs and the Maglev
/// pool's layout.
pub struct BpfDataplane {
    /// Holds the program and its maps; the netlink attachment does not depend on it.
    ebpf: Ebpf,
    /// Where the program is attached, once it is.
    attached: Option<Attachment>,
    vips: vip_index::VipIndex,
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
    /// The maps' sizes and the tables' layout.
    sizes: MapSizes,
    /// The program attached (or to attach): `lb_xdp`, or `lb_xdp_full` where the
    /// split's tail-call array could not outlive the agent ([`full_path::lasting_dir`]).
    serving: &'static str,
    /// `agent.tunnel_source`: the outer source of tunnel packets for its family (else
    /// the interface's first address of the family, read at attach).
    tunnel_source: Option<IpAddr>,
    /// Counts the flow and nat tables every few seconds, once started.
    census: Option<super::census::CensusSampler>,
    /// `lb_tunnel_gso` is on the interface's tc ingress (generic mode only).
    tunnel_gso: bool,
}

/// Every map of the object that holds state (all are pinned when pinning is on).
const ALL_MAPS: [&str; 15] = adopt::ADOPTED_MAPS;

/// Where and how the program is attached.
#[derive(Clone, Debug)]
struct Attachment {
    interface: String,
    ifindex: u32,
    mode: XdpAttached,
    prog_id: u32,
}

/// The maps' published content, as read back.
#[derive(Clone, Debug, Default)]
pub struct PublishedState {
    pub services: Vec<(VipKey, ServiceMeta)>,
    pub backends: Vec<(u32, Backend)>,
}

impl BpfDataplane {
    /// Loads the embedded object into the kernel without attaching it (benchmarks and
    /// BPF_PROG_TEST_RUN fixtures drive it through [`BpfDataplane::program_mut`]), with
    /// the compiled sizes and the built-in (public) table seeds; `lb-agent run` loads
    /// through [`BpfDataplane::load_sized`] with the install's seeds.
    pub fn load() -> Result<Self, DataplaneError> {
        Self::load_with(None, None)
    }

    /// Loads the embedded object. With `adopted`, the new program uses those maps of a
    /// previous program (handed to the loader through a private bpffs, see
    /// `adopt::staging`); the others are created fresh. With `pins`, every map is also
    /// pinned in that directory (replacing what an earlier run pinned there).
    pub fn load_with(
        adopted: Option<&AdoptedMaps>,
        pins: Option<PinDir>,
    ) -> Result<Self, DataplaneError> {
        Self::load_sized(adopted, pins, MapSizes::default())
    }

    /// [`BpfDataplane::load_with`] with the backend maps sized by `sizes` (the adopted
    /// maps must have been matched against the same sizes, [`adopt::adopt_maps`]).
    pub fn load_sized(
        adopted: Option<&AdoptedMaps>,
        pins: Option<PinDir>,
        sizes: MapSizes,
    ) -> Result<Self, DataplaneError> {
        let staging = match adopted {
            Some(a) if !a.maps.is_empty() => Some(Staging::pin(&a.maps)?),
            _ => None,
        };
        let mut loader = EbpfLoader::new();
        sizes.apply(&mut loader);
        for (name, path) in staging.iter().flat_map(|s| s.paths()) {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader
            .load(crate::EBPF_OBJECT)
            .map_err(DataplaneError::Load)?;
        drop(staging);
        if let Some(p) = &pins {
            p.pin_all(&ebpf, &ALL_MAPS)?;
        }
        // The layout, recorded for the next agent before anything can attach.
        write_config(
            &mut ebpf,
            &DataplaneConfig {
                tables: sizes.tables(),
                flags: sizes.flags(),
                ..DataplaneConfig::default()
            },
        )?;
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
        // `lb_xdp`'s tail-call target, in place before anything can attach `lb_xdp`.
        full_path::load(&mut ebpf)?;
        // For the next agent: this build's map versions, found through the programs.
        schema_map::record(&ebpf, &[PROGRAM_NAME, FULL_PROGRAM_NAME], pins.as_ref());
        let (backend_stats, backend_stats_batch) = take_backend_stats(&mut ebpf)?;
        let vips = vip_index::VipIndex::new(
            take_array(&mut ebpf, map_names::VIP_INDEX)?,
            take_array(&mut ebpf, map_names::VIP_GEN)?,
            take_array(&mut ebpf, map_names::VIP_HDR)?,
        )?;
        // The pool's allocation is what the live VIP slots name (an adopted index).
        let live_pairs = vips.services().values().map(|m| {
            let pair = Pair {
                base: m.maglev_base,
                size: m.maglev_size,
            };
            (m.service_id, pair)
        });
        let maglev = maglev_table::MaglevTables::new(
            take_array(&mut ebpf, map_names::MAGLEV)?,
            take_array(&mut ebpf, map_names::MAGLEV_GEN)?,
            live_pairs,
        )?;
        Ok(Self {
            vips,
            maglev,
            backends: take(&mut ebpf, map_names::BACKENDS)?,
            counters: take(&mut ebpf, map_names::COUNTERS)?,
            service_stats: take(&mut ebpf, map_names::SERVICE_STATS)?,
            backend_stats,
            backend_stats_batch,
            events: Some(take(&mut ebpf, map_names::EVENTS)?),
            ebpf,
            attached: None,
            pins,
            sizes,
            serving: PROGRAM_NAME,
            tunnel_source: None,
            census: None,
            tunnel_gso: false,
        })
    }

    /// The kernel id of the program attached (or to attach).
    fn program_id(&mut self) -> Result<u32, DataplaneError> {
        let name = self.serving;
        let info = self
            .serving_mut()?
            .info()
            .map_err(|source| DataplaneError::Program { name, source })?;
        Ok(info.id())
    }

    /// The program attached (or to attach): `lb_xdp`, or `lb_xdp_full` (see `serving`).
    fn serving_mut(&mut self) -> Result<&mut Xdp, DataplaneError> {
        let name = self.serving;
        self.ebpf
            .program_mut(name)
            .ok_or(DataplaneError::MissingProgram { name })?
            .try_into()
            .map_err(|source| DataplaneError::Program { name, source })
    }

    /// Cluster mode: `LB_PEER_FLOWS` and `LB_PEER_NAT`, to install other nodes'
    /// connections into, and `LB_CLUSTER` (once: the handles move to the caller).
    pub fn take_peer_tables(&mut self) -> Result<PeerTables, DataplaneError> {
        let flows = take_array(&mut self.ebpf, map_names::PEER_FLOWS)?;
        let nat = take_array(&mut self.ebpf, map_names::PEER_NAT)?;
        let writer = PeerWriter::new(flows, nat, &self.sizes.tables())?;
        let members = take(&mut self.ebpf, map_names::CLUSTER)?;
        Ok(PeerTables::new(writer, members))
    }

    /// Cluster mode: the connection events (`LB_CONN_EVENTS`) as an async stream (once).
    pub fn take_conn_events(&mut self) -> Result<ConnEventStream, DataplaneError> {
        ConnEventStream::new(take(&mut self.ebpf, map_names::CONN_EVENTS)?)
    }

    /// A reader of the flow and nat tables usable from any thread (for
    /// [`TableReader::nat_seen_since`]).
    pub fn table_reader(&self) -> Result<TableReader, DataplaneError> {
        let array = |name: &'static str| match self.ebpf.map(name) {
            Some(Map::Array(data)) => Ok(data),
            Some(_) => Err(DataplaneError::Map {
                name,
                source: aya::maps::MapError::InvalidMapType { map_type: 0 },
            }),
            None => Err(DataplaneError::MissingMap { name }),
        };
        TableReader::new(array(map_names::FLOWS)?, array(map_names::NAT)?).map_err(|source| {
            DataplaneError::Io {
                what: "opening the flow and nat tables for reading",
                source,
            }
        })
    }

    /// Tells the program the interface's MAC (`LB_CONFIG`; all zero: no check).
    pub fn set_interface_mac(&mut self, mac: [u8; 6]) -> Result<(), DataplaneError> {
        let value = DataplaneConfig {
            mac,
            tables: self.sizes.tables(),
            flags: self.sizes.flags(),
            ..DataplaneConfig::default()
        };
        write_config(&mut self.ebpf, &value)
    }

    /// Copies the live entries of a previous program's flow and nat tables that were
    /// not adopted for another size or seed (not a schema change) into this program's
    /// fresh ones
    /// ([`flow_tables::copy_flows`]); before the new program is attached.
    pub fn copy_tables(
        &mut self,
        previous: flow_tables::PreviousTables,
        adopted: &AdoptedMaps,
    ) -> Result<Vec<(&'static str, flow_tables::Copied)>, DataplaneError> {
        // Only a table fresh for its size or seed: a schema change's entries mean
        // something else (`schema::Fresh::entries_copyable`).
        let copyable = |name| {
            adopted
                .fresh
                .iter()
                .any(|(n, why)| *n == name && why.entries_copyable())
        };
        let layout = self.sizes.tables();
        let mut out = Vec::new();
        for (name, old) in [
            (map_names::FLOWS, previous.flows),
            (map_names::NAT, previous.nat),
        ] {
            let Some(old) = old.filter(|_| copyable(name)) else {
                continue;
            };
            let new = self
                .ebpf
                .map_mut(name)
                .ok_or(DataplaneError::MissingMap { name })?;
            let copied = if name == map_names::FLOWS {
                flow_tables::copy_flows(old, new, &layout)?
            } else {
                flow_tables::copy_nat(old, new, &layout)?
            };
            out.push((name, copied));
        }
        Ok(out)
    }

    /// Writes what tunnel forwarding needs into `LB_CONFIG`, keeping the MAC: the
    /// interface's MTU and the outer source addresses (docs/tunnel.md).
    fn set_tunnel_config(&mut self, interface: &str) -> Result<(), DataplaneError> {
        let tunnel = TunnelConfig::of(interface, self.tunnel_source).map_err(|source| {
            DataplaneError::Io {
                what: "reading the interface's MTU and addresses",
                source,
            }
        })?;
        self.set_tunnel(&tunnel)?;
        tracing::debug!(
            interface,
            mtu = tunnel.mtu,
            source4 = ?tunnel.src4,
            source6 = ?tunnel.src6,
            "tunnel parameters written"
        );
        Ok(())
    }

    /// Writes `tunnel` (MTU, outer sources) into `LB_CONFIG`, keeping the MAC; done at
    /// every attach, and by benchmarks that run the program unattached.
    pub fn set_tunnel(&mut self, tunnel: &TunnelConfig) -> Result<(), DataplaneError> {
        self.update_config(|current| tunnel.apply(current))
    }

    /// Tells the program whether it runs in native mode (`CONFIG_F_NATIVE` in
    /// `LB_CONFIG`, the rest kept): there it completes partial checksums before it
    /// forwards (docs/internals/fast-path.md, "Partial checksums").
    pub fn set_native(&mut self, native: bool) -> Result<(), DataplaneError> {
        self.update_config(|current| DataplaneConfig {
            flags: if native {
                current.flags | CONFIG_F_NATIVE
            } else {
                current.flags & !CONFIG_F_NATIVE
            },
            ..current
        })
    }

    /// What `LB_CONFIG` holds now (the interface's MAC, MTU, tunnel sources, mode flags).
    pub fn dataplane_config(&self) -> Result<DataplaneConfig, DataplaneError> {
        let name = map_names::CONFIG;
        let map = self
            .ebpf
            .map(name)
            .ok_or(DataplaneError::MissingMap { name })?;
        let config: Array<_, DataplaneConfig> = Array::try_from(map).map_err(map_err(name))?;
        config.get(&0, 0).map_err(map_err(name))
    }

    /// Rewrites `LB_CONFIG` as `change` makes it from its current value.
    fn update_config(
        &mut self,
        change: impl FnOnce(DataplaneConfig) -> DataplaneConfig,
    ) -> Result<(), DataplaneError> {
        let name = map_names::CONFIG;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(DataplaneError::MissingMap { name })?;
        let mut config: Array<_, DataplaneConfig> = Array::try_from(map).map_err(map_err(name))?;
        let value = change(config.get(&0, 0).map_err(map_err(name))?);
        config.set(0, &value, 0).map_err(map_err(name))
    }

    /// What is published in the maps now (non-empty after adopting a previous program).
    ///
    /// Service metas come without their Maglev pair (`maglev_base`, `maglev_size`):
    /// that is the data plane's own allocation, not something the publisher chooses.
    pub fn published_state(&self) -> Result<PublishedState, DataplaneError> {
        let services = self
            .vips
            .services()
            .iter()
            .map(|(k, m)| {
                let meta = ServiceMeta {
                    maglev_base: 0,
                    maglev_size: 0,
                    ..*m
                };
                (*k, meta)
            })
            .collect();
        let mut backends = Vec::new();
        for id in 1..=self.sizes.max_backends() {
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

    /// The whole-path program `lb_xdp_full` (for BPF_PROG_TEST_RUN: the whole path run
    /// as one program, without `lb_xdp` in front).
    pub fn full_program_mut(&mut self) -> Result<&mut Xdp, DataplaneError> {
        self.ebpf
            .program_mut(FULL_PROGRAM_NAME)
            .ok_or(DataplaneError::MissingProgram {
                name: FULL_PROGRAM_NAME,
            })?
            .try_into()
            .map_err(|source| DataplaneError::Program {
                name: FULL_PROGRAM_NAME,
                source,
            })
    }

    /// A copy of a service's live Maglev table (empty if it has none).
    pub fn live_table(&self, service_id: u32) -> Vec<u32> {
        self.maglev.live_table(service_id)
    }

    /// Where a service's pair of Maglev tables lies in the pool: (base block, size).
    pub fn maglev_pair(&self, service_id: u32) -> Option<(u32, u32)> {
        self.maglev.pair(service_id).map(|p| (p.base, p.size))
    }

    /// Blocks of the Maglev pool not allocated to any service.
    pub fn maglev_free_blocks(&self) -> u64 {
        self.maglev.free_blocks()
    }
}

/// Writes `LB_CONFIG`'s one entry.
fn write_config(ebpf: &mut Ebpf, value: &DataplaneConfig) -> Result<(), DataplaneError> {
    let name = map_names::CONFIG;
    let map = ebpf
        .map_mut(name)
        .ok_or(DataplaneError::MissingMap { name })?;
    let mut config: Array<_, DataplaneConfig> = Array::try_from(map).map_err(map_err(name))?;
    config.set(0, value, 0).map_err(map_err(name))
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

pub(super) fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> DataplaneError {
    move |source| DataplaneError::Map { name, source }
}
