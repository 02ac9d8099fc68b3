//! The probe side of the agent ([`Probing`]): starts each server's probe tasks under a
//! report key unique to its incarnation, and routes the reports that come back to their
//! server (`report_routes.rs`).

use std::{net::SocketAddr, sync::Arc};

use tokio::{sync::mpsc, time::Instant};

use super::{
    ServiceRt,
    passive_kept::PassiveKept,
    report_routes::{Lookup, ReportRoutes},
    server::{Configured, ServerRt},
    server_table,
};
use crate::{
    config::ServiceConfig,
    health::{HealthState, PassivePolicy, ServerHealth, StartState},
    membership::Admin,
    probe::{PROMPT_SPREAD, ProbeReport, Prober, ServerKey, SharedSignals, spawn_spread},
};

/// Capacity of the probe-report channel.
const REPORTS: usize = 4096;

/// The prober, the channel its tasks report on, and where each report key's server is.
pub(super) struct Probing<P> {
    prober: Arc<P>,
    reports_tx: mpsc::Sender<ProbeReport>,
    /// Report keys of the server incarnations and where their servers are
    /// (`ServerKey::service`).
    routes: ReportRoutes,
}

impl<P: Prober> Probing<P> {
    /// Probing through `prober`, and the receiver of its reports.
    pub fn new(prober: Arc<P>) -> (Self, mpsc::Receiver<ProbeReport>) {
        let (reports_tx, reports) = mpsc::channel(REPORTS);
        let probing = Probing {
            prober,
            reports_tx,
            routes: ReportRoutes::default(),
        };
        (probing, reports)
    }

    /// A server of `svc` at `addr` with its health (restored from `kept` if the previous
    /// run ejected it), its shared signals and its probe tasks started.
    pub fn start(
        &mut self,
        svc: &ServiceConfig,
        addr: SocketAddr,
        conf: Configured,
        start: StartState,
        now: Instant,
        kept: &PassiveKept,
    ) -> ServerRt {
        // A spare takes traffic only once every probe has passed (Angie), also at start.
        let start = if start == StartState::New && conf.spare && conf.backup == 0 {
            StartState::NewSpare
        } else {
            start
        };
        let mut health = ServerHealth::new(&svc.probes, PassivePolicy::of(svc), start, now);
        kept.restore(&svc.name, addr, &mut health, now);
        let signals = Arc::new(SharedSignals::new(health.usable()));
        let incarnation = self.routes.allocate();
        let key = ServerKey {
            service: incarnation,
            addr,
        };
        // Out of traffic until its probes pass although the pool wants it (added at
        // runtime, or in traffic before and checked again): first probes come promptly.
        let waiting = matches!(start, StartState::Added | StartState::Returning)
            || (start == StartState::ReloadedWasUp && health.state() == HealthState::Checking);
        let tasks = svc
            .probes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                spawn_spread(
                    self.prober.clone(),
                    key,
                    i,
                    Arc::new(p.clone()),
                    signals.clone(),
                    self.reports_tx.clone(),
                    if waiting { PROMPT_SPREAD } else { p.interval },
                )
            })
            .collect();
        ServerRt {
            addr,
            addr_text: addr.to_string(),
            incarnation,
            weight: conf.weight,
            spare: conf.spare,
            backup: conf.backup,
            configured: Some(conf),
            admin: Admin::Up,
            health,
            signals,
            _probes: tasks,
            last_stats: Default::default(),
        }
    }

    /// Where the server `key` reports for is in `services` (service index, position in
    /// its table); `None` for a report of an incarnation that is gone. Routes are placed
    /// again, once, when a server was added or removed since they were.
    pub fn route(&mut self, services: &[ServiceRt], key: ServerKey) -> Option<(usize, usize)> {
        let found = |routes: &ReportRoutes| match routes.lookup(key.service) {
            Lookup::At(si, index) => services
                .get(si)
                .and_then(|s| s.servers.at(index))
                .filter(|s| s.incarnation == key.service && s.addr == key.addr)
                .map(|_| (si, index)),
            Lookup::Stale | Lookup::Unplaced => None,
        };
        if let Some(at) = found(&self.routes) {
            return Some(at);
        }
        if self.routes.lookup(key.service) == Lookup::Stale
            || self.routes.placed_at(server_table::layout_epoch())
        {
            return None;
        }
        self.place(services);
        found(&self.routes)
    }

    /// Places every server's report route (after the services or their servers moved).
    pub fn place(&mut self, services: &[ServiceRt]) {
        let epoch = server_table::layout_epoch();
        let servers = services.iter().enumerate().flat_map(|(si, svc)| {
            svc.servers
                .values()
                .enumerate()
                .map(move |(i, s)| (si, i, s.incarnation))
        });
        self.routes.place(servers, epoch);
    }
}
