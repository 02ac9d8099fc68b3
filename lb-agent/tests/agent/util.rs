//! The whole agent under paused time, for the agent tests: a scripted prober, the
//! in-memory data plane, and the event loop of `lb-agent run` over test inputs, stepped
//! one turn at a time. Helpers read back what the data plane holds by address.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lb_agent::agent::{Agent, Environment, Neighbours, StaticNeighbours};
use lb_agent::api::{AdminChange, AdminError, AdminRequest, EventLog, NewServer, ReloadOutcome};
use lb_agent::config::{self, Config, ProbeConfig};
use lb_agent::dataplane::DataplaneError;
use lb_agent::event_loop::{
    AttachmentWatch, ConfigSource, EventLoop, Exit, Inputs, PassiveEvents, Signal, Signals, Wake,
};
use lb_agent::neighbour::nexthops::{MacUpdate, Moved, NeighbourChanges};
use lb_agent::probe::{ProbeOutcome, Prober};
use lb_agent::publish::{addr_words, vip_key};
use lb_agent::testing::MemoryDataplane;
use lb_agent::view::{ServerStatus, ServiceStatus, Snapshot};
use lb_common::NO_BACKEND;
use lb_common::events::PassiveEvent;
use lb_common::maps::{BACKEND_F_LIVE, BACKEND_F_SERVING};
use std::ops::ControlFlow;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until};

/// The MAC every backend resolves to unless a test says otherwise.
pub const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

/// The name test configs are parsed under.
const TEST_CONFIG: &str = "agent-test.toml";

pub fn sa(s: &str) -> SocketAddr {
    s.parse()
        .unwrap_or_else(|_| panic!("`{s}` is not an address"))
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// How a scripted server answers its probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Passes at once.
    Pass,
    /// Fails at once, as a refused connection does.
    Refuse,
    /// Never answers: the probe fails when its timeout elapses.
    Silent,
    /// Cannot run on this host (out of file descriptors): no verdict at all.
    LocalFault,
}

/// One probe execution as the scripted prober saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub target: SocketAddr,
    pub probe: String,
    pub interval: Duration,
    pub started: Instant,
    pub verdict: Verdict,
}

/// A [`Prober`] whose servers answer as the test says (`Pass` when not told).
#[derive(Default)]
pub struct Scripted {
    verdicts: Mutex<HashMap<SocketAddr, Verdict>>,
    /// Overrides for one probe (by name) of one server.
    probe_verdicts: Mutex<HashMap<(SocketAddr, String), Verdict>>,
    calls: Mutex<Vec<Call>>,
}

impl Scripted {
    /// How `target` answers every probe.
    pub fn set(&self, target: SocketAddr, verdict: Verdict) {
        self.verdicts.lock().unwrap().insert(target, verdict);
    }

    /// How `target` answers the probe named `probe` (over [`Scripted::set`]).
    pub fn set_probe(&self, target: SocketAddr, probe: &str, verdict: Verdict) {
        self.probe_verdicts
            .lock()
            .unwrap()
            .insert((target, probe.to_string()), verdict);
    }

    fn verdict(&self, target: SocketAddr, probe: &str) -> Verdict {
        if let Some(v) = self
            .probe_verdicts
            .lock()
            .unwrap()
            .get(&(target, probe.to_string()))
        {
            return *v;
        }
        self.verdicts
            .lock()
            .unwrap()
            .get(&target)
            .copied()
            .unwrap_or(Verdict::Pass)
    }

    /// Every probe started so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Probes of `target` started at or after `since`.
    pub fn calls_to(&self, target: SocketAddr, since: Instant) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.target == target && c.started >= since)
            .collect()
    }
}

