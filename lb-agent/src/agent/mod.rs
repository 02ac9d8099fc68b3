//! The agent's brain: turns configuration, probe results, passive signals and admin
//! changes into server states, membership (spares, backup levels, cap, fail-open) and
//! data-plane writes, and keeps the operator's snapshot current.
//!
//! Everything here runs on one task and owns all state; probe tasks only send reports,
//! the API only sends requests. Time is `tokio::time`, so tests run under paused time
//! against [`crate::testing::MemoryDataplane`]. The loop that drives it
//! (`select!` over reports, ticks, admin and snapshot requests, signals) is
//! [`crate::event_loop`], which `lb-agent run` and the agent tests (`lb-agent/tests/agent/`) both run.
//!
//! [`Agent`] is composed of components, each owning its state behind its own methods:
//!
//! | component (field) | owns | file |
//! |-------------------|------|------|
//! | `dp` | the BPF maps ([`Dataplane`]) | `crate::dataplane` |
//! | `env` | interface, XDP mode, table sizes (status) | `mod.rs` |
//! | `services` | each service's config, servers (health, probes, counters), membership, outcome, departing backends, own local faults and probe durations, marks | `service.rs`, `server.rs`, `server_table.rs`, `departing.rs`, `probe_durations.rs` |
//! | `probing` | the prober, the report channel, the report routes of every server incarnation | `probing.rs`, `report_routes.rs` |
//! | `publishing` | the [`crate::publish::Publisher`] (what the maps hold), the publish retry, last publish and membership work, propagation histogram | `publishing.rs`, `publish_retry.rs` |
//! | `macs` | the neighbour source, known backend MACs, how many are unknown | `macs.rs`, `neighbours.rs` |
//! | `persistence` | runtime admin state, its state file, passive ejections kept across restarts | `persistence.rs`, `admin_state.rs`, `passive_kept.rs` |
//! | `events` | the shared event log, events pending while a reader holds it, the transitions count | `event_log.rs` |
//! | `faults` | passive events by kind, agent-wide local faults | `faults.rs`, `local_faults.rs` |
//! | `announcement` | the VIP announcer (routes, drain, BGP sessions), the traffic total a drain waits on | `announcing.rs` |
//! | `cluster` | the connections shared with the peers of `[cluster]` ([`crate::cluster::Cluster`]) and the data plane's peer tables, when configured | `cluster.rs` |
//! | `discovery` | DNS answers of `resolve = true` servers and their re-resolution | `crate::discovery`, `resolve.rs` |
//! | `deadlines` | the next time-driven deadline, cached between changes | `deadlines.rs` |
//! | `snapshot` | the last snapshot and its `watch` sender, its schedule, waiting readers, kept server records, table fingerprints | `snapshot/mod.rs`, `schedule.rs`, `readers.rs`, `build.rs` |
//!
//! The methods that coordinate components are on `Agent`, one concern per file:
//!
//! | file | does |
//! |------|------|
//! | `apply_config.rs` | applies a config: services and servers matched, servers started, admin state re-applied |
//! | `reports.rs` | probe reports, passive events and backend counters into servers' health |
//! | `recompute.rs` | marked services: membership, the data-plane view (`desired.rs`), the publish, the announcement |
//! | `admin.rs` | runtime admin requests |
//! | `deadlines.rs` | what is due next, and the tick that runs it |
//! | `departing.rs` | servers removed from the config keep their flows until idle |
//! | `macs.rs`, `neighbours.rs` | MAC resolution and the kernel's MAC changes into the maps |
//! | `announcing.rs` | VIP announcement and node drain |
//! | `event_log.rs` | transitions into the log (and into the ejections kept) |
//! | `resolve.rs` | DNS re-resolution of `resolve = true` servers |
//! | `snapshot/mod.rs` | the snapshot built from the other components, and its readers |

mod admin;
mod admin_state;
mod announcing;
mod apply_config;
mod client_hops;
mod cluster;
mod deadlines;
mod departing;
mod desired;
mod event_log;
mod faults;
mod local_faults;
mod macs;
mod neighbours;
mod passive_kept;
mod persistence;
mod probe_durations;
mod probing;
mod publish_retry;
mod publishing;
mod recompute;
mod report_routes;
mod reports;
mod resolve;
mod server;
mod server_table;
mod service;
mod snapshot;

use std::{net::SocketAddr, sync::Arc};

use tokio::sync::{mpsc, watch};

pub use admin_state::{AdminState, ReapplyReport, StateFileError};
pub use cluster::ClusterNode;
pub use neighbours::{KernelNeighbours, Neighbours, StaticNeighbours};
pub use publish_retry::{FIRST_RETRY, LAST_RETRY};
use server::{Configured, ServerRt};
pub use service::MembershipWork;
use service::ServiceRt;
pub use snapshot::{SNAPSHOT_DUTY, SNAPSHOT_EVERY, snapshot_interval};

