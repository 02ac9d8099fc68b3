//! Taking over what a previous run published (pinned maps): services matched by VIP,
//! backends by address, keeping their ids so pinned flows still find their backends.

use std::{collections::BTreeMap, net::SocketAddr};

use lb_common::maps::{BACKEND_F_LIVE, BACKEND_F_SERVING};

use super::Publisher;
use super::plan::{vip_key, words_addr};
use super::state::AdoptedService;
use crate::dataplane::PublishedState;

impl Publisher {
    /// Takes over what a previous run published (pinned maps): services are matched to
    /// the configuration by VIP, backends by address, and keep their ids, so flows pinned
    /// before the restart still find their backends. Call before the first `apply`.
    pub fn adopt(&mut self, state: &PublishedState) {
        for (vip, meta) in &state.services {
            self.service_ids.reserve(meta.service_id);
            self.adopted.insert(
                *vip,
                AdoptedService {
                    id: meta.service_id,
                    meta: *meta,
                    backends: BTreeMap::new(),
                },
            );
        }
        for (id, b) in &state.backends {
            self.backend_ids.reserve(*id);
            self.adopted_serving_known |= b.flags & BACKEND_F_SERVING != 0;
            let addr = SocketAddr::new(words_addr(b.addr, b.family), u16::from_be(b.port));
            match self.adopted.values_mut().find(|s| s.id == b.service_id) {
                Some(svc) => {
                    svc.backends.insert(addr, (*id, *b));
                }
                // A backend retired by the previous run: its id stays reserved until
                // the first apply gives it back (below).
                None => self.orphans.push(*id),
            }
        }
    }

    /// Whether a backend was taking new flows (`BACKEND_F_SERVING`) when a previous run
    /// stopped; `None` if it was not published then. A backend that only kept its pinned
    /// flows (`BACKEND_F_LIVE` alone: unhealthy, draining, idle spare) does not count —
    /// unless no adopted backend has `SERVING` at all: maps pinned by a version before
    /// that flag meant "in traffic" by `LIVE` alone, and an upgrade must not take every
    /// server out of traffic.
    pub fn adopted_live(&self, vip: SocketAddr, proto: u8, addr: SocketAddr) -> Option<bool> {
        let svc = self.adopted.get(&vip_key(vip, proto))?;
        let (_, b) = svc.backends.get(&addr)?;
        let in_traffic = if self.adopted_serving_known {
            BACKEND_F_SERVING
        } else {
            BACKEND_F_LIVE
        };
        Some(b.flags & in_traffic != 0)
    }
}
