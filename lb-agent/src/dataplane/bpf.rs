//! [`BpfDataplane`]: loads the embedded XDP object (adopting a previous program's maps),
//! attaches it through netlink, watches that it stays attached, and owns its maps.

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, Map, MapData, PerCpuArray, RingBuf},
    programs::Xdp,
};
use lb_common::{
    FULL_PROGRAM_NAME, PROGRAM_NAME, counters, map_names,
    maps::{Backend, BackendStats, DataplaneConfig, ServiceMeta, ServiceStats, VipKey},
};

use std::{net::IpAddr, os::fd::AsFd};

use crate::netlink::{self, XdpAttached};

use super::{
    Dataplane, DataplaneError, DataplaneLifecycle, EventStream, LinkCheck,
    adopt::{
        self, AdoptedMaps, AttachedProgram, flow_tables,
        pin::{self, PinDir},
        schema_map,
        staging::Staging,
    },
    attach::{self, AttachMode, full_path, tunnel::TunnelConfig},
    batch::PerCpuBatchReader,
    sizing::MapSizes,
    tables::{
        maglev_table::{self, Pair, Published},
        vip_index,
    },
};

/// The loaded and attached XDP program with every map handle.
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
}

/// Every map of the object that holds state (all are pinned when pinning is on).
const ALL_MAPS: [&str; 12] = adopt::ADOPTED_MAPS;

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
    /// [`super::adopt::staging`]); the others are created fresh. With `pins`, every map is also
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

    /// Tells the program the interface's MAC (`LB_CONFIG`; all zero: no check).
    pub fn set_interface_mac(&mut self, mac: [u8; 6]) -> Result<(), DataplaneError> {
        let value = DataplaneConfig {
            mac,
            tables: self.sizes.tables(),
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
        let name = map_names::CONFIG;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(DataplaneError::MissingMap { name })?;
        let mut config: Array<_, DataplaneConfig> = Array::try_from(map).map_err(map_err(name))?;
        let value = tunnel.apply(config.get(&0, 0).map_err(map_err(name))?);
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

impl DataplaneLifecycle for BpfDataplane {
    fn attach(
        &mut self,
        interface: &str,
        mode: AttachMode,
        previous: Option<&AttachedProgram>,
    ) -> Result<(), DataplaneError> {
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
        self.set_tunnel_config(interface)?;
        let ifindex = attach::if_index(interface)?;
        // The split's `LB_PROGRAMS` must outlive this process as the attached program does.
        let lasting = full_path::lasting_dir(self.pins.as_ref());
        self.serving = if lasting.is_some() {
            PROGRAM_NAME
        } else {
            tracing::warn!(
                interface,
                "no bpffs outlives the agent here (no pin_path, and init's /sys/fs/bpf is out of \
                 reach): attaching the whole-path program lb_xdp_full, without the hot-path \
                 split (docs/internals/fast-path.md, \"Two programs\")"
            );
            FULL_PROGRAM_NAME
        };
        let serving = self.serving;
        let prog_id = self.program_id()?;
        let attempt = {
            let prog = self.serving_mut()?;
            let fd = prog.fd().map_err(|source| DataplaneError::Program {
                name: serving,
                source,
            })?;
            attach::attach(fd.as_fd(), ifindex, interface, mode, previous)
        };
        let legacy = self
            .pins
            .as_ref()
            .map(|p| p.legacy_link(interface))
            .filter(|path| path.exists());
        let used = match (attempt, legacy, previous) {
            (Err(DataplaneError::HeldByLink { .. }), Some(path), Some(old)) => {
                // Upgrading from an agent that attached through a pinned bpf_link:
                // swap into that link (atomic) rather than interrupt traffic.
                pin::swap_into_legacy_link(self.serving_mut()?, &path)?;
                tracing::warn!(
                    interface,
                    link = %path.display(),
                    "swapped into the pinned bpf_link an older lb-agent left: restarts stay \
                     hitless while that pin lives; to move to netlink (which needs no pins), \
                     stop the agent, `lb-agent detach`, start it (a short interruption)"
                );
                old.mode
            }
            (attempt, _, _) => attempt?,
        };
        if let Some(dir) = &lasting {
            full_path::keep(&self.ebpf, dir, prog_id, previous.map(|p| p.id))?;
        }
        tracing::info!(
            interface,
            mode = used.name(),
            program_id = prog_id,
            replaced = previous.map(|p| p.id),
            "XDP program attached"
        );
        self.attached = Some(Attachment {
            interface: interface.to_string(),
            ifindex,
            mode: used,
            prog_id,
        });
        Ok(())
    }

    fn check_attachment(&mut self) -> Result<LinkCheck, DataplaneError> {
        let Some(att) = self.attached.clone() else {
            return Ok(LinkCheck::Intact);
        };
        let now = match netlink::query_xdp(att.ifindex) {
            Ok(now) => now,
            Err(source) if source.errno() == Some(libc::ENODEV) => {
                return Err(DataplaneError::InterfaceGone {
                    interface: att.interface,
                    ifindex: att.ifindex,
                });
            }
            Err(source) => {
                return Err(DataplaneError::Netlink {
                    what: format!("reading the XDP program of `{}`", att.interface),
                    source,
                });
            }
        };
        match now {
            Some(p) if p.id == att.prog_id => Ok(LinkCheck::Intact),
            Some(p) => {
                let name = adopt::attached_program(att.ifindex, &att.interface)
                    .ok()
                    .flatten()
                    .map(|p| p.name)
                    .unwrap_or_default();
                Err(DataplaneError::Replaced {
                    interface: att.interface,
                    now: format!("program id {} `{name}` ({})", p.id, p.mode.name()),
                })
            }
            None => {
                let mode = match att.mode {
                    XdpAttached::Generic => AttachMode::Generic,
                    _ => AttachMode::Native,
                };
                self.attach(&att.interface, mode, None)?;
                Ok(LinkCheck::Reattached)
            }
        }
    }

    fn still_attached(&self) -> bool {
        self.attached.as_ref().is_some_and(
            |att| matches!(netlink::query_xdp(att.ifindex), Ok(Some(p)) if p.id == att.prog_id),
        )
    }

    fn sizes(&self) -> MapSizes {
        self.sizes
    }

    fn set_tunnel_source(&mut self, source: Option<IpAddr>) {
        self.tunnel_source = source;
    }

    fn pins(&self) -> Option<&PinDir> {
        self.pins.as_ref()
    }

    fn interface(&self) -> &str {
        self.attached.as_ref().map_or("", |a| &a.interface)
    }

    fn mode_name(&self) -> &'static str {
        self.attached.as_ref().map_or("detached", |a| a.mode.name())
    }

    fn start_census(&mut self, every: std::time::Duration) -> Result<(), DataplaneError> {
        let array = |name: &'static str| match self.ebpf.map(name) {
            Some(Map::Array(data)) => Ok(data),
            Some(_) => Err(DataplaneError::Map {
                name,
                source: aya::maps::MapError::InvalidMapType { map_type: 0 },
            }),
            None => Err(DataplaneError::MissingMap { name }),
        };
        let reader =
            super::census::TableReader::new(array(map_names::FLOWS)?, array(map_names::NAT)?)
                .and_then(|r| super::census::CensusSampler::start(r, every))
                .map_err(|source| DataplaneError::Io {
                    what: "starting the flow and nat table count",
                    source,
                })?;
        self.census = Some(reader);
        Ok(())
    }

    fn take_events(&mut self) -> Option<Result<EventStream, DataplaneError>> {
        self.events.take().map(EventStream::new)
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

impl Dataplane for BpfDataplane {
    fn upsert_service(&mut self, vip: &VipKey, meta: &ServiceMeta) -> Result<(), DataplaneError> {
        // The slot names the service's pair of Maglev tables (none yet: size 0, every
        // packet `DROP_NO_BACKEND` until its first table).
        let pair = self.maglev.pair(meta.service_id);
        let meta = ServiceMeta {
            maglev_base: pair.map_or(0, |p| p.base),
            maglev_size: pair.map_or(0, |p| p.size),
            ..*meta
        };
        self.vips.upsert(vip, &meta)
    }

    fn remove_service(&mut self, vip: &VipKey, service_id: u32) -> Result<(), DataplaneError> {
        self.vips.remove(vip)?;
        // No slot names the pair now; it returns to the pool after a grace period, so a
        // stray packet that read the old slot still finds the old table.
        self.maglev.release(service_id);
        Ok(())
    }

    fn max_backends(&self) -> u32 {
        self.sizes.max_backends()
    }

    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError> {
        self.backends
            .set(id, backend, 0)
            .map_err(map_err(map_names::BACKENDS))
    }

    fn publish_table(&mut self, service_id: u32, table: &[u32]) -> Result<(), DataplaneError> {
        match self.maglev.publish(service_id, table)? {
            Published::InPlace => Ok(()),
            Published::Moved { now, old } => {
                // A new or resized table: switch the VIP slot to the new pair, then
                // retire the old one (free after a grace period from now).
                if let Err(e) = self.vips.set_maglev(service_id, now.base, now.size) {
                    // The slot still names the old pair: keep it, drop the new one.
                    self.maglev.undo_move(service_id, now, old);
                    return Err(e);
                }
                if let Some(old) = old {
                    self.maglev.retire(old);
                }
                Ok(())
            }
        }
    }

    fn write_slots(&mut self, service_id: u32, slots: &[(u32, u32)]) -> Result<(), DataplaneError> {
        self.maglev.write_slots(service_id, slots)
    }

    fn counters(&self) -> Result<[u64; counters::COUNT as usize], DataplaneError> {
        let mut out = [0u64; counters::RAW_COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            let per_cpu = self
                .counters
                .get(&(i as u32), 0)
                .map_err(map_err(map_names::COUNTERS))?;
            *slot = per_cpu.iter().sum();
        }
        Ok(counters::derive(&out))
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

    fn table_census(&self) -> Option<std::sync::Arc<super::census::TableCensus>> {
        self.census.as_ref().and_then(|c| c.latest())
    }
}