use crate::{
    api::EventLog,
    dataplane::Dataplane,
    probe::{ProbeReport, Prober, ServerKey},
    view::{Histogram, Snapshot},
};

/// What the agent is running on (shown in status).
#[derive(Clone, Debug, Default)]
pub struct Environment {
    pub interface: String,
    pub xdp_mode: String,
    /// The tables' sizes as loaded.
    pub tables: crate::view::TablesStatus,
}

/// The agent: its components (see the module's table).
pub struct Agent<D: Dataplane, P: Prober, N: Neighbours> {
    dp: D,
    env: Environment,
    services: Vec<ServiceRt>,
    probing: probing::Probing<P>,
    publishing: publishing::Publishing,
    macs: macs::Macs<N>,
    persistence: persistence::Persistence,
    events: event_log::Events,
    faults: faults::Faults,
    announcement: announcing::Announcement,
    cluster: Option<ClusterNode>,
    discovery: crate::discovery::Discovery,
    deadlines: deadlines::DeadlineCache,
    snapshot: snapshot::SnapshotCache,
}

/// Channels the caller drives the agent with.
pub struct Handles {
    /// Probe results: feed each to [`Agent::on_probe_report`].
    pub reports: mpsc::Receiver<ProbeReport>,
    pub snapshot: watch::Receiver<Arc<Snapshot>>,
    pub events: EventLog,
}
impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    pub fn new(dp: D, prober: Arc<P>, neighbours: Arc<N>, env: Environment) -> (Self, Handles) {
        let (probing, reports) = probing::Probing::new(prober);
        let (snapshot, snapshot_rx) = snapshot::SnapshotCache::new();
        let (events, events_log) = event_log::Events::new();
        let agent = Self {
            publishing: publishing::Publishing::new(dp.max_backends()),
            dp,
            env,
            services: Vec::new(),
            probing,
            macs: macs::Macs::new(neighbours),
            persistence: Default::default(),
            events,
            faults: Default::default(),
            announcement: Default::default(),
            cluster: None,
            discovery: Default::default(),
            deadlines: Default::default(),
            snapshot,
        };
        (
            agent,
            Handles {
                reports,
                snapshot: snapshot_rx,
                events: events_log,
            },
        )
    }

    /// Takes over what a previous run published (pinned maps); call before the first
    /// `apply_config`. Servers that were carrying traffic start as after a reload of a
    /// server that was up (`persistent` essential probes skipped), so a restart does not
    /// take them out of traffic; the others must pass their probes again.
    pub fn adopt(&mut self, state: &crate::dataplane::PublishedState) {
        self.publishing.adopt(state);
    }

    /// The key probe reports for a server must carry (its current incarnation), for
    /// callers that feed verdicts themselves (benchmarks, tests).
    pub fn server_key(&self, service: &str, addr: SocketAddr) -> Option<ServerKey> {
        let svc = self.services.iter().find(|s| s.cfg.name == service)?;
        let server = svc.servers.get(&addr)?;
        Some(ServerKey {
            service: server.incarnation,
            addr,
        })
    }

    pub fn dataplane(&self) -> &D {
        &self.dp
    }

    pub fn dataplane_mut(&mut self) -> &mut D {
        &mut self.dp
    }

    /// Records the XDP mode shown in status (known once the program is attached).
    pub fn set_xdp_mode(&mut self, mode: &str) {
        self.env.xdp_mode = mode.to_string();
        self.snapshot.changed();
    }

    /// Keeps runtime admin state in `path` from now on, starting from `state` (what a
    /// previous run saved); the next `apply_config` re-applies it and logs what it
    /// restored and dropped. Call before the first `apply_config`.
    /// Passive ejections are kept next to it (`<path>.passive`): the previous run's are
    /// restored by that `apply_config` too.
    pub fn keep_admin_state(&mut self, path: Option<std::path::PathBuf>, state: AdminState) {
        self.persistence.keep(path, state);
    }

    /// The runtime admin state as it stands (what the state file holds).
    pub fn admin_state(&self) -> &AdminState {
        self.persistence.admin_state()
    }

    /// What the last publish did: how many services it was given, what it wrote.
    pub fn last_publish(&self) -> crate::publish::PublishReport {
        self.publishing.last_publish()
    }

    /// What the last recompute did with membership: updated for the changed servers or
    /// computed over every server, and how many server inputs it read.
    pub fn last_membership(&self) -> MembershipWork {
        self.publishing.last_membership()
    }

    /// The propagation histogram (verdict to maps written).
    pub fn propagation(&self) -> &Histogram {
        self.publishing.propagation()
    }
}