impl Prober for Scripted {
    async fn probe(&self, cfg: &ProbeConfig, target: SocketAddr) -> ProbeOutcome {
        let verdict = self.verdict(target, &cfg.name);
        self.calls.lock().unwrap().push(Call {
            target,
            probe: cfg.name.clone(),
            interval: cfg.interval,
            started: Instant::now(),
            verdict,
        });
        match verdict {
            Verdict::Pass => ProbeOutcome::pass(Duration::ZERO, "status 200"),
            Verdict::Refuse => ProbeOutcome::fail(Duration::ZERO, "connection refused"),
            Verdict::Silent => {
                sleep(cfg.timeout).await;
                ProbeOutcome::timed_out(cfg.timeout)
            }
            Verdict::LocalFault => ProbeOutcome::local_fault(
                Duration::ZERO,
                "local fault: out of file descriptors (EMFILE): connect: Too many open files",
            ),
        }
    }
}

/// Neighbours whose table the test fills in while the agent runs.
#[derive(Default)]
pub struct LearnedNeighbours {
    pub table: Mutex<HashMap<IpAddr, [u8; 6]>>,
}

impl LearnedNeighbours {
    pub fn learn(&self, ip: IpAddr, mac: [u8; 6]) {
        self.table.lock().unwrap().insert(ip, mac);
    }
}

impl Neighbours for LearnedNeighbours {
    async fn resolve(&self, ip: IpAddr) -> Result<[u8; 6], String> {
        self.table
            .lock()
            .unwrap()
            .get(&ip)
            .copied()
            .ok_or_else(|| format!("no MAC learned for {ip}"))
    }
}

/// Parses config text; panics with the error.
pub fn parse(text: &str) -> Config {
    config::parse(text, Path::new(TEST_CONFIG))
        .unwrap_or_else(|e| panic!("test config must parse: {e}\n--- text ---\n{text}"))
}

/// A `web` service on 10.0.0.100:80 (nat): `extra` lines for `[[service]]`, then `rest`
/// (servers and probes).
pub fn web(extra: &str, rest: &str) -> String {
    format!(
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n{extra}\n{rest}"
    )
}

/// `[[service.server]]` blocks for the given addresses, each with `extra` lines.
pub fn servers(list: &[(&str, &str)]) -> String {
    list.iter()
        .map(|(addr, extra)| format!("[[service.server]]\naddress = \"{addr}\"\n{extra}\n"))
        .collect()
}

/// The library's event loop over the test inputs: signals, attachment checks, passive
/// events and MAC updates as the test sends them, the config as the test wrote it.
pub type TestLoop<N> = EventLoop<MemoryDataplane, Scripted, N, SentSignals, SentEvents, SentChecks>;

/// The agent over [`MemoryDataplane`], [`Scripted`] and neighbours `N`, in the event loop
/// of `lb-agent run`, stepped one turn at a time.
pub struct Harness<N: Neighbours = StaticNeighbours> {
    event_loop: TestLoop<N>,
    pub prober: Arc<Scripted>,
    pub neighbours: Arc<N>,
    /// The configuration last applied (VIPs of services for lookups).
    pub cfg: Config,
    /// The text a reload reads.
    config_text: Arc<Mutex<String>>,
    snapshot_rx: watch::Receiver<Arc<Snapshot>>,
    pub events: EventLog,
    /// Passive events into the loop, as the data plane's ring buffer feeds them.
    passive_tx: mpsc::Sender<Vec<PassiveEvent>>,
    /// Neighbour changes into the loop, as the neighbour watch sends them.
    neighbour_tx: mpsc::Sender<NeighbourChanges>,
    /// Signals into the loop, as the process receives them.
    pub signal_tx: mpsc::Sender<Signal>,
    /// What the next checks of the attachment find, one check each.
    pub attachment_tx: mpsc::Sender<AttachmentCheck>,
    /// Why the loop ended, once it has.
    pub exit: Option<Exit>,
    /// `true`: the loop leaves the snapshot to readers ([`Harness::read_snapshot`]), as
    /// `lb-agent run` does; `false` (default): rebuilt after every turn for the tests.
    pub snapshots_on_demand: bool,
    /// Deadlines handled in a row at one simulated instant (see [`Harness::step`]).
    ticks_at_one_instant: (Instant, u32),
}

