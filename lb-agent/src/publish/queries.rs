//! What the publisher answers about what it published (ids, addresses, live slots, the
//! live table): read by the agent's stats tick, passive events and the snapshot.

use std::net::SocketAddr;

use super::Publisher;
use super::plan::slot_counts;

impl Publisher {
    /// Data-plane id of a service.
    pub fn service_id(&self, service: &str) -> Option<u32> {
        self.services.get(service).map(|s| s.id)
    }

    /// Slots of `service`'s live Maglev table that send new flows to `addr` (0 when it
    /// takes none or is not published).
    pub fn live_slots(&self, service: &str, addr: &SocketAddr) -> u32 {
        self.services
            .get(service)
            .and_then(|s| {
                let id = s.backends.get(addr)?.id;
                s.live_slots
                    .get_or_init(|| slot_counts(&s.live))
                    .get(&id)
                    .copied()
            })
            .unwrap_or(0)
    }

    /// Every backend id handed out so far is below this.
    pub fn backend_id_limit(&self) -> u32 {
        self.backend_ids.next
    }

    /// Data-plane id of a backend of a service.
    pub fn backend_id(&self, service: &str, addr: &SocketAddr) -> Option<u32> {
        self.services.get(service)?.backends.get(addr).map(|b| b.id)
    }

    /// Whether a backend of a service is published (one lookup).
    pub fn has_backend(&self, service: &str, addr: &SocketAddr) -> bool {
        self.services
            .get(service)
            .is_some_and(|s| s.backends.contains_key(addr))
    }

    /// The backends published for a service as (address, (data-plane id, live slots)), in
    /// address order: one pass for callers walking every server (stats tick, snapshot)
    /// instead of two map lookups per server.
    pub fn backends_in_order(
        &self,
        service: &str,
    ) -> impl Iterator<Item = (SocketAddr, (u32, u32))> + '_ {
        self.services.get(service).into_iter().flat_map(|s| {
            let slots = s.live_slots.get_or_init(|| slot_counts(&s.live));
            s.backends
                .iter()
                .map(move |(addr, b)| (*addr, (b.id, slots.get(&b.id).copied().unwrap_or(0))))
        })
    }

    /// The backends published for a service as (address, data-plane id), in address
    /// order, without the slot counts (the stats tick needs only the ids: counting
    /// slots walks the whole live table after every publish).
    pub fn backend_ids_in_order(
        &self,
        service: &str,
    ) -> impl Iterator<Item = (SocketAddr, u32)> + '_ {
        self.services
            .get(service)
            .into_iter()
            .flat_map(|s| s.backends.iter().map(|(addr, b)| (*addr, b.id)))
    }

    /// Addresses of the backends published for a service.
    pub fn backend_addrs(&self, service: &str) -> impl Iterator<Item = SocketAddr> + '_ {
        self.services
            .get(service)
            .into_iter()
            .flat_map(|s| s.backends.keys().copied())
    }

    /// The live table of a service as published, with a number that changes whenever
    /// the table does (addresses of its ids: [`Publisher::backend_addr`]).
    pub fn live_table(&self, service: &str) -> Option<(&[u32], u64)> {
        let svc = self.services.get(service)?;
        Some((&svc.live, svc.live_version))
    }

    /// The service and address of a data-plane backend id.
    pub fn backend_by_id(&self, id: u32) -> Option<(String, SocketAddr)> {
        self.owners.get(&id).cloned()
    }

    /// The address of a data-plane backend id.
    pub fn backend_addr(&self, id: u32) -> Option<SocketAddr> {
        self.owners.get(&id).map(|(_, addr)| *addr)
    }
}
