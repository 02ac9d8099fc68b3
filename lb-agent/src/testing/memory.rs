//! [`MemoryDataplane`]: an in-memory [`Dataplane`] for testing the logic above the maps.
//!
//! It records every write in order so tests can check what was published and when.

use std::collections::BTreeMap;

use lb_common::{
    counters,
    maps::{Backend, BackendStats, ServiceMeta, ServiceStats, VipKey},
};

use crate::dataplane::{Dataplane, DataplaneError};

/// One write, in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Service(VipKey),
    RemoveService(VipKey),
    Backend(u32),
    Table(u32),
    /// Slots of a service's live table written in place (`Dataplane::write_slots`).
    Slots(u32),
}

/// Maps held in memory.
#[derive(Debug)]
pub struct MemoryDataplane {
    /// How many backends it holds ([`Dataplane::max_backends`]; the compiled size by default).
    pub max_backends: u32,
    pub services: BTreeMap<[u32; 6], (VipKey, ServiceMeta)>,
    pub backends: BTreeMap<u32, Backend>,
    pub tables: BTreeMap<u32, Vec<u32>>,
    pub backend_stats: BTreeMap<u32, BackendStats>,
    pub log: Vec<Write>,
    /// Table slots written so far: a whole table counts every slot.
    pub slots_written: u64,
}

fn key_of(vip: &VipKey) -> [u32; 6] {
    [
        vip.addr[0],
        vip.addr[1],
        vip.addr[2],
        vip.addr[3],
        vip.port as u32,
        ((vip.proto as u32) << 8) | vip.family as u32,
    ]
}

impl Default for MemoryDataplane {
    fn default() -> Self {
        Self {
            max_backends: lb_common::MAX_BACKENDS - 1,
            services: BTreeMap::new(),
            backends: BTreeMap::new(),
            tables: BTreeMap::new(),
            backend_stats: BTreeMap::new(),
            log: Vec::new(),
            slots_written: 0,
        }
    }
}

impl MemoryDataplane {
    /// An empty data plane holding up to `max_backends` backends.
    pub fn with_max_backends(max_backends: u32) -> Self {
        Self {
            max_backends,
            ..Self::default()
        }
    }

    /// The service value stored for `vip`.
    pub fn service(&self, vip: &VipKey) -> Option<ServiceMeta> {
        self.services.get(&key_of(vip)).map(|(_, m)| *m)
    }
}

impl Dataplane for MemoryDataplane {
    fn upsert_service(&mut self, vip: &VipKey, meta: &ServiceMeta) -> Result<(), DataplaneError> {
        self.services.insert(key_of(vip), (*vip, *meta));
        self.log.push(Write::Service(*vip));
        Ok(())
    }

    fn remove_service(&mut self, vip: &VipKey, service_id: u32) -> Result<(), DataplaneError> {
        self.services.remove(&key_of(vip));
        self.tables.remove(&service_id);
        self.log.push(Write::RemoveService(*vip));
        Ok(())
    }

    fn max_backends(&self) -> u32 {
        self.max_backends
    }

    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError> {
        // As the real map: an array of `max_backends + 1` entries.
        if id > self.max_backends {
            return Err(DataplaneError::BackendOutside {
                id,
                max: self.max_backends,
            });
        }
        self.backends.insert(id, *backend);
        self.log.push(Write::Backend(id));
        Ok(())
    }

    fn publish_table(&mut self, service_id: u32, table: &[u32]) -> Result<(), DataplaneError> {
        // The sizes the real data plane's pool takes (one of `MAGLEV_SIZES`).
        if !u32::try_from(table.len()).is_ok_and(lb_common::is_maglev_size) {
            return Err(DataplaneError::TableSize {
                service_id,
                len: table.len(),
            });
        }
        self.tables.insert(service_id, table.to_vec());
        self.log.push(Write::Table(service_id));
        self.slots_written += table.len() as u64;
        Ok(())
    }

    fn write_slots(&mut self, service_id: u32, slots: &[(u32, u32)]) -> Result<(), DataplaneError> {
        let size = self.tables.get(&service_id).map_or(0, Vec::len);
        if let Some(&(slot, _)) = slots.iter().find(|&&(s, _)| s as usize >= size) {
            return Err(DataplaneError::SlotOutside {
                service_id,
                slot,
                size,
            });
        }
        let Some(table) = self.tables.get_mut(&service_id) else {
            return Ok(()); // no slots given
        };
        for &(slot, id) in slots {
            table[slot as usize] = id;
        }
        self.log.push(Write::Slots(service_id));
        self.slots_written += slots.len() as u64;
        Ok(())
    }

    fn counters(&self) -> Result<[u64; counters::COUNT as usize], DataplaneError> {
        Ok([0; counters::COUNT as usize])
    }

    fn service_stats(&self, _service_id: u32) -> Result<ServiceStats, DataplaneError> {
        Ok(ServiceStats::default())
    }

    /// One pass over the stored counters (as the real maps' batch read), not a lookup
    /// per id, so benchmarks over memory time the agent rather than this double.
    fn backend_stats_below(&self, limit: u32) -> Result<Vec<BackendStats>, DataplaneError> {
        let mut all = vec![BackendStats::default(); limit as usize];
        for (&id, &stats) in self.backend_stats.range(..limit) {
            all[id as usize] = stats;
        }
        Ok(all)
    }

    fn backend_stats(&self, backend_id: u32) -> Result<BackendStats, DataplaneError> {
        Ok(self
            .backend_stats
            .get(&backend_id)
            .copied()
            .unwrap_or_default())
    }
}
