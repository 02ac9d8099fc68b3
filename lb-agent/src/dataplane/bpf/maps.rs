//! [`Dataplane`] on the kernel: services and their Maglev tables through the VIP index
//! and the `mmap`ed pool, backends, and the counters summed over CPUs.

use std::sync::Arc;

use lb_common::{
    counters, map_names,
    maps::{Backend, BackendStats, ServiceMeta, ServiceStats, VipKey},
};

use super::{BpfDataplane, map_err};
use crate::dataplane::{
    Dataplane, DataplaneError, census::TableCensus, tables::maglev_table::Published,
};

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

    fn table_census(&self) -> Option<Arc<TableCensus>> {
        self.census.as_ref().and_then(|c| c.latest())
    }
}
