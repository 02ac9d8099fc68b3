//! Answers snapshot readers (API, status page, `lb-agent status`, metrics scrape): the
//! snapshot is built when they ask, not after every change, and at most once per
//! [`snapshot_interval`] unless an admin change must show at once.

use std::sync::Arc;

use tokio::time::Instant;

use super::{SnapshotCache, Sources, snapshot_interval};
use crate::{api::SnapshotRequest, dataplane::Dataplane, view::Snapshot};

/// What a reader asking now gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadAnswer {
    /// The last snapshot: nothing changed since, and its counters are recent.
    Cached,
    /// A rebuild, now.
    Rebuild,
    /// A rebuild once the last one is [`snapshot_interval`] old (state changed since).
    WaitUntil(Instant),
}

impl SnapshotCache {
    /// `reply` waits for the snapshot until [`SnapshotCache::answer_readers`] answers it.
    pub fn wait(&mut self, reply: SnapshotRequest) {
        self.readers.push(reply);
    }

    /// When waiting readers are due their answer (`None`: nobody waits).
    pub fn readers_deadline(&self) -> Option<Instant> {
        if self.readers.is_empty() {
            return None;
        }
        Some(match self.read_answer(Instant::now()) {
            ReadAnswer::WaitUntil(due) => due,
            ReadAnswer::Cached | ReadAnswer::Rebuild => Instant::now(),
        })
    }

    /// Answers the readers that are due, rebuilding from `sources` first if the last
    /// snapshot is not the one they must get.
    pub fn answer_readers<D: Dataplane>(&mut self, sources: &Sources<'_, D>) {
        if self.readers.is_empty() {
            return;
        }
        match self.read_answer(Instant::now()) {
            ReadAnswer::WaitUntil(_) => return,
            ReadAnswer::Rebuild => self.rebuild(sources),
            ReadAnswer::Cached => {}
        }
        let snap: Arc<Snapshot> = self.tx.borrow().clone();
        for reply in self.readers.drain(..) {
            let _ = reply.send(snap.clone());
        }
    }

    fn read_answer(&self, now: Instant) -> ReadAnswer {
        let Some(built) = self.built else {
            return ReadAnswer::Rebuild;
        };
        let due = built + snapshot_interval(self.cost);
        if self.forced || due <= now {
            ReadAnswer::Rebuild
        } else if self.dirty {
            ReadAnswer::WaitUntil(due)
        } else {
            ReadAnswer::Cached
        }
    }
}
