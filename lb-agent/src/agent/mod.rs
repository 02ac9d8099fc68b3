//! The agent's brain: turns configuration, probe results, passive signals and admin
//! changes into server states, membership (spares, backup levels, cap, fail-open) and
//! data-plane writes, and keeps the operator's snapshot current.
//!
//! Everything here runs on one task and owns all state; probe tasks only send reports,
//! the API only sends requests. Time is `tokio::time`, so tests run under paused time
//! against [`crate::dataplane::memory::MemoryDataplane`]. The loop that drives it
//! (`select!` over reports, ticks, admin and snapshot requests, signals) is
//! [`crate::event_loop`], which `lb-agent run` and the `agent_*` tests both run.
//!
//! This file holds the [`Agent`] struct, its runtime service (`ServiceRt`) and
//! construction; each room below adds the methods of one concern on the same struct:
//!
//! | room | does | state it writes |
//! |------|------|-----------------|
//! | `apply_config.rs` | applies a config: services and servers matched, servers started | `services`, `admin_state` (re-applied) |
//! | `reports.rs` | probe reports, passive events, backend counters into health | servers' `health`, `passive`, `local_faults`, `traffic_*` |
//! | `recompute.rs` | marked services: membership, then the publish | `outcome`, `last_membership`, `last_publish`, `publish_retry`, `propagation` |
//! | `desired.rs` | the data-plane view of a service (pure) | — |
//! | `admin.rs` | runtime admin requests | servers' `admin`/weight/spare, `admin_state` |
//! | `deadlines.rs` | what is due next, and the tick that runs it | `deadline_cache` |
//! | `departing.rs` | servers removed from the config keep their flows until idle | services' `departing` |
//! | `macs.rs` | backend MAC resolution | `macs`, `unknown_mac_count` |
//! | `announcing.rs` | VIP announcement and node drain | `announcer` |
//! | `event_log.rs` | transitions, notes and announcement changes into the log | `pending_events`, `events`, `transitions` |
//! | `snapshot_schedule.rs` | when the snapshot is rebuilt | `snapshot_dirty`/`_built`/`_cost`/`_forced`/`_builds` |
//! | `snapshot.rs`, `snapshot_readers.rs` | builds the snapshot; answers who waits for it | `snapshot_records`, `fingerprints`, `snapshot_readers` |
//! | `resolve.rs` | DNS re-resolution of `resolve = true` servers | `discovery` |
//!
//! The publisher ([`crate::publish::Publisher`], field `publisher`) owns what was written
//! to the maps (ids, tables); the dataplane handle (`dp`) owns the maps themselves.

mod admin;
mod admin_state;
mod announcing;
mod apply_config;
mod deadlines;
mod departing;
mod desired;
mod durable;
mod event_log;
mod local_faults;
mod macs;
mod neighbors;
mod ordered_join;
mod passive_kept;
mod probe_durations;
mod publish_retry;
mod recompute;
mod report_routes;
mod reports;
mod resolve;
mod server;
mod server_table;
mod snapshot;
mod snapshot_readers;
mod snapshot_schedule;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use tokio::{
    sync::{Mutex, mpsc, watch},
    time::Instant,
};

pub use admin_state::{AdminState, ApplyReport, StateFileError};
pub use neighbors::{KernelNeighbors, Neighbors, StaticNeighbors};
pub use publish_retry::{FIRST_RETRY, LAST_RETRY};
use report_routes::{Lookup, ReportRoutes};
use server::{Configured, ServerRt};
use server_table::ServerTable;
pub use snapshot_schedule::{SNAPSHOT_DUTY, SNAPSHOT_EVERY, snapshot_interval};

use crate::{
    api::{EventLog, SnapshotRequest},
    config::ServiceConfig,
    dataplane::Dataplane,
    membership::{Outcome, Policy, ServiceMembership},
    probe::{ProbeReport, Prober, ServerKey},
    publish::Publisher,
    status::{Event, Histogram, Snapshot},
};

/// Capacity of the probe-report channel.
const REPORTS: usize = 4096;

/// A virtual service at runtime.
struct ServiceRt {
    cfg: ServiceConfig,
    membership: ServiceMembership,
    servers: ServerTable,
    outcome: Option<Outcome>,
    /// Servers removed from the configuration whose established flows may still run.
    departing: BTreeMap<SocketAddr, departing::Departing>,
    /// Probe runs of this service without a verdict because of a local fault.
    local_faults: local_faults::LocalFaults,
    /// Something only this service's membership depends on changed (a verdict, a due
    /// recheck, an admin patch): [`Agent::recompute_marked`] recomputes it.
    marked: bool,
    /// Marked for something other than health verdicts (a due recheck, an admin patch,
    /// a departing backend's end, a reload): membership over every server.
    marked_whole: bool,
    /// Servers whose health changed since the last recompute: when they are all that
    /// changed, membership and the publish are updated for them alone.
    changed_health: Vec<SocketAddr>,
    /// Probe durations over all servers, by probe (`/metrics`).
    probe_durations: probe_durations::ProbeDurations,
}

