//! The cluster component: this node's agent shares its nat connections with its peers'
//! agents over QUIC (docs/internals/cluster-sync.md) when `[cluster]` is configured.
//!
//! Its API is narrow: [`Cluster::publish`] the records of this node's connections,
//! [`Cluster::changes`] the replicas to install or remove, [`Cluster::status`] for the
//! view, [`Cluster::resync_complete`] for announcement gating. It owns its state: the
//! replicas, the published records a peer may still need, each peer's progress, the
//! counters. Tasks on the agent's tokio runtime dial every peer ([`outgoing`]), accept
//! the peers' connections ([`incoming`]) and expire replicas; dropping the component
//! stops them.

mod conn;
mod error;
mod frame;
mod identity;
mod incoming;
mod members;
mod outgoing;
mod reach;
mod record;
mod shard;
mod socket;
mod stats;
mod store;

use std::collections::HashMap;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use conn::{client_key, record_of_event, refresh_of_entry, reply_key};
pub use error::{KeyError, Malformed, StartError, SyncError};
pub use identity::{Identity, MIN_KEY_LEN, read_key};
pub use members::{Member, Members, port_slice};
pub use reach::{Reach, reach};
pub use record::{ConnKey, Endpoint, Record, RecordKind};
pub use stats::{ClusterStatus, NextHopMove, PeerState, PeerStatus, RefusedStatus};
pub use store::{Change, EXPIRY_MARGIN, idle_limit};

use crate::config::ClusterConfig;
use stats::{Lag, PeerStats, Refusals};
use store::{Outbox, RESEND_WINDOW, Replicas};

/// How often expired replicas are removed.
const EXPIRY_SWEEP: Duration = Duration::from_secs(1);

/// The running cluster component.
pub struct Cluster {
    config: ClusterConfig,
    shared: Arc<Shared>,
    endpoint: quinn::Endpoint,
    /// Until the agent's event loop takes it.
    changes: Option<mpsc::UnboundedReceiver<Vec<Change>>>,
    resync: watch::Receiver<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// What the component's tasks share.
struct Shared {
    members: Members,
    fingerprint: [u8; 32],
    incarnation: u64,
    tables: Mutex<Tables>,
    /// The outbox's next sequence number, for the dialers to wait on.
    published: watch::Sender<u64>,
    /// By member index (this node's own slot stays idle).
    peers: Vec<PeerStats>,
    refusals: Refusals,
    socket_datagrams: Arc<AtomicU64>,
    ended_connection_datagrams: AtomicU64,
    live: Mutex<HashMap<usize, quinn::Connection>>,
    changes: mpsc::UnboundedSender<Vec<Change>>,
    resync: watch::Sender<bool>,
}

/// The state behind one lock: what a bulk resync must see at one instant.
struct Tables {
    replicas: Replicas,
    outbox: Outbox,
    /// By member index: what this node received from that peer.
    inbound: Vec<Inbound>,
}

/// A peer's records as this node received them.
#[derive(Default)]
struct Inbound {
    /// The incarnation whose records these are.
    incarnation: Option<u64>,
    /// The first sequence number not applied.
    next_seq: u64,
    /// That incarnation's bulk resync completed.
    bulk_done: bool,
    /// Counts the peer's connections: only the newest applies records.
    generation: u64,
    connection: Option<quinn::Connection>,
}

impl Cluster {
    /// Reads the key file, binds `listen` and starts (on the current tokio runtime).
    pub fn start(config: &ClusterConfig) -> Result<Cluster, StartError> {
        let secret = read_key(&config.key_file)?;
        let socket = UdpSocket::bind(config.listen).map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        Self::start_on(config, &secret, socket)
    }

    /// Starts with the key `secret` on a bound `socket`.
    pub fn start_on(
        config: &ClusterConfig,
        secret: &[u8],
        socket: UdpSocket,
    ) -> Result<Cluster, StartError> {
        let identity = Identity::derive(secret)?;
        let members = Members::new(config);
        let addr = socket.local_addr().map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        let bind = |source| StartError::Bind { addr, source };
        let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
        let socket_datagrams = Arc::new(AtomicU64::new(0));
        let counting = socket::CountingSocket::new(
            runtime.wrap_udp_socket(socket).map_err(bind)?,
            socket_datagrams.clone(),
        );
        let mut endpoint = quinn::Endpoint::new_with_abstract_socket(
            quinn::EndpointConfig::default(),
            Some(identity.server_config()),
            Arc::new(counting),
            runtime,
        )
        .map_err(bind)?;
        endpoint.set_default_client_config(identity.client_config());

        let (changes_tx, changes) = mpsc::unbounded_channel();
        let (resync_tx, resync) = watch::channel(false);
        let n = members.all().len();
        let shared = Arc::new(Shared {
            fingerprint: members.fingerprint(),
            incarnation: incarnation(),
            tables: Mutex::new(Tables {
                replicas: Replicas::default(),
                outbox: Outbox::new(RESEND_WINDOW),
                inbound: (0..n).map(|_| Inbound::default()).collect(),
            }),
            published: watch::Sender::new(1),
            peers: (0..n).map(|_| PeerStats::default()).collect(),
            refusals: Refusals::default(),
            socket_datagrams,
            ended_connection_datagrams: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
            changes: changes_tx,
            resync: resync_tx,
            members,
        });
        let mut tasks = vec![
            tokio::spawn(incoming::accept(shared.clone(), endpoint.clone())),
            tokio::spawn(expire(shared.clone())),
            tokio::spawn(resync_deadline(shared.clone(), config.resync_timeout)),
        ];
        for (index, _) in shared.members.peers() {
            tasks.push(tokio::spawn(outgoing::dial(
                shared.clone(),
                endpoint.clone(),
                index,
            )));
        }
        Ok(Cluster {
            config: config.clone(),
            shared,
            endpoint,
            changes: Some(changes),
            resync,
            tasks,
        })
    }

