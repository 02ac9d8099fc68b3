//! The cluster component's counters and the status it reports: per peer (state,
//! records sent, resent, received, lag) and for the node (refusals by reason, stray
//! datagrams).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// Why something a peer sent was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A TLS handshake failed on the certificate or its signature (another key).
    WrongKey,
    /// A hello from a name that is no member.
    ForeignNode,
    /// A hello with another member-list fingerprint.
    Fingerprint,
    /// A hello with another protocol version.
    Version,
    /// A frame that does not follow the format.
    Malformed,
    /// Records of a batch already applied.
    Replayed,
}

/// Refusals, counted by reason.
#[derive(Debug, Default)]
pub struct Refusals([AtomicU64; 6]);

impl Refusals {
    pub fn count(&self, why: Refusal, n: u64) {
        self.0[why as usize].fetch_add(n, Relaxed);
    }

    pub fn get(&self, why: Refusal) -> u64 {
        self.0[why as usize].load(Relaxed)
    }

    pub(super) fn status(&self) -> RefusedStatus {
        RefusedStatus {
            wrong_key: self.get(Refusal::WrongKey),
            foreign_node: self.get(Refusal::ForeignNode),
            fingerprint: self.get(Refusal::Fingerprint),
            version: self.get(Refusal::Version),
            malformed: self.get(Refusal::Malformed),
            replayed: self.get(Refusal::Replayed),
        }
    }
}

/// The state of this node's outgoing connection to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerState {
    Connecting,
    /// Sending a bulk resync.
    Syncing,
    Up,
    /// The peer refused the hello (another member list, or this node is not in it).
    Refused,
}

impl PeerState {
    /// The name status and `/metrics` show.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Connecting => "connecting",
            PeerState::Syncing => "syncing",
            PeerState::Up => "up",
            PeerState::Refused => "refused",
        }
    }
}

/// One peer's counters.
#[derive(Debug)]
pub struct PeerStats {
    state: AtomicU8,
    pub sent: AtomicU64,
    pub resent: AtomicU64,
    pub received: AtomicU64,
    pub connects: AtomicU64,
    /// The next sequence number the peer has not acknowledged.
    pub acked: AtomicU64,
    /// The first sequence number never sent to the peer (below it, sending is resending).
    pub sent_high: AtomicU64,
    /// Its connection to this node is up.
    pub receiving: AtomicBool,
    /// It completed a bulk resync to this node.
    pub bulk_received: AtomicBool,
}

impl Default for PeerStats {
    fn default() -> Self {
        PeerStats {
            state: AtomicU8::new(PeerState::Connecting as u8),
            sent: AtomicU64::new(0),
            resent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            acked: AtomicU64::new(1),
            sent_high: AtomicU64::new(1),
            receiving: AtomicBool::new(false),
            bulk_received: AtomicBool::new(false),
        }
    }
}

impl PeerStats {
    pub fn set_state(&self, s: PeerState) {
        self.state.store(s as u8, Relaxed);
    }

    pub fn state(&self) -> PeerState {
        match self.state.load(Relaxed) {
            0 => PeerState::Connecting,
            1 => PeerState::Syncing,
            2 => PeerState::Up,
            _ => PeerState::Refused,
        }
    }

    pub(super) fn status(&self, name: &str, address: String, lag: Lag) -> PeerStatus {
        PeerStatus {
            name: name.to_string(),
            address,
            state: self.state(),
            receiving: self.receiving.load(Relaxed),
            bulk_received: self.bulk_received.load(Relaxed),
            connects: self.connects.load(Relaxed),
            sent: self.sent.load(Relaxed),
            resent: self.resent.load(Relaxed),
            received: self.received.load(Relaxed),
            lag_records: lag.records,
            lag_ms: lag.oldest_ms,
        }
    }
}

/// Records published and not yet acknowledged by a peer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lag {
    pub records: u64,
    /// Age of the oldest of them, in milliseconds.
    pub oldest_ms: u64,
}

/// One peer, as `status`, the API and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub name: String,
    pub address: String,
    pub state: PeerState,
    pub receiving: bool,
    pub bulk_received: bool,
    pub connects: u64,
    pub sent: u64,
    pub resent: u64,
    pub received: u64,
    pub lag_records: u64,
    pub lag_ms: u64,
}

/// Refusals by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedStatus {
    pub wrong_key: u64,
    pub foreign_node: u64,
    pub fingerprint: u64,
    pub version: u64,
    pub malformed: u64,
    pub replayed: u64,
}

/// The cluster component's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub node: String,
    pub index: usize,
    pub members: usize,
    /// The starting bulk resync completed or timed out: announcing may begin.
    pub resync_complete: bool,
    /// Connections known (own and replicated).
    pub connections: usize,
    pub peers: Vec<PeerStatus>,
    pub refused: RefusedStatus,
    /// Datagrams on the sync socket that no connection took.
    pub stray_datagrams: u64,
    /// The latest moves of a neighbour to another MAC that replies follow (oldest
    /// first; `LB_CLUSTER` holds them).
    #[serde(default)]
    pub next_hop_moves: Vec<NextHopMove>,
    /// Next-hop moves followed since the agent started.
    #[serde(default)]
    pub next_hop_moves_followed: u64,
    /// Other nodes' connections the peer tables had no room for since the agent
    /// started (not installed: their packets here are handled as without cluster mode).
    #[serde(default)]
    pub peer_table_full: u64,
}

/// A neighbour's move from one MAC to another, as the status page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextHopMove {
    pub old: String,
    pub new: String,
}