/// More deadlines than this handled at one simulated instant: the agent is spinning on a
/// deadline its tick does not move (time is paused, so it would never end).
const MAX_TICKS_AT_ONE_INSTANT: u32 = 1_000;

/// Signals the test sends ([`Harness::signal_tx`]).
pub struct SentSignals(mpsc::Receiver<Signal>);

impl Signals for SentSignals {
    async fn next(&mut self) -> Signal {
        match self.0.recv().await {
            Some(signal) => signal,
            None => std::future::pending().await,
        }
    }
}

/// What one check of the attachment finds.
pub type AttachmentCheck = Result<Option<String>, DataplaneError>;

/// Checks of the memory data plane's attachment, due when the test sends what they find
/// ([`Harness::attachment_tx`]).
pub struct SentChecks {
    found: mpsc::Receiver<AttachmentCheck>,
    next: Option<AttachmentCheck>,
}

impl AttachmentWatch<MemoryDataplane> for SentChecks {
    async fn due(&mut self) {
        if self.next.is_none() {
            self.next = self.found.recv().await;
        }
        if self.next.is_none() {
            std::future::pending::<()>().await;
        }
    }

    fn check(&mut self, _: &mut MemoryDataplane) -> AttachmentCheck {
        self.next.take().unwrap_or(Ok(None))
    }
}

/// Passive events the test sends ([`Harness::passive_tx`]).
pub struct SentEvents(mpsc::Receiver<Vec<PassiveEvent>>);

impl PassiveEvents for SentEvents {
    async fn next_batch(&mut self) -> Result<Vec<PassiveEvent>, DataplaneError> {
        match self.0.recv().await {
            Some(batch) => Ok(batch),
            None => std::future::pending().await,
        }
    }
}

/// The configuration as the test last wrote it ([`Harness::write_config`]).
struct ConfigText(Arc<Mutex<String>>);

impl ConfigSource for ConfigText {
    fn origin(&self) -> &Path {
        Path::new(TEST_CONFIG)
    }

    fn load(&self) -> Result<Config, String> {
        config::parse(&self.0.lock().unwrap(), Path::new(TEST_CONFIG)).map_err(|e| e.to_string())
    }
}

impl Harness<StaticNeighbours> {
    /// The agent running `text`, every backend resolving to [`MAC`].
    pub async fn start(text: &str) -> Self {
        let neighbours = StaticNeighbours {
            default: Some(MAC),
            ..Default::default()
        };
        Harness::with_neighbours(text, neighbours).await
    }
}

impl<N: Neighbours> Harness<N> {
    pub async fn with_neighbours(text: &str, neighbours: N) -> Self {
        let cfg = parse(text);
        let prober = Arc::new(Scripted::default());
        let neighbours = Arc::new(neighbours);
        let (mut agent, handles) = Agent::new(
            MemoryDataplane::default(),
            prober.clone(),
            neighbours.clone(),
            Environment::default(),
        );
        agent
            .apply_config(&cfg)
            .await
            .expect("publishing the first config into memory cannot fail");
        agent.publish_snapshot();
        let config_text = Arc::new(Mutex::new(text.to_string()));
        let (passive_tx, passive_rx) = mpsc::channel(64);
        let (neighbour_tx, neighbour_changes) = mpsc::channel(64);
        let (signal_tx, signals) = mpsc::channel(4);
        let (attachment_tx, found) = mpsc::channel(4);
        // Admin, snapshot and reload requests come through the harness's own methods.
        let inputs = Inputs {
            reports: handles.reports,
            admin: mpsc::channel(1).1,
            snapshots: mpsc::channel(1).1,
            reloads: mpsc::channel(1).1,
            neighbour_changes,
            bgp: None,
            signals: SentSignals(signals),
            passive_events: Some(SentEvents(passive_rx)),
            conn_events: None,
            cluster_changes: None,
            attachment: SentChecks { found, next: None },
            config: Box::new(ConfigText(config_text.clone())),
            watchdog: None,
        };
        Harness {
            event_loop: EventLoop::new(agent, cfg.agent.clone(), inputs),
            prober,
            neighbours,
            cfg,
            config_text,
            snapshot_rx: handles.snapshot,
            events: handles.events,
            passive_tx,
            neighbour_tx,
            signal_tx,
            attachment_tx,
            exit: None,
            snapshots_on_demand: false,
            ticks_at_one_instant: (Instant::now(), 0),
        }
    }

