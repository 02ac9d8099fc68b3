//! The REST API and `/metrics` (DESIGN.md §9), served with axum on a Unix socket (every
//! request) and TCP (reads; changes with a bearer token), within [`Limits`]
//! (docs/api-security.md).
//!
//! Handlers ask the agent loop for a [`crate::view::Snapshot`] (built on demand, [`SnapshotSource`]) or hand an [`AdminRequest`] to the agent
//! loop, which owns all state and answers through a oneshot channel.

mod auth;
mod cluster_metrics;
mod counters;
pub mod families;
mod limits;
mod metrics;
mod page;
mod routes;
mod serve;
mod snapshot_source;
mod socket;

use std::{collections::VecDeque, net::SocketAddr, sync::Arc};

use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::view::Event;

pub use auth::{Access, MIN_TOKEN_LEN, Token, TokenError, load_token};
pub use counters::{ApiCounters, Rejection};
pub use limits::Limits;
pub use metrics::render as render_metrics;
pub use page::{PageView, TIMELINE_SPAN};
pub use routes::router;
pub use serve::{ListenConfig, ListenError, Listening, app, listen, serve_tcp, serve_unix};
pub use snapshot_source::{SnapshotRequest, SnapshotSource};
pub use socket::SocketError;

/// How many transitions `/api/v1/events` keeps.
pub const EVENT_LOG_LEN: usize = 1000;

/// Recent state transitions, newest last.
pub type EventLog = Arc<Mutex<VecDeque<Event>>>;

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    pub snapshot: SnapshotSource,
    pub events: EventLog,
    pub admin: mpsc::Sender<AdminRequest>,
    /// `POST /api/v1/reload`: re-read the config file, as SIGHUP does.
    pub reload: mpsc::Sender<ReloadRequest>,
    /// Connections and requests turned away (`/metrics`).
    pub counters: Arc<ApiCounters>,
}

/// A reload asked through the API (`lb-agent reload`); the answer says whether the new
/// config is in force (with notes such as `[agent]` keys that need a restart), or why
/// the running one stays.
pub type ReloadRequest = oneshot::Sender<Result<ReloadOutcome, String>>;

/// A reload that was applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadOutcome {
    /// Things the operator should know, e.g. "[agent] api_listen changed: restart to apply".
    pub warnings: Vec<String>,
}

/// A runtime change asked through the API or `lb-agent server`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminChange {
    /// PATCH: change some settings of a server.
    Patch(ServerPatch),
    /// POST: add a server.
    Add(NewServer),
    /// DELETE: remove a server.
    Remove,
    /// `POST /api/v1/node/drain` (`true`) or `/undrain` (`false`): withdraw every VIP
    /// from the routers or announce them again (`service`/`address` unused).
    NodeDrain(bool),
}

/// Fields a PATCH may set; absent fields stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerPatch {
    pub weight: Option<u32>,
    pub spare: Option<bool>,
    pub drain: Option<bool>,
    pub down: Option<bool>,
    /// `true`: forget this server's runtime changes (weight, spare, drain, down) and
    /// return to the file's values; applied before the other fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<bool>,
}

/// A server added at runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewServer {
    pub address: SocketAddr,
    #[serde(default = "one")]
    pub weight: u32,
    #[serde(default)]
    pub spare: bool,
    #[serde(default)]
    pub backup: u32,
}

fn one() -> u32 {
    1
}

/// Why a runtime change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum AdminError {
    #[error("no service named `{0}`")]
    NoService(String),
    #[error("service `{service}` has no server {address}")]
    NoServer { service: String, address: String },
    #[error("invalid request: {0}")]
    Invalid(String),
}

/// One runtime change with the channel its answer goes back on.
#[derive(Debug)]
pub struct AdminRequest {
    pub service: String,
    pub address: String,
    pub change: AdminChange,
    pub reply: oneshot::Sender<Result<(), AdminError>>,
}