    /// The `[cluster]` it runs with (a change needs a restart).
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The members, sorted, with this node's index.
    pub fn members(&self) -> &Members {
        &self.shared.members
    }

    /// Shares `records` (this node's connections) with every peer.
    pub fn publish(&self, records: &[Record]) {
        let now = Instant::now();
        let next = {
            let mut t = self.shared.lock();
            t.replicas.apply_all(records, now, false, |_| {});
            for r in records {
                t.outbox.push(*r, now);
            }
            t.outbox.next_seq()
        };
        self.shared.published.send_replace(next);
    }

    /// The replicas to install or remove, batch by batch, as peers send them and as
    /// they expire (`None` once taken).
    pub fn changes(&mut self) -> Option<&mut mpsc::UnboundedReceiver<Vec<Change>>> {
        self.changes.as_mut()
    }

    /// Takes the stream of [`changes`](Self::changes), for an event loop to wait on.
    pub fn take_changes(&mut self) -> Option<mpsc::UnboundedReceiver<Vec<Change>>> {
        self.changes.take()
    }

    /// Turns true once every peer completed a bulk resync to this node, or the resync
    /// timeout passed.
    pub fn resync_complete(&self) -> watch::Receiver<bool> {
        self.resync.clone()
    }

    pub fn status(&self) -> ClusterStatus {
        let now = Instant::now();
        let t = self.shared.lock();
        let peers = self
            .shared
            .members
            .peers()
            .map(|(i, m)| {
                let stats = &self.shared.peers[i];
                let acked = stats.acked.load(Relaxed);
                let lag = Lag {
                    records: t.outbox.next_seq().saturating_sub(acked),
                    oldest_ms: t
                        .outbox
                        .published_at(acked)
                        .map_or(0, |at| now.saturating_duration_since(at).as_millis() as u64),
                };
                stats.status(&m.name, m.address.to_string(), lag)
            })
            .collect();
        ClusterStatus {
            node: self.shared.members.all()[self.shared.members.own_index()]
                .name
                .clone(),
            index: self.shared.members.own_index(),
            members: self.shared.members.all().len(),
            resync_complete: *self.resync.borrow(),
            connections: t.replicas.len(),
            peers,
            refused: self.shared.refusals.status(),
            stray_datagrams: self.shared.stray_datagrams(),
            next_hop_moves: Vec::new(),
            next_hop_moves_followed: 0,
            peer_table_full: 0,
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.endpoint.close(0u8.into(), b"stopping");
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Datagrams the socket received that no connection took.
    fn stray_datagrams(&self) -> u64 {
        let live: u64 = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|c| c.stats().udp_rx.datagrams)
            .sum();
        let taken = live + self.ended_connection_datagrams.load(Relaxed);
        self.socket_datagrams.load(Relaxed).saturating_sub(taken)
    }

    /// Counts `conn`'s datagrams while it lives and after it ends.
    fn track(self: &Arc<Self>, conn: &quinn::Connection) -> Tracked {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(conn.stable_id(), conn.clone());
        Tracked {
            shared: self.clone(),
            conn: conn.clone(),
        }
    }

    /// Completes the resync once every peer delivered its bulk.
    fn check_resync(&self) {
        let all = self
            .members
            .peers()
            .all(|(i, _)| self.peers[i].bulk_received.load(Relaxed));
        if all {
            self.resync.send_replace(true);
        }
    }

    /// Hands changes to the agent (dropped when the component is gone).
    fn emit(&self, changes: Vec<Change>) {
        if !changes.is_empty() {
            let _ = self.changes.send(changes);
        }
    }
}

/// A live connection counted in [`Shared::stray_datagrams`].
struct Tracked {
    shared: Arc<Shared>,
    conn: quinn::Connection,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut live = self.shared.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.remove(&self.conn.stable_id()).is_some() {
            self.shared
                .ended_connection_datagrams
                .fetch_add(self.conn.stats().udp_rx.datagrams, Relaxed);
        }
    }
}

/// Whether `e` ended a handshake on the certificate or its signature: TLS alerts are
/// QUIC's crypto error codes 0x100..=0x1ff.
fn is_crypto(e: &quinn::ConnectionError) -> bool {
    let code = match e {
        quinn::ConnectionError::TransportError(t) => t.code,
        quinn::ConnectionError::ConnectionClosed(c) => c.error_code,
        _ => return false,
    };
    (0x100..0x200).contains(&u64::from(code))
}

/// A random incarnation number for this start of the agent.
fn incarnation() -> u64 {
    let mut b = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .expect("the system's random source works");
    u64::from_be_bytes(b)
}

async fn expire(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(EXPIRY_SWEEP);
    loop {
        tick.tick().await;
        let gone = shared.lock().replicas.expire(Instant::now());
        shared.emit(gone);
    }
}

async fn resync_deadline(shared: Arc<Shared>, timeout: Duration) {
    tokio::time::sleep(timeout).await;
    shared.resync.send_replace(true);
}
