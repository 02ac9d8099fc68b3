//! The agent's brain: turns configuration, probe results, passive signals and admin
//! changes into server states, membership (spares, backup levels, cap, fail-open) and
//! data-plane writes, and keeps the operator's snapshot current.
//!
//! Everything here runs on one task and owns all state; probe tasks only send reports,
//! the API only sends requests. Time is `tokio::time`, so tests run under paused time
//! against [`crate::dataplane::memory::MemoryDataplane`].

mod admin_state;
mod departing;
mod durable;
mod local_faults;
mod neighbors;
mod ordered_join;
mod passive_kept;
mod probe_durations;
mod publish_retry;
mod report_routes;
mod resolve;
mod server;
mod server_table;
mod snapshot;
mod snapshot_readers;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::SystemTime,
};

use lb_common::{IPPROTO_TCP, IPPROTO_UDP, events::PassiveEvent, events::event_name};
use tokio::{
    sync::{Mutex, mpsc, watch},
    time::Instant,
};
use tracing::{info, warn};

pub use admin_state::{AdminState, ApplyReport, StateFileError};
pub use neighbors::{KernelNeighbors, Neighbors, StaticNeighbors};
pub use publish_retry::{FIRST_RETRY, LAST_RETRY};
use report_routes::{Lookup, ReportRoutes};
use server::{Configured, ServerRt};
use server_table::ServerTable;

use crate::{
    api::{AdminChange, AdminError, AdminRequest, EVENT_LOG_LEN, EventLog, SnapshotRequest},
    config::{Config, Forwarding, Protocol, ServiceConfig},
    dataplane::Dataplane,
    health::{PassivePolicy, ServerHealth, StartState, Transition},
    membership::{Admin, Outcome, Policy, ServiceMembership},
    probe::{PROMPT_SPREAD, ProbeReport, Prober, ServerKey, SharedSignals, spawn_spread},
    publish::{DesiredBackend, DesiredService, NatSpec, PublishError, Publisher, Tunnel},
    status::{Event, Histogram, Snapshot},
};

/// Capacity of the probe-report channel.
const REPORTS: usize = 4096;
/// MAC lookups in flight at once.
const MAC_LOOKUPS: usize = 32;
/// Shortest time between two snapshot rebuilds (a rebuild walks every server).
pub const SNAPSHOT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);
/// Deferred and periodic snapshot rebuilds are spaced by at least this many times the
/// last rebuild's cost, so they take at most 1/SNAPSHOT_DUTY of the agent's thread however
/// many servers there are (a rebuild is linear in them: ~14 ms at 10,000, ~0.6 s at
/// 100,000 on a loaded machine, which rebuilt every 100 ms would starve the loop).
pub const SNAPSHOT_DUTY: u32 = 10;