impl ServiceRt {
    /// Something else than a verdict changed: the next recompute takes every server.
    fn mark(&mut self) {
        self.marked = true;
        self.marked_whole = true;
    }

    /// `addr`'s health changed.
    fn mark_server(&mut self, addr: SocketAddr) {
        self.marked = true;
        self.changed_health.push(addr);
    }

    /// Recomputed: nothing is pending.
    fn unmark(&mut self) {
        self.marked = false;
        self.marked_whole = false;
        self.changed_health.clear();
    }

    fn policy(&self) -> Policy {
        Policy {
            backup_switch: self.cfg.backup_switch,
            max_unhealthy_percent: self.cfg.max_unhealthy_percent,
            fail_open: self.cfg.fail_open,
        }
    }

    /// Membership updated for the servers whose health changed alone, when that is all
    /// that changed and no whole-service decision moves (`ServiceMembership::update`):
    /// the indices of the servers whose role changed. `None`: compute over every server.
    fn update_membership(&mut self, now: Instant, work: &mut MembershipWork) -> Option<Vec<usize>> {
        if self.marked_whole || self.changed_health.is_empty() {
            return None;
        }
        let policy = self.policy();
        let outcome = self.outcome.as_mut()?;
        self.changed_health.sort_unstable();
        self.changed_health.dedup();
        let inputs = self
            .changed_health
            .iter()
            .map(|a| self.servers.get(a).map(ServerRt::member_input))
            .collect::<Option<Vec<_>>>()?;
        work.inputs += inputs.len();
        let moved = self.membership.update(&inputs, &policy, now, outcome)?;
        work.updated += 1;
        Some(moved)
    }
}

/// What the last recompute did with membership (tests and benchmarks check its scope).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MembershipWork {
    /// Services whose membership was updated for their changed servers alone.
    pub updated: usize,
    /// Services whose membership was computed over every server.
    pub computed: usize,
    /// Server inputs read: the changed servers of an update, every server of a
    /// computation.
    pub inputs: usize,
}

/// What the agent is running on (shown in status).
#[derive(Clone, Debug, Default)]
pub struct Environment {
    pub interface: String,
    pub xdp_mode: String,
    /// The tables' sizes as loaded.
    pub tables: crate::status::TablesStatus,
}

/// The agent.
pub struct Agent<D: Dataplane, P: Prober, N: Neighbors> {
    dp: D,
    prober: Arc<P>,
    neighbors: Arc<N>,
    env: Environment,
    services: Vec<ServiceRt>,
    /// Report keys of the server incarnations and where their servers are
    /// (`report_routes.rs`; `ServerKey::service`).
    report_routes: std::cell::RefCell<ReportRoutes>,
    /// Transitions not yet in the shared log (an API reader held it).
    pending_events: Vec<Event>,
    publisher: Publisher,
    macs: HashMap<IpAddr, [u8; 6]>,
    reports_tx: mpsc::Sender<ProbeReport>,
    snapshot_tx: watch::Sender<Arc<Snapshot>>,
    events: EventLog,
    propagation: Histogram,
    /// What the last publish did (tests and benchmarks check its scope).
    last_publish: crate::publish::ApplyReport,
    /// What the last recompute did with membership.
    last_membership: MembershipWork,
    /// Services whose publish failed, retried on a spaced schedule (a failed full
    /// publish is retried full: only a full publish removes what the configuration no
    /// longer has).
    publish_retry: publish_retry::PublishRetry,
    transitions: u64,
    passive: BTreeMap<String, u64>,
    /// Probes that could not run for a local reason (never held against a server).
    local_faults: local_faults::LocalFaults,
    /// State changed since the last snapshot (built off the verdict path).
    snapshot_dirty: bool,
    /// When the snapshot was last built (rebuilds are at most every `snapshot_interval`).
    snapshot_built: Option<Instant>,
    /// What the last rebuild cost (wall time).
    snapshot_cost: std::time::Duration,
    /// An admin change since the last snapshot: the next read rebuilds at once (the
    /// caller's next GET must see its change).
    snapshot_forced: bool,
    /// Readers waiting for a rebuild (`snapshot_readers.rs`).
    snapshot_readers: Vec<SnapshotRequest>,
    /// Snapshots built so far.
    snapshot_builds: u64,
    /// Backend addresses whose MAC is unknown, as of the last resolution round.
    unknown_mac_count: usize,
    /// DNS answers of `resolve = true` servers and their re-resolution (`resolve.rs`).
    discovery: crate::discovery::Discovery,
    /// [`Agent::next_deadline`] as last computed; `None` when stale. A deadline can only
    /// move earlier through a transition (`unavailable` sets its expiry) or a membership
    /// computation (`recheck_at`), so `record_names` and `recompute` clear it; the run
    /// loop asks every turn, and a scan of every server each time was O(servers).
    deadline_cache: std::cell::Cell<Option<Option<Instant>>>,
    /// Runtime admin changes, re-applied at every `apply_config` (`admin_state.rs`).
    admin_state: AdminState,
    /// Where `admin_state` is saved; `None`: not kept across restarts.
    state_file: Option<std::path::PathBuf>,
    /// Passive ejections kept across restarts, next to `state_file` (`passive_kept.rs`).
    passive_kept: passive_kept::PassiveKept,
    /// VIP announcement to the routers (`crate::announce`).
    announcer: crate::announce::Announcer,
    /// Table fingerprints by service, with the table version they were computed for.
    fingerprints: std::cell::RefCell<HashMap<String, (u64, String)>>,
    /// Server status records kept between snapshot builds (`snapshot.rs`).
    snapshot_records: std::cell::RefCell<snapshot::Records>,
    /// Packets seen on every backend so far, and when that total last moved (drain).
    traffic_total: u64,
    traffic_moved: Option<Instant>,
}

