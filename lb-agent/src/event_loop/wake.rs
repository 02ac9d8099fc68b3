//! What wakes the event loop ([`Wake`]), and the waits on inputs that may be absent.

use std::future::Future;

use lb_common::events::{ConnEvent, PassiveEvent};
use tokio::time::Instant;

use super::Signal;
use crate::{
    announce::bird_sessions,
    api::{AdminRequest, ReloadRequest, SnapshotRequest},
    cluster::Change,
    dataplane::DataplaneError,
    neighbour::nexthops::NeighbourChanges,
    probe::ProbeReport,
};

/// One input that is ready, as [`super::EventLoop::wait`] took it.
#[derive(Debug)]
pub enum Wake {
    Signal(Signal),
    /// A reload asked through the API, answered with its outcome.
    ReloadRequest(ReloadRequest),
    /// Probe reports, as many as were queued (at most [`super::REPORT_BATCH`]).
    Reports(Vec<ProbeReport>),
    PassiveEvents(Result<Vec<PassiveEvent>, DataplaneError>),
    /// Cluster mode: this node's connections established or ended.
    ConnEvents(Vec<ConnEvent>),
    /// Cluster mode: replicas to install or remove.
    ClusterChanges(Vec<Change>),
    /// Cluster mode: time to refresh this node's active connections at the peers.
    ClusterRefresh,
    Admin(AdminRequest),
    /// The agent's next deadline came.
    Deadline,
    SnapshotRequest(SnapshotRequest),
    /// Readers of the snapshot waited long enough.
    ReadersDue,
    /// Time to read the data plane's counters.
    Stats,
    /// Time to resolve the MACs still unknown.
    MacRetry,
    /// The neighbour watch reported changes.
    NeighbourChanges(NeighbourChanges),
    /// Time to tell systemd the loop runs.
    Watchdog,
    /// Time to renew the announced routes' lifetime.
    AnnounceRefresh,
    /// Time to check the program's attachment.
    AttachmentCheck,
    /// DNS re-resolution has work.
    ResolveDue,
    Bgp(bird_sessions::Sessions),
}

pub(super) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `future`'s output; pending forever without one (an input that is not there).
pub(super) async fn next_or_pending<T>(future: Option<impl Future<Output = T>>) -> T {
    match future {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// The next BGP status read (pending forever without BIRD polling, or once it stopped).
pub(super) async fn next_bgp(
    rx: &mut Option<tokio::sync::watch::Receiver<bird_sessions::Sessions>>,
) -> bird_sessions::Sessions {
    let Some(rx) = rx else {
        return std::future::pending().await;
    };
    match rx.changed().await {
        Ok(()) => rx.borrow_and_update().clone(),
        Err(_) => std::future::pending().await,
    }
}