    pub fn agent(&self) -> &Agent<MemoryDataplane, Scripted, N> {
        self.event_loop.agent()
    }

    pub fn agent_mut(&mut self) -> &mut Agent<MemoryDataplane, Scripted, N> {
        self.event_loop.agent_mut()
    }

    /// Applies a new configuration through the loop's reload, as SIGHUP does.
    pub async fn reload(&mut self, text: &str) {
        let cfg = parse(text);
        self.try_reload(text)
            .await
            .expect("reloading a valid config into memory cannot fail");
        self.cfg = cfg;
    }

    pub fn set(&self, target: SocketAddr, verdict: Verdict) {
        self.prober.set(target, verdict);
    }

    /// One turn of the loop, then the snapshot is brought up to date at once (`run`
    /// defers rebuilds to at most one per `SNAPSHOT_EVERY`; the tests read state through
    /// the snapshot, so they want it current); `false` once `end` has come or the loop
    /// ended ([`Harness::exit`]).
    async fn step(&mut self, end: Instant) -> bool {
        let wake = tokio::select! {
            biased;
            wake = self.event_loop.wait() => wake,
            _ = sleep_until(end) => return false,
        };
        if matches!(wake, Wake::Deadline) {
            self.count_tick();
        }
        // Counters and probe counts change without marking the snapshot stale (a reader
        // of `lb-agent run` gets a rebuild once `SNAPSHOT_EVERY` passed): rebuilt at every
        // stats poll too.
        let stats = matches!(wake, Wake::Stats);
        match self.event_loop.handle(wake).await {
            ControlFlow::Break(exit) => {
                self.exit = Some(exit);
                return false;
            }
            ControlFlow::Continue(published) => {
                published.expect("publishing into memory cannot fail");
            }
        }
        if !self.snapshots_on_demand && (stats || self.agent().snapshot_deadline().is_some()) {
            self.agent_mut().publish_snapshot();
        }
        true
    }

    /// Sends passive events into the loop, as the data plane's ring buffer does, and runs
    /// the loop until it has handled them (with whatever else is ready at this instant).
    pub async fn send_passive_events(&mut self, batch: &[PassiveEvent]) {
        let tx = self.passive_tx.clone();
        self.feed(&tx, batch.to_vec()).await;
    }

    /// Sends MAC changes into the loop, as the neighbour watch does, and runs the loop
    /// until it has handled them (with whatever else is ready at this instant).
    pub async fn send_mac_updates(&mut self, updates: &[MacUpdate]) {
        let tx = self.neighbour_tx.clone();
        let changes = NeighbourChanges {
            backends: updates.to_vec(),
            moved: Vec::new(),
        };
        self.feed(&tx, changes).await;
    }

    /// Sends neighbours that moved to another link-layer address into the loop, as the
    /// neighbour watch does, and runs the loop until it has handled them.
    pub async fn send_neighbour_moves(&mut self, moved: &[Moved]) {
        let tx = self.neighbour_tx.clone();
        let changes = NeighbourChanges {
            backends: Vec::new(),
            moved: moved.to_vec(),
        };
        self.feed(&tx, changes).await;
    }

