//! How handlers get the operator's [`Snapshot`]: asked of the agent loop, which builds
//! it on demand (cached for a short interval), or a fixed one for tests.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use crate::view::Snapshot;

/// A reader's request: the agent answers with a snapshot that shows every change made
/// before the request (counters at most one rebuild interval old).
pub type SnapshotRequest = oneshot::Sender<Arc<Snapshot>>;

/// Where handlers read the snapshot from.
#[derive(Clone)]
pub struct SnapshotSource {
    /// The last snapshot built (answer when the agent does not).
    latest: watch::Receiver<Arc<Snapshot>>,
    /// The agent loop; `None`: serve `latest` as it is.
    agent: Option<mpsc::Sender<SnapshotRequest>>,
}

impl SnapshotSource {
    /// Asks `agent` for a snapshot at every read; `latest` is what the agent last built.
    pub fn on_demand(
        latest: watch::Receiver<Arc<Snapshot>>,
        agent: mpsc::Sender<SnapshotRequest>,
    ) -> Self {
        Self {
            latest,
            agent: Some(agent),
        }
    }

    /// Serves whatever `latest` holds (for tests and tools that publish it themselves).
    pub fn fixed(latest: watch::Receiver<Arc<Snapshot>>) -> Self {
        Self {
            latest,
            agent: None,
        }
    }

    /// A snapshot showing every change made before this call; the last one built if the
    /// agent is gone (shutting down).
    pub async fn get(&self) -> Arc<Snapshot> {
        if let Some(agent) = &self.agent {
            let (reply, answer) = oneshot::channel();
            if agent.send(reply).await.is_ok()
                && let Ok(snap) = answer.await
            {
                return snap;
            }
        }
        self.latest.borrow().clone()
    }
}

impl From<watch::Receiver<Arc<Snapshot>>> for SnapshotSource {
    fn from(latest: watch::Receiver<Arc<Snapshot>>) -> Self {
        Self::fixed(latest)
    }
}
