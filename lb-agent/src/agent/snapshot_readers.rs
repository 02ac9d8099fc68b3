//! Answers snapshot readers (API, status page, `lb-agent status`, metrics scrape): the
//! snapshot is built when they ask, not after every change, and at most once per
//! [`snapshot_interval`] unless an admin change must show at once.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Agent, Neighbors, snapshot_interval};
use crate::{api::SnapshotRequest, dataplane::Dataplane, probe::Prober, status::Snapshot};

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

impl<D: Dataplane, P: Prober, N: Neighbors> Agent<D, P, N> {
    /// A reader asks for the snapshot: answered now, or at [`Agent::readers_deadline`].
    pub fn on_snapshot_request(&mut self, reply: SnapshotRequest) {
        self.snapshot_readers.push(reply);
        self.answer_readers();
    }

    /// When waiting readers are due their answer (`None`: nobody waits); call
    /// [`Agent::answer_readers`] then.
    pub fn readers_deadline(&self) -> Option<Instant> {
        if self.snapshot_readers.is_empty() {
            return None;
        }
        Some(match self.read_answer(Instant::now()) {
            ReadAnswer::WaitUntil(due) => due,
            ReadAnswer::Cached | ReadAnswer::Rebuild => Instant::now(),
        })
    }

    /// Moves pending events into the shared log and answers the readers that are due
    /// (call it after every turn of the loop).
    pub fn answer_readers(&mut self) {
        self.flush_events();
        if self.snapshot_readers.is_empty() {
            return;
        }
        match self.read_answer(Instant::now()) {
            ReadAnswer::WaitUntil(_) => return,
            ReadAnswer::Rebuild => self.publish_snapshot(),
            ReadAnswer::Cached => {}
        }
        let snap: Arc<Snapshot> = self.snapshot_tx.borrow().clone();
        for reply in self.snapshot_readers.drain(..) {
            let _ = reply.send(snap.clone());
        }
    }

    /// How many snapshots were built so far (tests check which changes build one).
    pub fn snapshot_builds(&self) -> u64 {
        self.snapshot_builds
    }

    fn read_answer(&self, now: Instant) -> ReadAnswer {
        let Some(built) = self.snapshot_built else {
            return ReadAnswer::Rebuild;
        };
        let due = built + snapshot_interval(self.snapshot_cost);
        if self.snapshot_forced || due <= now {
            ReadAnswer::Rebuild
        } else if self.snapshot_dirty {
            ReadAnswer::WaitUntil(due)
        } else {
            ReadAnswer::Cached
        }
    }
}

impl<D: Dataplane, P: Prober, N: Neighbors> Agent<D, P, N> {
    /// The snapshot a build that reuses no record would publish now (tests compare it
    /// with the incremental one; benchmarks time it).
    pub fn snapshot_from_scratch(&self) -> Snapshot {
        super::snapshot::build_from_scratch(self)
    }

    /// Server records the last snapshot build made anew (the others were reused).
    pub fn snapshot_records_rebuilt(&self) -> usize {
        self.snapshot_records.borrow().rebuilt
    }
}