/// Channels the caller drives the agent with.
pub struct Handles {
    /// Probe results: feed each to [`Agent::on_probe_report`].
    pub reports: mpsc::Receiver<ProbeReport>,
    pub snapshot: watch::Receiver<Arc<Snapshot>>,
    pub events: EventLog,
}
impl<D: Dataplane, P: Prober, N: Neighbors> Agent<D, P, N> {
    pub fn new(dp: D, prober: Arc<P>, neighbors: Arc<N>, env: Environment) -> (Self, Handles) {
        let (reports_tx, reports) = mpsc::channel(REPORTS);
        let (snapshot_tx, snapshot) = watch::channel(Arc::new(Snapshot::default()));
        let events: EventLog = Arc::new(Mutex::new(VecDeque::new()));
        let agent = Self {
            publisher: Publisher::with_max_backends(dp.max_backends()),
            dp,
            prober,
            neighbors,
            env,
            services: Vec::new(),
            report_routes: Default::default(),
            pending_events: Vec::new(),
            macs: HashMap::new(),
            reports_tx,
            snapshot_tx,
            events: events.clone(),
            propagation: Histogram::default(),
            last_publish: Default::default(),
            last_membership: Default::default(),
            publish_retry: Default::default(),
            transitions: 0,
            passive: BTreeMap::new(),
            local_faults: Default::default(),
            snapshot_dirty: true,
            snapshot_built: None,
            snapshot_cost: std::time::Duration::ZERO,
            snapshot_forced: false,
            snapshot_readers: Vec::new(),
            snapshot_builds: 0,
            unknown_mac_count: 0,
            discovery: Default::default(),
            deadline_cache: Default::default(),
            admin_state: AdminState::default(),
            state_file: None,
            passive_kept: Default::default(),
            announcer: Default::default(),
            fingerprints: Default::default(),
            snapshot_records: Default::default(),
            traffic_total: 0,
            traffic_moved: None,
        };
        (
            agent,
            Handles {
                reports,
                snapshot,
                events,
            },
        )
    }

    /// Takes over what a previous run published (pinned maps); call before the first
    /// `apply_config`. Servers that were carrying traffic start as after a reload of a
    /// server that was up (`persistent` essential probes skipped), so a restart does not
    /// take them out of traffic; the others must pass their probes again.
    pub fn adopt(&mut self, state: &crate::dataplane::PublishedState) {
        self.publisher.adopt(state);
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
        self.snapshot_dirty = true;
    }

    /// Keeps runtime admin state in `path` from now on, starting from `state` (what a
    /// previous run saved); the next `apply_config` re-applies it and logs what it
    /// restored and dropped. Call before the first `apply_config`.
    /// Passive ejections are kept next to it (`<path>.passive`): the previous run's are
    /// restored by that `apply_config` too.
    pub fn keep_admin_state(&mut self, path: Option<std::path::PathBuf>, state: AdminState) {
        self.passive_kept = passive_kept::PassiveKept::open(path.as_deref());
        self.state_file = path;
        self.admin_state = state;
    }

    /// The runtime admin state as it stands (what the state file holds).
    pub fn admin_state(&self) -> &AdminState {
        &self.admin_state
    }

    /// What the last publish did: how many services it was given, what it wrote.
    pub fn last_publish(&self) -> crate::publish::ApplyReport {
        self.last_publish
    }

    /// What the last recompute did with membership: updated for the changed servers or
    /// computed over every server, and how many server inputs it read.
    pub fn last_membership(&self) -> MembershipWork {
        self.last_membership
    }

    /// The propagation histogram (verdict to maps written).
    pub fn propagation(&self) -> &Histogram {
        &self.propagation
    }
}