    /// Sends `item` through `tx` and turns the loop at this instant until it took it
    /// (each turn handles what it took before the next).
    async fn feed<T>(&mut self, tx: &mpsc::Sender<T>, item: T) {
        if tx.send(item).await.is_err() {
            panic!("the loop holds the receiver");
        }
        while tx.capacity() < tx.max_capacity() {
            assert!(
                self.step(Instant::now()).await,
                "the loop must take what was sent at once"
            );
        }
    }

    /// What the next reload reads, as an operator edits the file.
    pub fn write_config(&self, text: &str) {
        *self.config_text.lock().unwrap() = text.to_string();
    }

    /// Reloads `text` through the loop and returns its answer, as the API's reload does.
    pub async fn try_reload(&mut self, text: &str) -> Result<ReloadOutcome, String> {
        self.write_config(text);
        let (reply, answer) = oneshot::channel();
        let _ = self.event_loop.handle(Wake::ReloadRequest(reply)).await;
        self.agent_mut().publish_snapshot();
        answer.await.expect("the loop answers every reload request")
    }

    /// Fails the test when the agent handles its deadline over and over at one instant.
    fn count_tick(&mut self) {
        let now = Instant::now();
        let deadline = self.agent_mut().next_deadline();
        let (at, count) = &mut self.ticks_at_one_instant;
        if *at == now {
            *count += 1;
            assert!(
                *count < MAX_TICKS_AT_ONE_INSTANT,
                "the agent's next deadline stays at {deadline:?} after {count} ticks: \
                 its tick does not take the work that is due"
            );
        } else {
            *at = now;
            *count = 1;
        }
    }

    /// Reads the snapshot as an API handler does (`lb-agent run` answers at
    /// `readers_deadline`; only simulated time passes while it waits).
    pub async fn read_snapshot(&mut self) -> Arc<Snapshot> {
        let (reply, mut answer) = oneshot::channel();
        self.agent_mut().on_snapshot_request(reply);
        loop {
            if let Ok(snap) = answer.try_recv() {
                return snap;
            }
            let due = self
                .agent()
                .readers_deadline()
                .expect("a reader without an answer waits for a deadline");
            sleep_until(due).await;
            self.agent_mut().answer_readers();
        }
    }

    /// Runs the loop for `d` of simulated time.
    pub async fn run_for(&mut self, d: Duration) {
        let end = Instant::now() + d;
        while self.step(end).await {}
    }

    /// Runs the loop until `cond` holds (checked after every turn) or `limit` passes;
    /// returns how long it took, `None` at the limit.
    pub async fn run_until(
        &mut self,
        limit: Duration,
        mut cond: impl FnMut(&Self) -> bool,
    ) -> Option<Duration> {
        let start = Instant::now();
        let end = start + limit;
        if cond(self) {
            return Some(Duration::ZERO);
        }
        while self.step(end).await {
            if cond(self) {
                return Some(Instant::now() - start);
            }
        }
        None
    }

    /// Adds `address` to `service` at runtime as a primary of weight 1, as
    /// `lb-agent server add SERVICE ADDRESS` does.
    pub async fn add_server(
        &mut self,
        service: &str,
        address: SocketAddr,
    ) -> Result<(), AdminError> {
        let change = AdminChange::Add(NewServer {
            address,
            weight: 1,
            spare: false,
            backup: 0,
        });
        self.admin(service, &address.to_string(), change).await
    }

    /// A runtime change as the API hands it to the agent, through the loop; the agent's
    /// answer.
    pub async fn admin(
        &mut self,
        service: &str,
        address: &str,
        change: AdminChange,
    ) -> Result<(), AdminError> {
        let (reply, answer) = oneshot::channel();
        let request = AdminRequest {
            service: service.into(),
            address: address.into(),
            change,
            reply,
        };
        let _ = self.event_loop.handle(Wake::Admin(request)).await;
        self.agent_mut().publish_snapshot();
        answer.await.expect("the agent answers every admin request")
    }