/// Shortest time between two deferred or periodic snapshot rebuilds, given what the last
/// one cost: [`SNAPSHOT_EVERY`], or [`SNAPSHOT_DUTY`] times the cost if that is longer.
pub fn snapshot_interval(last_cost: std::time::Duration) -> std::time::Duration {
    SNAPSHOT_EVERY.max(last_cost.saturating_mul(SNAPSHOT_DUTY))
}

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

    /// Starts announcing VIPs through `routes` (call once the XDP program is attached,
    /// so a VIP never attracts traffic before the node can forward it). Routes already
    /// there stay (a restart withdraws nothing); `drain_file` keeps the node's drain
    /// across restarts (docs/multi-node.md).
    pub fn start_announcing(
        &mut self,
        routes: Box<dyn crate::announce::VipRoutes + Send>,
        drain_file: Option<std::path::PathBuf>,
    ) {
        self.announcer.start(routes, drain_file);
        self.announce();
        self.snapshot_dirty = true;
    }

    /// Restarts the lifetime of the announced VIP addresses (the dead-man switch: see
    /// [`crate::announce::Announcer::refresh`]).
    pub fn refresh_announcements(&mut self) {
        self.announcer.refresh();
        self.snapshot_dirty = true;
    }

    /// Drains (withdraws every VIP, keeps forwarding what still arrives) or undrains the
    /// node; the next snapshot shows it.
    pub fn set_node_drained(&mut self, drained: bool) -> Result<(), AdminError> {
        if !self.announcer.is_on() {
            return Err(AdminError::Invalid(
                "announcing is off: set `announce_interface` in [agent]".into(),
            ));
        }
        let changes = self.announcer.set_drained(drained).map_err(|e| {
            AdminError::Invalid(format!("keeping the node's drain state failed: {e}"))
        })?;
        self.log_announcements(changes);
        self.record_note(
            "-",
            if drained {
                "node drained"
            } else {
                "node undrained"
            },
        );
        self.snapshot_changed_by_admin();
        Ok(())
    }

    /// Records the routing daemon's sessions as last read (status only).
    pub fn set_bgp_sessions(&mut self, sessions: crate::announce::bird::Sessions) {
        self.announcer.set_bgp(Some(sessions));
        self.snapshot_dirty = true;
    }

    /// Re-decides every VIP's announcement from the services' last membership.
    fn announce(&mut self) {
        let input = self
            .services
            .iter()
            .map(|svc| {
                let serve = match &svc.outcome {
                    Some(o) if o.fail_open => crate::announce::Serve::FailOpen,
                    Some(o)
                        if o.roles.iter().any(|&(addr, role)| {
                            role == crate::publish::Role::Active
                                && self.macs.contains_key(&addr.ip())
                        }) =>
                    {
                        crate::announce::Serve::Serving
                    }
                    _ => crate::announce::Serve::Nothing,
                };
                (svc.cfg.vip.ip(), serve)
            })
            .collect();
        let changes = self.announcer.update(input);
        self.log_announcements(changes);
    }

    fn log_announcements(&mut self, changes: Vec<crate::announce::Change>) {
        for c in changes {
            let to = if c.announced {
                "announced"
            } else {
                "withdrawn"
            };
            self.log_event("-", &c.vip.to_string(), "-", to, c.reason);
        }
    }

    /// The runtime admin state as it stands (what the state file holds).
    pub fn admin_state(&self) -> &AdminState {
        &self.admin_state
    }

    /// Applies a (new or reloaded) configuration: services and servers are matched by
    /// name and address; kept servers keep their health unless their probes changed
    /// (then they restart as after a reload: `persistent` probes skipped if they were
    /// up). Runtime admin changes (drain, down, weight, spare, servers added at runtime)
    /// are re-applied on top of the file (docs/admin-state.md); the returned report says
    /// what was re-applied and what was dropped (and is logged).
    pub async fn apply_config(&mut self, cfg: &Config) -> Result<(), PublishError> {
        self.apply_config_reporting(cfg).await.map(drop)
    }

    /// [`Agent::apply_config`], returning what happened to the runtime admin state.
    pub async fn apply_config_reporting(
        &mut self,
        cfg: &Config,
    ) -> Result<ApplyReport, PublishError> {
        let mut admin_report = ApplyReport::default();
        let now = Instant::now();
        let mut old: HashMap<String, ServiceRt> = self
            .services
            .drain(..)
            .map(|s| (s.cfg.name.clone(), s))
            .collect();
        for svc_cfg in &cfg.services {
            let addrs =
                expand_servers(svc_cfg, self.discovery.with_resolver(cfg.agent.resolver)).await;
            let mut rt = match old.remove(&svc_cfg.name) {
                Some(mut prev) => {
                    let probes_changed = prev.cfg.probes != svc_cfg.probes
                        || prev.cfg.max_fails != svc_cfg.max_fails
                        || prev.cfg.fail_timeout != svc_cfg.fail_timeout;
                    let mut servers = Vec::with_capacity(addrs.len());
                    for (addr, conf) in addrs {
                        let server = match prev.servers.remove(&addr) {
                            Some(mut s) if !probes_changed && !rechecked(svc_cfg, &s) => {
                                s.weight = conf.weight;
                                s.spare = conf.spare;
                                s.backup = conf.backup;
                                s.configured = Some(conf);
                                s
                            }
                            Some(s) => {
                                let start = restart_state(&s);
                                let mut fresh = self.new_server(svc_cfg, addr, conf, start, now);
                                fresh.admin = s.admin;
                                fresh
                            }
                            // Added to a running service: held back until every probe passes.
                            None => self.new_server(svc_cfg, addr, conf, StartState::Added, now),
                        };
                        servers.push((addr, server));
                    }
                    for (addr, s) in std::mem::take(&mut prev.servers) {
                        // Added at runtime: kept, with its health (`admin_state.rs`).
                        if s.configured.is_none() && self.admin_state.is_added(&svc_cfg.name, addr)
                        {
                            let kept = if probes_changed || rechecked(svc_cfg, &s) {
                                let conf = Configured {
                                    weight: s.weight,
                                    spare: s.spare,
                                    backup: s.backup,
                                };
                                let start = restart_state(&s);
                                let mut fresh = self.new_server(svc_cfg, addr, conf, start, now);
                                fresh.configured = None;
                                fresh
                            } else {
                                s
                            };
                            servers.push((addr, kept));
                        } else {
                            info!(service = svc_cfg.name, server = %addr, "server removed by reload");
                        }
                    }
                    prev.servers = servers.into_iter().collect();
                    prev.cfg = svc_cfg.clone();
                    prev
                }
                None => {
                    let proto = match svc_cfg.protocol {
                        Protocol::Tcp => IPPROTO_TCP,
                        Protocol::Udp => IPPROTO_UDP,
                    };
                    let servers = addrs
                        .into_iter()
                        .map(|(addr, conf)| {
                            let start = match self.publisher.adopted_live(svc_cfg.vip, proto, addr)
                            {
                                Some(true) => StartState::ReloadedWasUp,
                                Some(false) => StartState::ReloadedWasDown,
                                None => StartState::New,
                            };
                            (addr, self.new_server(svc_cfg, addr, conf, start, now))
                        })
                        .collect();
                    ServiceRt {
                        cfg: svc_cfg.clone(),
                        membership: ServiceMembership::new(),
                        servers,
                        outcome: None,
                        departing: BTreeMap::new(),
                        local_faults: Default::default(),
                        marked: false,
                        marked_whole: false,
                        changed_health: Vec::new(),
                        probe_durations: Default::default(),
                    }
                }
            };
            let mut admin_state = std::mem::take(&mut self.admin_state);
            admin_state.apply(
                svc_cfg,
                &mut rt.servers,
                |addr, conf| {
                    // Restored after a restart: like a configured server, it keeps
                    // traffic if the previous run's pinned state had it live.
                    let proto = svc_cfg.protocol.ip_proto();
                    let start = match self.publisher.adopted_live(svc_cfg.vip, proto, addr) {
                        Some(true) => StartState::ReloadedWasUp,
                        Some(false) => StartState::ReloadedWasDown,
                        None => StartState::New,
                    };
                    self.new_server(svc_cfg, addr, conf, start, now)
                },
                &mut admin_report,
            );
            self.admin_state = admin_state;
            rt.outcome = None;
            self.services.push(rt);
        }
        self.place_routes();
        self.admin_state.keep_services(
            cfg.services.iter().map(|s| s.name.as_str()),
            &mut admin_report,
        );
        admin_report.log();
        self.passive_kept.restored_all();
        if !admin_report.dropped.is_empty() {
            self.admin_state.save_logged(self.state_file.as_deref());
        }
        self.sync_departing(now);
        self.refresh_macs().await;
        self.recompute(now, std::time::Instant::now())?;
        self.publish_snapshot();
        Ok(admin_report)
    }

    fn new_server(
        &self,
        svc: &ServiceConfig,
        addr: SocketAddr,
        conf: Configured,
        start: StartState,
        now: Instant,
    ) -> ServerRt {
        // A spare takes traffic only once every probe has passed (Angie), also at start.
        let start = if start == StartState::New && conf.spare && conf.backup == 0 {
            StartState::NewSpare
        } else {
            start
        };
        let mut health = ServerHealth::new(&svc.probes, PassivePolicy::of(svc), start, now);
        self.passive_kept.restore(&svc.name, addr, &mut health, now);
        let signals = Arc::new(SharedSignals::new(health.usable()));
        let incarnation = self.report_routes.borrow_mut().allocate();
        let key = ServerKey {
            service: incarnation,
            addr,
        };
        // Out of traffic until its probes pass although the pool wants it (added at
        // runtime, or in traffic before and checked again): first probes come promptly.
        let waiting = start == StartState::Added
            || (start == StartState::ReloadedWasUp
                && health.state() == crate::health::HealthState::Checking);
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

    /// Resolves MACs not known yet (all of them concurrently).
    pub async fn refresh_macs(&mut self) {
        let wanted: Vec<IpAddr> = self.unknown_macs();
        let mut jobs = tokio::task::JoinSet::new();
        // Bounded: each kernel lookup may spawn `ip` and wait up to its timeout.
        let slots = Arc::new(tokio::sync::Semaphore::new(MAC_LOOKUPS));
        for ip in wanted {
            let n = self.neighbors.clone();
            let slots = slots.clone();
            jobs.spawn(async move {
                let _slot = slots.acquire_owned().await;
                (ip, n.resolve(ip).await)
            });
        }
        while let Some(done) = jobs.join_next().await {
            match done {
                Ok((ip, Ok(mac))) => {
                    self.macs.insert(ip, mac);
                }
                Ok((ip, Err(err))) => {
                    warn!(backend = %ip, error = %err, "backend MAC unknown: not selectable until resolved")
                }
                Err(err) => warn!(error = %err, "MAC resolution task failed"),
            }
        }
        self.unknown_mac_count = self.unknown_macs().len();
        self.neighbors.follow(self.server_ips());
    }

    /// [`Agent::refresh_macs`] after a server at `ip` was added: when every other MAC is
    /// known (`unknown_mac_count` is 0; the set of unknown MACs only grows by added
    /// servers), `ip`'s is the only one to resolve, without a pass over every server.
    async fn refresh_macs_after_add(&mut self, ip: IpAddr) {
        if self.unknown_mac_count > 0 {
            return self.refresh_macs().await;
        }
        self.neighbors.follow_one(ip);
        if self.macs.contains_key(&ip) {
            return;
        }
        // Bounded like `refresh_macs`: one lookup.
        match self.neighbors.resolve(ip).await {
            Ok(mac) => {
                self.macs.insert(ip, mac);
            }
            Err(err) => {
                warn!(backend = %ip, error = %err, "backend MAC unknown: not selectable until resolved");
                self.unknown_mac_count = 1;
            }
        }
    }

    fn unknown_macs(&self) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = self
            .services
            .iter()
            .flat_map(|s| s.servers.keys().map(SocketAddr::ip))
            .filter(|ip| !self.macs.contains_key(ip))
            .collect();
        ips.sort();
        ips.dedup();
        ips
    }

    /// Whether some backend MAC is still unknown (the caller retries periodically).
    /// Cached: the run loop asks on every turn.
    pub fn has_unknown_macs(&self) -> bool {
        self.unknown_mac_count > 0
    }

    /// Re-resolves unknown MACs and republishes if any were found.
    pub async fn retry_macs(&mut self) -> Result<(), PublishError> {
        let before = self.macs.len();
        self.refresh_macs().await;
        if self.macs.len() != before {
            self.recompute(Instant::now(), std::time::Instant::now())?;
        }
        Ok(())
    }

    /// A probe finished.
    pub fn on_probe_report(&mut self, report: ProbeReport) -> Result<(), PublishError> {
        self.on_probe_reports([report])
    }

    /// Several probe results at once (what the report channel held): every transition
    /// is recorded, and membership is recomputed and published once for all of them, so
    /// a storm of verdicts (a rack going down) costs one publish, not one per server.
    pub fn on_probe_reports(
        &mut self,
        reports: impl IntoIterator<Item = ProbeReport>,
    ) -> Result<(), PublishError> {
        let mut earliest: Option<Instant> = None;
        let mut latest: Option<Instant> = None;
        let mut records = Vec::new();
        for report in reports {
            let Some((si, index)) = self.route_report(report.server) else {
                continue; // a report of probes replaced or removed since
            };
            let svc = &mut self.services[si];
            let Some(server) = svc.servers.at_mut(index) else {
                continue;
            };
            if !report.outcome.local {
                svc.probe_durations.observe(
                    &svc.cfg.probes,
                    report.probe,
                    report.outcome.duration.as_secs_f64(),
                );
            }
            if report.outcome.local {
                svc.local_faults.note(&report.outcome.detail, report.at);
                self.local_faults.record(
                    &svc.cfg.name,
                    &server.addr.to_string(),
                    &report.outcome.detail,
                    report.at,
                );
                self.snapshot_dirty = true;
            }
            if let Some(t) = server
                .health
                .on_probe(report.probe, &report.outcome, report.at)
            {
                server.signals.set_healthy(server.health.usable());
                records.push((svc.cfg.name.clone(), server.addr.to_string(), t));
                let addr = server.addr;
                svc.mark_server(addr);
                earliest = Some(earliest.map_or(report.at, |e| e.min(report.at)));
                latest = Some(latest.map_or(report.at, |l| l.max(report.at)));
            }
        }
        for (service, server, t) in &records {
            self.record(service, server, t);
        }
        if let (Some(earliest), Some(latest)) = (earliest, latest) {
            // Propagation counts from the (earliest) verdict, including its wait in the
            // report channel.
            let started = std::time::Instant::now()
                .checked_sub(earliest.elapsed())
                .unwrap_or_else(std::time::Instant::now);
            self.recompute_marked(latest, started)?;
        }
        Ok(())
    }

    /// Where the server `key` reports for is (service index, position in its table);
    /// `None` for a report of an incarnation that is gone. Routes are placed again, once,
    /// when a server was added or removed since they were (`report_routes.rs`).
    fn route_report(&mut self, key: ServerKey) -> Option<(usize, usize)> {
        let found = |agent: &Self| match agent.report_routes.borrow().lookup(key.service) {
            Lookup::At(si, index) => agent
                .services
                .get(si)
                .and_then(|s| s.servers.at(index))
                .filter(|s| s.incarnation == key.service && s.addr == key.addr)
                .map(|_| (si, index)),
            Lookup::Stale | Lookup::Unplaced => None,
        };
        if let Some(at) = found(self) {
            return Some(at);
        }
        let routes = self.report_routes.get_mut();
        if routes.lookup(key.service) == Lookup::Stale
            || routes.placed_at(server_table::layout_epoch())
        {
            return None;
        }
        self.place_routes();
        found(self)
    }

    /// Places every server's report route (after the services or their servers moved).
    fn place_routes(&mut self) {
        let epoch = server_table::layout_epoch();
        let servers = self.services.iter().enumerate().flat_map(|(si, svc)| {
            svc.servers
                .values()
                .enumerate()
                .map(move |(i, s)| (si, i, s.incarnation))
        });
        self.report_routes.get_mut().place(servers, epoch);
    }

    /// Passive failure signals from the data plane.
    pub fn on_passive_events(&mut self, events: &[PassiveEvent]) -> Result<(), PublishError> {
        let started = std::time::Instant::now();
        let now = Instant::now();
        self.snapshot_dirty = true;
        let mut changed = false;
        for e in events {
            *self
                .passive
                .entry(event_name(e.kind).to_string())
                .or_default() += 1;
            let Some((service, addr)) = self.publisher.backend_by_id(e.backend_id) else {
                continue;
            };
            let Some(si) = self.services.iter().position(|s| s.cfg.name == service) else {
                continue;
            };
            let Some(server) = self.services[si].servers.get_mut(&addr) else {
                continue;
            };
            if let Some(mut t) = server.health.on_passive_failure(now) {
                server.signals.set_healthy(server.health.usable());
                t.cause = format!("{} ({})", t.cause, event_name(e.kind));
                self.services[si].mark_server(addr);
                self.record(&service, &addr.to_string(), &t);
                changed = true;
            }
        }
        if changed {
            self.recompute_marked(now, started)?;
        }
        Ok(())
    }

    /// Reads per-backend counters: new successful connections reset passive failure
    /// counts, new packets feed `idle` probe mode.
    pub fn poll_stats(&mut self) {
        let now = Instant::now();
        // One read for every backend: one syscall per backend was most of this call's
        // time at thousands of backends.
        let Ok(all) = self
            .dp
            .backend_stats_below(self.publisher.backend_id_limit())
        else {
            return;
        };
        let total = all.iter().map(|s| s.packets).fold(0u64, u64::wrapping_add);
        if total != self.traffic_total || self.traffic_moved.is_none() {
            self.traffic_total = total;
            self.traffic_moved = Some(now);
        }
        for svc in &mut self.services {
            // Servers and published backends are both in address order: one pass, and a
            // server whose counters did not move costs one comparison.
            let ids = self.publisher.backend_ids_in_order(&svc.cfg.name);
            for (server, id) in ordered_join::join(svc.servers.iter_mut(), ids) {
                let Some(&stats) = id.and_then(|id| all.get(id as usize)) else {
                    continue;
                };
                if stats == server.last_stats {
                    continue;
                }
                let (ok, _) = server.absorb_stats(stats, now);
                if ok > 0 {
                    server.health.on_passive_success(now);
                }
            }
            let ids = self.publisher.backend_ids_in_order(&svc.cfg.name);
            for (d, id) in ordered_join::join(svc.departing.iter_mut(), ids) {
                if let Some(stats) = id.and_then(|id| all.get(id as usize)) {
                    d.saw_packets(stats.packets, now);
                }
            }
        }
    }

    /// Keeps `departing` in step with the servers: a published backend no longer among a
    /// service's servers starts departing; a departing address added again stops. Called
    /// where servers are added or removed (config, API, DNS), not per verdict.
    fn sync_departing(&mut self, now: Instant) {
        for svc in &mut self.services {
            let servers = &svc.servers;
            svc.departing.retain(|a, _| !servers.contains_key(a));
            for addr in self.publisher.backend_addrs(&svc.cfg.name) {
                if !svc.servers.contains_key(&addr) {
                    svc.departing
                        .entry(addr)
                        .or_insert_with(|| departing::Departing::new(now));
                }
            }
        }
        self.deadline_cache.set(None);
    }

    /// [`Agent::sync_departing`] for one address of one service, after an admin add or
    /// remove: only that address can start or stop departing, so the work is one lookup,
    /// not a walk over every service's published backends.
    fn sync_departing_server(&mut self, si: usize, addr: SocketAddr, now: Instant) {
        let svc = &mut self.services[si];
        let changed = if svc.servers.contains_key(&addr) {
            svc.departing.remove(&addr).is_some()
        } else if self.publisher.has_backend(&svc.cfg.name, &addr)
            && !svc.departing.contains_key(&addr)
        {
            svc.departing.insert(addr, departing::Departing::new(now));
            true
        } else {
            false
        };
        if changed {
            self.deadline_cache.set(None);
        }
    }

    /// The next instant something time-driven is due (health expiry, membership recheck).
    pub fn next_deadline(&self) -> Option<Instant> {
        if let Some(cached) = self.deadline_cache.get() {
            return cached;
        }
        let deadline = self.scan_deadlines();
        self.deadline_cache.set(Some(deadline));
        deadline
    }

    /// A deadline at `at` may have appeared (a server updated alone): the cached next
    /// deadline becomes at most `at`, without a scan of every server. A cached deadline
    /// that is early (one that went away) only costs an `on_tick` that finds nothing due,
    /// and that rescans.
    fn lower_deadline(&self, at: Option<Instant>) {
        if let (Some(at), Some(cached)) = (at, self.deadline_cache.get()) {
            self.deadline_cache
                .set(Some(Some(cached.map_or(at, |c| c.min(at)))));
        }
    }

    fn scan_deadlines(&self) -> Option<Instant> {
        self.services
            .iter()
            .flat_map(|s| {
                s.servers
                    .values()
                    .filter_map(|v| v.health.next_deadline())
                    .chain(s.outcome.as_ref().and_then(|o| o.recheck_at))
                    .chain(s.departing.values().map(departing::Departing::deadline))
            })
            .chain(self.publish_retry.due())
            .min()
    }

    /// Runs what is due at `now`.
    pub fn on_tick(&mut self, now: Instant) -> Result<(), PublishError> {
        let started = std::time::Instant::now();
        // A due deadline may end without a transition (an `unavailable` server waiting
        // for its probes' confirmation): the cached deadline must not stay in the past.
        self.deadline_cache.set(None);
        let mut changed = false;
        let mut records = Vec::new();
        for svc in &mut self.services {
            for server in svc.servers.values_mut() {
                if let Some(t) = server.health.tick(now) {
                    server.signals.set_healthy(server.health.usable());
                    records.push((svc.cfg.name.clone(), server.addr.to_string(), t));
                    svc.marked = true;
                    svc.changed_health.push(server.addr);
                }
            }
            if svc
                .outcome
                .as_ref()
                .and_then(|o| o.recheck_at)
                .is_some_and(|at| at <= now)
            {
                svc.mark();
            }
            let departing = svc.departing.len();
            svc.departing.retain(|_, d| d.deadline() > now);
            if svc.departing.len() != departing {
                svc.mark();
            }
            changed |= svc.marked;
        }
        changed |= self.publish_retry.due().is_some_and(|at| at <= now);
        for (s, a, t) in records {
            self.record(&s, &a, &t);
        }
        if changed {
            self.recompute_marked(now, started)?;
        }
        Ok(())
    }

    /// A runtime change from the API.
    pub async fn on_admin(&mut self, req: AdminRequest) {
        if let AdminChange::NodeDrain(drained) = req.change {
            let _ = req.reply.send(self.set_node_drained(drained));
            return;
        }
        let result = self.admin(&req.service, &req.address, req.change).await;
        // The caller's next GET must see its change: that read rebuilds the snapshot
        // (not this answer: at 10,000 servers a rebuild costs more than the change).
        if result.is_ok() {
            self.admin_state.save_logged(self.state_file.as_deref());
            self.snapshot_changed_by_admin();
        }
        let _ = req.reply.send(result);
    }

    async fn admin(
        &mut self,
        service: &str,
        address: &str,
        change: AdminChange,
    ) -> Result<(), AdminError> {
        let now = Instant::now();
        let started = std::time::Instant::now();
        let si = self
            .services
            .iter()
            .position(|s| s.cfg.name == service)
            .ok_or_else(|| AdminError::NoService(service.to_string()))?;
        let addr: SocketAddr = address
            .parse()
            .map_err(|_| AdminError::Invalid(format!("`{address}` is not an address:port")))?;
        let no_server = || AdminError::NoServer {
            service: service.to_string(),
            address: address.to_string(),
        };
        let invalid = |e: crate::config::ServerRuleError| AdminError::Invalid(e.0);
        let change_kind = match &change {
            AdminChange::Add(_) => ChangeKind::Add,
            _ => ChangeKind::Other,
        };
        let mut added_or_removed = None;
        match change {
            AdminChange::Patch(p) => {
                let server = self.services[si]
                    .servers
                    .get_mut(&addr)
                    .ok_or_else(no_server)?;
                if let Some(w) = p.weight {
                    crate::config::check_weight(w).map_err(invalid)?;
                }
                if let Some(spare) = p.spare {
                    crate::config::check_backup(server.backup, spare).map_err(invalid)?;
                }
                let before = server.state_name();
                if p.reset == Some(true) {
                    if let Some(file) = server.configured {
                        server.weight = file.weight;
                        server.spare = file.spare;
                    }
                    server.admin = Admin::Up;
                }
                if let Some(w) = p.weight {
                    server.weight = w;
                }
                if let Some(s) = p.spare {
                    server.spare = s;
                }
                match (p.down, p.drain) {
                    (Some(true), _) => server.admin = Admin::Down,
                    (Some(false), _) if server.admin == Admin::Down => server.admin = Admin::Up,
                    _ => {}
                }
                match p.drain {
                    Some(true) if server.admin != Admin::Down => server.admin = Admin::Drain,
                    Some(false) if server.admin == Admin::Drain => server.admin = Admin::Up,
                    _ => {}
                }
                let after = server.state_name();
                self.admin_state.record_patch(service, server, &p);
                if before != after {
                    let t = Transition {
                        from: server.health.state(),
                        to: server.health.state(),
                        cause: "admin".into(),
                    };
                    self.record_names(service, address, before, after, &t.cause);
                }
            }
            AdminChange::Add(new) => {
                if self.services[si].servers.contains_key(&new.address) {
                    return Err(AdminError::Invalid(format!(
                        "{} is already a server",
                        new.address
                    )));
                }
                // The config loader's rules (config::server_rules).
                crate::config::check_server(
                    &self.services[si].cfg,
                    new.address,
                    new.weight,
                    new.spare,
                    new.backup,
                )
                .map_err(invalid)?;
                let max = self.publisher.max_backends() as usize;
                if self.services.iter().map(|s| s.servers.len()).sum::<usize>() >= max {
                    return Err(AdminError::Invalid(format!(
                        "the data plane holds at most {max} servers over all services \
                         (`agent.max_backends`)"
                    )));
                }
                self.admin_state.record_add(service, &new);
                let cfg = self.services[si].cfg.clone();
                let conf = Configured {
                    weight: new.weight,
                    spare: new.spare, // with a backup level refused above (check_server)
                    backup: new.backup,
                };
                let mut server = self.new_server(&cfg, new.address, conf, StartState::Added, now);
                server.configured = None;
                self.services[si].servers.insert(new.address, server);
                added_or_removed = Some(new.address);
                self.record_names(service, address, "-", "added", "admin");
                self.refresh_macs_after_add(new.address.ip()).await;
            }
            AdminChange::NodeDrain(_) => {
                return Err(AdminError::Invalid(
                    "node drain is not a server change".into(),
                ));
            }
            AdminChange::Remove => {
                self.services[si]
                    .servers
                    .remove(&addr)
                    .ok_or_else(no_server)?;
                self.admin_state.record_remove(service, addr);
                added_or_removed = Some(addr);
                self.record_names(
                    service,
                    address,
                    "-",
                    "removed",
                    "admin (established flows kept until idle)",
                );
            }
        }
        // Only an added or removed address can start or stop departing (a patch moves none).
        if let Some(addr) = added_or_removed {
            self.sync_departing_server(si, addr, now);
        }
        // An added server may have brought MACs that other services' servers share.
        let published = if matches!(change_kind, ChangeKind::Add) {
            self.recompute(now, started)
        } else {
            // An operator's change is tried now, also on a service waiting for a retry.
            self.publish_retry.release(&self.services[si].cfg.name);
            self.services[si].mark();
            self.recompute_marked(now, started)
        };
        published.map_err(|e| AdminError::Invalid(format!("publishing failed: {e}")))
    }

    fn record(&mut self, service: &str, server: &str, t: &Transition) {
        self.record_names(service, server, t.from.as_str(), t.to.as_str(), &t.cause);
    }

    /// Logs a transition. The deadlines it may move are taken in by the recompute that
    /// follows every transition (`recompute_services`).
    fn record_names(&mut self, service: &str, server: &str, from: &str, to: &str, cause: &str) {
        self.transitions += 1;
        let unavailable = crate::health::HealthState::Unavailable.as_str();
        if from == unavailable || to == unavailable {
            self.passive_kept.mark();
        }
        info!(service, server, from, to, cause, "transition");
        self.log_event(service, server, from, to, cause);
    }

    /// A membership change (spare running, backup level, cap, fail-open): logged and in
    /// the event log, but not a server transition (`lb_transitions_total`).
    fn record_note(&mut self, service: &str, note: &str) {
        info!(service, note, "membership");
        self.log_event(service, "-", "-", "-", note);
    }

    fn log_event(&mut self, service: &str, server: &str, from: &str, to: &str, cause: &str) {
        let event = Event {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            service: service.to_string(),
            server: server.to_string(),
            from: from.to_string(),
            to: to.to_string(),
            cause: cause.to_string(),
        };
        self.pending_events.push(event);
        self.flush_events();
    }

    /// Moves pending events into the shared log unless a reader holds it right now.
    fn flush_events(&mut self) {
        if self.pending_events.is_empty() {
            return;
        }
        if let Ok(mut log) = self.events.try_lock() {
            for event in self.pending_events.drain(..) {
                if log.len() >= EVENT_LOG_LEN {
                    log.pop_front();
                }
                log.push_back(event);
            }
        }
    }

    /// Recomputes membership of every service and publishes what changed; `started` is
    /// when the event that triggered this was taken (propagation is measured from it).
    fn recompute(&mut self, now: Instant, started: std::time::Instant) -> Result<(), PublishError> {
        // Every service is tried now, including those waiting for a retry.
        self.publish_retry.take_all();
        for svc in &mut self.services {
            svc.mark();
        }
        self.recompute_services(now, started, true)
    }

    /// Recomputes and publishes only the [marked](ServiceRt::marked) services: a verdict
    /// about one server costs its service's membership, not every service's.
    fn recompute_marked(
        &mut self,
        now: Instant,
        started: std::time::Instant,
    ) -> Result<(), PublishError> {
        if let Some(due) = self.publish_retry.take_due(now) {
            if due.full {
                return self.recompute(now, started);
            }
            for svc in &mut self.services {
                if due.services.contains(&svc.cfg.name) {
                    svc.mark();
                }
            }
        }
        self.recompute_services(now, started, false)
    }

    /// `all`: every service is marked and the publisher also removes what is no longer
    /// wanted; otherwise the others stay as published.
    fn recompute_services(
        &mut self,
        now: Instant,
        started: std::time::Instant,
        all: bool,
    ) -> Result<(), PublishError> {
        if self.passive_kept.is_dirty() {
            let servers = self.services.iter().flat_map(|s| {
                s.servers.values().filter_map(|v| {
                    let until = v.health.unavailable_until()?;
                    Some((s.cfg.name.as_str(), v.addr, until))
                })
            });
            self.passive_kept.save(servers);
        }
        let mut desired = Vec::new();
        // The earliest deadline of the servers updated alone; a computation over every
        // server makes the cached next deadline stale.
        let mut updated_deadline: Option<Instant> = None;
        let mut computed = false;
        // Services whose verdicts changed only some roles: (service, changed backends).
        let mut partial = Vec::new();
        let mut notes = Vec::new();
        let mut recomputed = Vec::new();
        let mut work = MembershipWork::default();
        let retry = &self.publish_retry;
        for (si, svc) in self
            .services
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.marked)
        {
            if !all && retry.holds(&svc.cfg.name) {
                // Its publish failed: the retry recomputes it over every server (the
                // verdicts stay in its servers' health until then).
                svc.unmark();
                continue;
            }
            recomputed.push(si);
            if let Some(moved) = svc.update_membership(now, &mut work) {
                for a in &svc.changed_health {
                    let at = svc.servers.get(a).and_then(|s| s.health.next_deadline());
                    updated_deadline = match (updated_deadline, at) {
                        (Some(x), Some(y)) => Some(x.min(y)),
                        (x, y) => x.or(y),
                    };
                }
                svc.unmark();
                let outcome = svc.outcome.as_ref().expect("updated above");
                let backends: Vec<_> = moved
                    .iter()
                    .map(|&i| desired_backend(svc, outcome.roles[i], &self.macs))
                    .collect();
                if !backends.is_empty() {
                    partial.push((si, backends));
                }
                continue;
            }
            svc.unmark();
            computed = true;
            let inputs: Vec<_> = svc.servers.values().map(ServerRt::member_input).collect();
            work.inputs += inputs.len();
            work.computed += 1;
            let outcome = svc.membership.compute(&inputs, &svc.policy(), now);
            for change in &outcome.changes {
                notes.push((svc.cfg.name.clone(), change.clone()));
            }
            desired.push(desired_service(svc, &outcome, &self.macs));
            svc.outcome = Some(outcome);
        }
        for (service, note) in notes {
            self.record_note(&service, &note);
        }
        self.last_membership = work;
        if computed {
            self.deadline_cache.set(None);
        } else {
            self.lower_deadline(updated_deadline);
        }
        let applied = self.publish(desired, partial, all);
        let report = match applied {
            Ok(report) => report,
            Err(e) => {
                // Not published: the retry takes these services again, over every
                // server (membership already took the verdicts in), on its schedule.
                let names = recomputed
                    .into_iter()
                    .map(|si| self.services[si].cfg.name.clone());
                self.publish_retry.failed(names, all, now, e.to_string());
                self.deadline_cache.set(None);
                self.snapshot_dirty = true;
                return Err(e);
            }
        };
        self.publish_retry.succeeded();
        self.last_publish = report;
        // After the tables: a VIP is announced only once the node can forward it.
        self.announce();
        if report.tables_published + report.backends_written + report.services_written > 0 {
            self.propagation.observe(started.elapsed().as_secs_f64());
        }
        self.snapshot_dirty = true;
        Ok(())
    }

    /// Publishes the whole descriptions in `desired` (every service when `all`) and
    /// the changed backends in `partial`; a service whose changed backends are not
    /// enough for the publisher (`Publisher::apply_backends`) is described whole.
    fn publish(
        &mut self,
        mut desired: Vec<DesiredService>,
        partial: Vec<(usize, Vec<DesiredBackend>)>,
        all: bool,
    ) -> Result<crate::publish::ApplyReport, PublishError> {
        let mut report = crate::publish::ApplyReport::default();
        for (si, backends) in partial {
            let svc = &self.services[si];
            match self
                .publisher
                .apply_backends(&svc.cfg.name, &backends, &mut self.dp)?
            {
                Some(done) => report.absorb(done),
                None => {
                    let outcome = svc.outcome.as_ref().expect("computed before publishing");
                    desired.push(desired_service(svc, outcome, &self.macs));
                }
            }
        }
        if all {
            report.absorb(self.publisher.apply(&desired, &mut self.dp)?);
        } else if !desired.is_empty() {
            report.absorb(self.publisher.apply_some(&desired, &mut self.dp)?);
        }
        Ok(report)
    }

    /// Rebuilds the operator's snapshot now (`run` leaves it to readers:
    /// [`Agent::on_snapshot_request`]; tests and benchmarks call it directly).
    pub fn publish_snapshot(&mut self) {
        let started = std::time::Instant::now();
        self.flush_events();
        let snap = snapshot::build(self);
        let _ = self.snapshot_tx.send(Arc::new(snap));
        self.snapshot_dirty = false;
        self.snapshot_forced = false;
        self.snapshot_builds += 1;
        self.snapshot_built = Some(Instant::now());
        self.snapshot_cost = started.elapsed();
    }

    /// An admin change: the next read rebuilds the snapshot however recent it is.
    fn snapshot_changed_by_admin(&mut self) {
        self.snapshot_dirty = true;
        self.snapshot_forced = true;
    }

    /// For a periodic counters tick (benchmarks; `run` builds on demand): rebuilds the snapshot unless the last rebuild was
    /// too recent for its cost ([`snapshot_interval`]); then it is due at
    /// [`Agent::snapshot_deadline`].
    pub fn refresh_snapshot(&mut self) {
        self.snapshot_dirty = true;
        self.flush_snapshot();
    }

    /// Rebuilds the snapshot if state changed and the last one is at least
    /// [`snapshot_interval`] old (call it after each event, off the verdict-to-maps path;
    /// [`Agent::snapshot_deadline`] says when a deferred rebuild is due).
    pub fn flush_snapshot(&mut self) {
        if self
            .snapshot_deadline()
            .is_some_and(|due| due <= Instant::now())
        {
            self.publish_snapshot();
        }
    }

    /// When a deferred snapshot rebuild is due (`None`: the snapshot is current).
    pub fn snapshot_deadline(&self) -> Option<Instant> {
        self.snapshot_dirty.then(|| {
            self.snapshot_built.map_or_else(Instant::now, |built| {
                built + snapshot_interval(self.snapshot_cost)
            })
        })
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

/// A server kept by a reload with its probes unchanged still starts its health again
/// when it is up and its service has an essential probe that is not `persistent`: that
/// probe must pass again before the server takes new flows (Angie; docs/probes.md).
fn rechecked(svc: &ServiceConfig, s: &ServerRt) -> bool {
    s.health.usable() && svc.probes.iter().any(|p| p.essential && !p.persistent)
}

/// Which kind of admin change (decides how much is recomputed).
enum ChangeKind {
    Add,
    Other,
}

/// How a server whose probes changed at a reload starts again: `persistent` probes
/// skipped if it was up, checking again if it never passed.
fn restart_state(s: &ServerRt) -> StartState {
    if s.health.usable() {
        StartState::ReloadedWasUp
    } else if s.health.state() == crate::health::HealthState::Checking {
        StartState::New
    } else {
        StartState::ReloadedWasDown
    }
}

/// The data-plane view of one server of a service given its role.
fn desired_backend(
    svc: &ServiceRt,
    (addr, role): (SocketAddr, crate::publish::Role),
    macs: &HashMap<IpAddr, [u8; 6]>,
) -> DesiredBackend {
    DesiredBackend {
        addr,
        weight: svc.servers.get(&addr).map_or(0, |s| s.weight),
        mac: macs.get(&addr.ip()).copied(),
        role,
    }
}

/// The data-plane view of one service given its membership outcome.
fn desired_service(
    svc: &ServiceRt,
    outcome: &Outcome,
    macs: &HashMap<IpAddr, [u8; 6]>,
) -> DesiredService {
    DesiredService {
        name: svc.cfg.name.clone(),
        vip: svc.cfg.vip,
        proto: match svc.cfg.protocol {
            Protocol::Tcp => IPPROTO_TCP,
            Protocol::Udp => IPPROTO_UDP,
        },
        nat: match svc.cfg.forwarding {
            Forwarding::Nat => (!svc.cfg.snat_ips.is_empty()).then(|| NatSpec {
                snat_ips: svc.cfg.snat_ips.clone(),
                ports: svc.cfg.snat_ports.clone(),
                source_rate: svc.cfg.source_rate,
                source_burst: svc.cfg.source_burst,
            }),
            Forwarding::Dsr | Forwarding::Ipip | Forwarding::Gue => None,
        },
        tunnel: match svc.cfg.forwarding {
            Forwarding::Ipip => Some(Tunnel::Ipip),
            Forwarding::Gue => Some(Tunnel::Gue),
            Forwarding::Nat | Forwarding::Dsr => None,
        },
        // `outcome.roles` follows the input order, which is `svc.servers`' order.
        backends: svc
            .servers
            .values()
            .zip(&outcome.roles)
            .map(|(s, &(addr, role))| {
                debug_assert_eq!(s.addr, addr, "membership keeps the input order");
                DesiredBackend {
                    addr: s.addr,
                    weight: s.weight,
                    mac: macs.get(&s.addr.ip()).copied(),
                    role,
                }
            })
            // Removed from the config: out of the home table (weight 0), flows kept.
            .chain(svc.departing.keys().map(|&addr| DesiredBackend {
                addr,
                weight: 0,
                mac: macs.get(&addr.ip()).copied(),
                role: crate::publish::Role::Sticky,
            }))
            .collect(),
        maglev_size: svc.cfg.maglev_size,
    }
}

/// The addresses a service's server entries stand for, every name looked up now
/// (`resolve = true` ones through DNS, SRV expanded; [`crate::discovery`] keeps the
/// answers for re-resolution, see `resolve.rs`).
async fn expand_servers(
    svc: &ServiceConfig,
    discovery: &mut crate::discovery::Discovery,
) -> Vec<(SocketAddr, Configured)> {
    let found = discovery.expand(svc).await;
    found
        .iter()
        .map(|e| (e.addr, resolve::configured(e)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn snapshot_rebuilds_take_at_most_a_tenth_of_the_time() {
        assert_eq!(snapshot_interval(Duration::ZERO), SNAPSHOT_EVERY);
        assert_eq!(snapshot_interval(Duration::from_millis(9)), SNAPSHOT_EVERY);
        assert_eq!(
            snapshot_interval(Duration::from_millis(14)),
            Duration::from_millis(140)
        );
        assert_eq!(
            snapshot_interval(Duration::from_millis(650)),
            Duration::from_millis(6_500)
        );
    }
}
