//! The operator's snapshot ([`SnapshotCache`]): built when readers ask rather than
//! after every change (`readers.rs`), at most once per [`snapshot_interval`] unless an
//! admin change must show at once (`schedule.rs`), and incrementally, reusing every
//! server record whose inputs did not change (`build.rs`).

mod build;
mod readers;
mod schedule;

use std::{sync::Arc, time::Duration};

use tokio::{sync::watch, time::Instant};

pub(super) use build::Sources;
pub use schedule::{SNAPSHOT_DUTY, SNAPSHOT_EVERY, snapshot_interval};

use super::{Agent, Neighbours};
use crate::{api::SnapshotRequest, dataplane::Dataplane, probe::Prober, view::Snapshot};

/// The last snapshot, when it is due again, who waits for it, and what is kept between
/// builds. The agent marks it [changed](SnapshotCache::changed) when what it shows
/// changes, and lends it the other components, read-only ([`Sources`]), to rebuild.
pub(super) struct SnapshotCache {
    /// Where each build is published (`Handles::snapshot`).
    tx: watch::Sender<Arc<Snapshot>>,
    /// State changed since the last build.
    dirty: bool,
    /// When the snapshot was last built (rebuilds are at most every `snapshot_interval`).
    built: Option<Instant>,
    /// What the last build cost (wall time).
    cost: Duration,
    /// An admin change since the last build: the next read rebuilds at once (the
    /// caller's next GET must see its change).
    forced: bool,
    /// Readers waiting for a rebuild (`readers.rs`).
    readers: Vec<SnapshotRequest>,
    /// Snapshots built so far.
    builds: u64,
    /// Server status records kept between builds (`build.rs`).
    records: build::Records,
    /// Table fingerprints by service, with the table version they were computed for.
    fingerprints: build::Fingerprints,
}

impl SnapshotCache {
    /// An empty snapshot to rebuild, and the receiver readers of the channel watch.
    pub fn new() -> (Self, watch::Receiver<Arc<Snapshot>>) {
        let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
        let cache = SnapshotCache {
            tx,
            dirty: true,
            built: None,
            cost: Duration::ZERO,
            forced: false,
            readers: Vec::new(),
            builds: 0,
            records: Default::default(),
            fingerprints: Default::default(),
        };
        (cache, rx)
    }

    /// Something the snapshot shows changed: the next rebuild that is due takes it in.
    pub fn changed(&mut self) {
        self.dirty = true;
    }

    /// An admin change: the next read rebuilds the snapshot however recent it is.
    pub fn changed_by_admin(&mut self) {
        self.dirty = true;
        self.forced = true;
    }

    /// Builds the snapshot from `sources` now and publishes it.
    pub fn rebuild<D: Dataplane>(&mut self, sources: &Sources<'_, D>) {
        let started = std::time::Instant::now();
        let snap = build::build(sources, &mut self.records, &mut self.fingerprints);
        let _ = self.tx.send(Arc::new(snap));
        self.dirty = false;
        self.forced = false;
        self.builds += 1;
        self.built = Some(Instant::now());
        self.cost = started.elapsed();
    }
}

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// The snapshot cache, and what it is built from (the rest of the agent, read-only).
    fn snapshot_and_sources(&mut self) -> (&mut SnapshotCache, Sources<'_, D>) {
        let Agent {
            dp,
            env,
            services,
            publishing,
            macs,
            events,
            faults,
            announcement,
            cluster,
            snapshot,
            ..
        } = self;
        let sources = Sources {
            dp,
            env,
            services,
            publishing,
            macs: macs.known(),
            transitions: events.transitions(),
            faults,
            announcement,
            cluster: cluster.as_ref(),
        };
        (snapshot, sources)
    }

    /// Rebuilds the operator's snapshot now (`run` leaves it to readers:
    /// [`Agent::on_snapshot_request`]; tests and benchmarks call it directly).
    pub fn publish_snapshot(&mut self) {
        self.events.flush();
        let (cache, sources) = self.snapshot_and_sources();
        cache.rebuild(&sources);
    }

    /// Rebuilds the snapshot if state changed and the last one is at least
    /// [`snapshot_interval`] old (call it after each event, off the verdict-to-maps path;
    /// [`Agent::snapshot_deadline`] says when a deferred rebuild is due).
    pub fn flush_snapshot(&mut self) {
        if self.snapshot.rebuild_due(Instant::now()) {
            self.publish_snapshot();
        }
    }

    /// When a deferred snapshot rebuild is due (`None`: the snapshot is current).
    pub fn snapshot_deadline(&self) -> Option<Instant> {
        self.snapshot.deadline()
    }

    /// A reader asks for the snapshot: answered now, or at [`Agent::readers_deadline`].
    pub fn on_snapshot_request(&mut self, reply: SnapshotRequest) {
        self.snapshot.wait(reply);
        self.answer_readers();
    }

    /// When waiting readers are due their answer (`None`: nobody waits); call
    /// [`Agent::answer_readers`] then.
    pub fn readers_deadline(&self) -> Option<Instant> {
        self.snapshot.readers_deadline()
    }

    /// Moves pending events into the shared log and answers the readers that are due
    /// (call it after every turn of the loop).
    pub fn answer_readers(&mut self) {
        self.events.flush();
        let (cache, sources) = self.snapshot_and_sources();
        cache.answer_readers(&sources);
    }

    /// How many snapshots were built so far (tests check which changes build one).
    pub fn snapshot_builds(&self) -> u64 {
        self.snapshot.builds
    }

    /// The snapshot a build that reuses no record would publish now (tests compare it
    /// with the incremental one; benchmarks time it).
    pub fn snapshot_from_scratch(&mut self) -> Snapshot {
        let (cache, sources) = self.snapshot_and_sources();
        build::build_from_scratch(&sources, &cache.records, &mut cache.fingerprints)
    }

    /// Server records the last snapshot build made anew (the others were reused).
    pub fn snapshot_records_rebuilt(&self) -> usize {
        self.snapshot.records.rebuilt
    }
}