    /// Data-plane id of `service` (through its VIP entry).
    pub fn service_id(&self, service: &str) -> Option<u32> {
        let svc = self
            .cfg
            .services
            .iter()
            .find(|s| s.name == service)
            .unwrap_or_else(|| panic!("no service `{service}` in the test config"));
        let key = vip_key(svc.vip, svc.protocol.ip_proto());
        self.agent()
            .dataplane()
            .service(&key)
            .map(|meta| meta.service_id)
    }

    /// Backend ids whose entry names `addr` in `service` (a removed and re-added server
    /// has several: the retired one and the new one).
    pub fn backend_ids(&self, service: &str, addr: SocketAddr) -> Vec<u32> {
        let Some(sid) = self.service_id(service) else {
            return Vec::new();
        };
        let (words, family) = addr_words(addr.ip());
        self.agent()
            .dataplane()
            .backends
            .iter()
            .filter(|(_, b)| {
                b.service_id == sid
                    && b.addr == words
                    && b.family == family
                    && b.port == addr.port().to_be()
            })
            .map(|(&id, _)| id)
            .collect()
    }

    /// The service's published Maglev table (empty if none).
    pub fn table(&self, service: &str) -> Vec<u32> {
        self.service_id(service)
            .and_then(|sid| self.agent().dataplane().tables.get(&sid).cloned())
            .unwrap_or_default()
    }

    /// Slots of `service`'s table that send new flows to `addr`.
    pub fn slots(&self, service: &str, addr: SocketAddr) -> usize {
        let ids = self.backend_ids(service, addr);
        self.table(service)
            .iter()
            .filter(|s| **s != NO_BACKEND && ids.contains(s))
            .count()
    }

    /// `slots` as a share of the table.
    pub fn share(&self, service: &str, addr: SocketAddr) -> f64 {
        self.slots(service, addr) as f64 / self.table(service).len() as f64
    }

    /// Slots that hold no backend.
    pub fn empty_slots(&self, service: &str) -> usize {
        self.table(service)
            .iter()
            .filter(|s| **s == NO_BACKEND)
            .count()
    }

    /// Some backend entry of `addr` in `service` carries `BACKEND_F_LIVE` (pinned flows
    /// may use it).
    pub fn live(&self, service: &str, addr: SocketAddr) -> bool {
        let dp = self.agent().dataplane();
        self.backend_ids(service, addr)
            .iter()
            .any(|id| dp.backends[id].flags & BACKEND_F_LIVE != 0)
    }

    /// Takes new flows (`BACKEND_F_SERVING`); `live` without it: keeps established flows.
    pub fn serving(&self, service: &str, addr: SocketAddr) -> bool {
        let dp = self.agent().dataplane();
        self.backend_ids(service, addr)
            .iter()
            .any(|id| dp.backends[id].flags & BACKEND_F_SERVING != 0)
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot_rx.borrow().clone()
    }

    pub fn service_status(&self, service: &str) -> ServiceStatus {
        self.snapshot()
            .services
            .iter()
            .find(|s| s.name == service)
            .cloned()
            .unwrap_or_else(|| panic!("no service `{service}` in the snapshot"))
    }

    pub fn server_status(&self, service: &str, addr: SocketAddr) -> ServerStatus {
        let address = addr.to_string();
        self.service_status(service)
            .servers
            .into_iter()
            .find(|s| s.address == address)
            .map(std::sync::Arc::unwrap_or_clone)
            .unwrap_or_else(|| panic!("no server {addr} of `{service}` in the snapshot"))
    }

    /// The server's state in the snapshot (`up`, `checking`, `unhealthy`, …).
    pub fn state(&self, service: &str, addr: SocketAddr) -> String {
        self.server_status(service, addr).state
    }
}
