//! The running agent's backends, per-CPU flow caches and per-CPU counters read from
//! outside: the program attached to the lb's `eth0` names its maps (as a restart finds
//! them), each opened by name. For scenarios that judge what reaches the backends against
//! what the maps name, and that check which CPUs handled a flow.

use aya::maps::{Array, Map, MapData, PerCpuArray};
use lb_agent::dataplane::{adopt, if_index};
use lb_common::{
    NO_BACKEND, map_names,
    maps::{Backend, FlowCacheEntry, FlowKey},
};

use crate::{
    net::{netns::NetNs, topology::HOST_IF},
    util::error::Error,
};

/// `LB_BACKENDS`, `LB_FLOW_CACHE` and `LB_COUNTERS` of the program on `eth0` in the lb
/// namespace, open for reads. A restarted agent attaches a new program with a new cache:
/// open them again after one.
pub struct AttachedMaps {
    backends: Array<MapData, Backend>,
    cache: PerCpuArray<MapData, FlowCacheEntry>,
    counters: PerCpuArray<MapData, u64>,
}

impl AttachedMaps {
    /// Opens the maps of the program attached to `eth0` in `lb`.
    pub fn open(lb: &NetNs) -> Result<AttachedMaps, Error> {
        let ids = lb.run(|| -> Result<Vec<u32>, Error> {
            let index = if_index(HOST_IF)?;
            let program = adopt::attached_program(index, HOST_IF)?
                .ok_or_else(|| Error::Unexpected(format!("no XDP program on {HOST_IF}")))?;
            Ok(program.map_ids().to_vec())
        })??;
        let mut backends = None;
        let mut cache = None;
        let mut counters = None;
        for id in ids {
            let map = MapData::from_id(id).map_err(map_error(format!("opening map id {id}")))?;
            let info = map
                .info()
                .map_err(map_error(format!("reading map id {id}")))?;
            let name = String::from_utf8_lossy(info.name()).into_owned();
            if name == map_names::BACKENDS {
                backends = Some(map);
            } else if name == map_names::FLOW_CACHE {
                cache = Some(map);
            } else if name == map_names::COUNTERS {
                counters = Some(map);
            }
        }
        let missing =
            |name: &str| Error::Unexpected(format!("the program on {HOST_IF} has no {name}"));
        let backends = backends.ok_or_else(|| missing(map_names::BACKENDS))?;
        let cache = cache.ok_or_else(|| missing(map_names::FLOW_CACHE))?;
        let counters = counters.ok_or_else(|| missing(map_names::COUNTERS))?;
        Ok(AttachedMaps {
            backends: Array::try_from(Map::Array(backends))
                .map_err(map_error(map_names::BACKENDS.to_owned()))?,
            cache: PerCpuArray::try_from(Map::PerCpuArray(cache))
                .map_err(map_error(map_names::FLOW_CACHE.to_owned()))?,
            counters: PerCpuArray::try_from(Map::PerCpuArray(counters))
                .map_err(map_error(map_names::COUNTERS.to_owned()))?,
        })
    }

    /// The `LB_BACKENDS` entries of ids `1..=last` (the agent hands out the lowest fresh
    /// ids first, so a small bed's backends are all among the first few).
    pub fn backends(&self, last: u32) -> Result<Vec<(u32, Backend)>, Error> {
        (1..=last)
            .map(|id| {
                self.backends
                    .get(&id, 0)
                    .map(|b| (id, b))
                    .map_err(map_error(format!("reading backend id {id}")))
            })
            .collect()
    }

    /// Every flow each CPU holds in its cache, by CPU (whatever the tick of the entry:
    /// a flow is there only if a packet of it went through `LB_FLOWS` on that CPU).
    pub fn cached_flows(&self) -> Result<Vec<Vec<FlowKey>>, Error> {
        let mut by_cpu: Vec<Vec<FlowKey>> = Vec::new();
        for slot in 0..lb_common::FLOW_CACHE_SLOTS {
            let values = self
                .cache
                .get(&slot, 0)
                .map_err(map_error(format!("reading flow cache slot {slot}")))?;
            by_cpu.resize_with(values.len(), Vec::new);
            for (cpu, e) in values.iter().enumerate() {
                if e.backend_id != NO_BACKEND {
                    by_cpu[cpu].push(e.key);
                }
            }
        }
        Ok(by_cpu)
    }

    /// Raw counter `index` (`lb_common::counters`) of each CPU.
    pub fn counter_by_cpu(&self, index: u32) -> Result<Vec<u64>, Error> {
        let values = self
            .counters
            .get(&index, 0)
            .map_err(map_error(format!("reading counter {index}")))?;
        Ok(values.to_vec())
    }
}

fn map_error(what: String) -> impl FnOnce(aya::maps::MapError) -> Error {
    move |e| Error::Io {
        what,
        source: std::io::Error::other(e.to_string()),
    }
}
