//! The agent's event loop, the one `lb-agent run` runs and the agent tests step: it
//! owns the [`Agent`] and its inputs (probe reports, deadlines, API requests, signals,
//! passive events, MAC updates, the attachment watch, BGP sessions, DNS re-resolution
//! and its own timers) and hands each input to the agent on one task.
//!
//! Everything from outside comes in through [`Inputs`]: channels, and small traits
//! ([`Signals`], [`PassiveEvents`], [`AttachmentWatch`], [`ConfigSource`]) that production
//! implements over the kernel and tests over what they script.

mod inputs;
mod reload;
mod wake;

use std::{ops::ControlFlow, time::Duration};

use tokio::{
    sync::{mpsc, watch},
    time::{Instant, Interval, interval},
};
use tracing::warn;
use wake::{next_bgp, next_or_pending, sleep_until};

pub use inputs::{AttachmentWatch, PassiveEvents, Signal, Signals, UnixSignals};
pub use reload::{ConfigFile, ConfigSource, log_passive_gaps};
pub use wake::Wake;

use lb_common::events::ConnEvent;

use crate::{
    agent::{Agent, Neighbours},
    announce::bird_sessions,
    api::{AdminRequest, ReloadOutcome, ReloadRequest, SnapshotRequest},
    cluster::Change,
    config::{self, AgentConfig},
    dataplane::Dataplane,
    neighbour::nexthops::NeighbourChanges,
    probe::{ProbeReport, Prober},
    publish::PublishError,
};

/// Probe reports handled (and published) together at most.
pub const REPORT_BATCH: usize = 256;
/// How often data-plane counters are read (passive success, idle mode, status).
pub const STATS_EVERY: Duration = Duration::from_millis(500);
/// How often unknown MACs are retried.
pub const MAC_RETRY: Duration = Duration::from_secs(2);
/// Cluster mode: how often this node's active nat connections are refreshed at the peers
/// (well within the shortest idle time a replica lives, docs/internals/cluster-sync.md).
pub const CLUSTER_REFRESH: Duration = Duration::from_secs(2);

/// What the loop is fed.
pub struct Inputs<S, E, W> {
    /// Probe reports (the agent's [`crate::agent::Handles::reports`]).
    pub reports: mpsc::Receiver<ProbeReport>,
    /// Runtime admin changes from the API.
    pub admin: mpsc::Receiver<AdminRequest>,
    /// Readers of the snapshot (the API builds it on demand).
    pub snapshots: mpsc::Receiver<SnapshotRequest>,
    /// Reloads asked through the API.
    pub reloads: mpsc::Receiver<ReloadRequest>,
    /// The neighbour watch's changes: backends' MACs, neighbours that moved.
    pub neighbour_changes: mpsc::Receiver<NeighbourChanges>,
    /// BGP session status, when BIRD is polled.
    pub bgp: Option<watch::Receiver<bird_sessions::Sessions>>,
    pub signals: S,
    /// The data plane's passive events, when it has a stream of them.
    pub passive_events: Option<E>,
    /// Cluster mode: the data plane's connection events (this node's connections).
    pub conn_events: Option<mpsc::Receiver<Vec<ConnEvent>>>,
    /// Cluster mode: the replicas the peers sent, to install or remove
    /// ([`crate::cluster::Cluster::take_changes`]).
    pub cluster_changes: Option<mpsc::UnboundedReceiver<Vec<Change>>>,
    pub attachment: W,
    /// What a reload reads.
    pub config: Box<dyn ConfigSource>,
    /// How often systemd's watchdog is pinged (`WatchdogSec=`), when it watches.
    pub watchdog: Option<Duration>,
}

/// Why the loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// A stop signal: the program stays attached for the next agent.
    Stopped,
    /// The data plane is not ours any more: the agent cannot serve.
    DataplaneLost,
}

/// The loop's own periods.
struct Timers {
    stats: Interval,
    mac_retry: Interval,
    watchdog: Option<Interval>,
    /// Only when announcing with a lifetime.
    announce_refresh: Option<Interval>,
    /// Only in cluster mode.
    cluster_refresh: Option<Interval>,
}

/// The agent and everything that drives it.
pub struct EventLoop<D: Dataplane, P: Prober, N: Neighbours, S, E, W> {
    agent: Agent<D, P, N>,
    inputs: Inputs<S, E, W>,
    timers: Timers,
    /// The `[agent]` table in force: a reload cannot change it.
    running: AgentConfig,
}

impl<D, P, N, S, E, W> EventLoop<D, P, N, S, E, W>
where
    D: Dataplane,
    P: Prober,
    N: Neighbours,
    S: Signals,
    E: PassiveEvents,
    W: AttachmentWatch<D>,
{
    /// The loop around `agent`, which runs with the `[agent]` table `running` (inside a
    /// tokio runtime: the timers start now).
    pub fn new(agent: Agent<D, P, N>, running: AgentConfig, inputs: Inputs<S, E, W>) -> Self {
        // The first tick is at once, so a restart refreshes what the previous run
        // announced before anything else.
        let announce_refresh = match (&running.announce_interface, running.announce_lifetime) {
            (Some(_), Some(lifetime)) => Some(interval(config::announce_refresh_every(lifetime))),
            _ => None,
        };
        let timers = Timers {
            stats: interval(STATS_EVERY),
            mac_retry: interval(MAC_RETRY),
            watchdog: inputs.watchdog.map(interval),
            announce_refresh,
            cluster_refresh: inputs
                .cluster_changes
                .is_some()
                .then(|| interval(CLUSTER_REFRESH)),
        };
        EventLoop {
            agent,
            inputs,
            timers,
            running,
        }
    }

    pub fn agent(&self) -> &Agent<D, P, N> {
        &self.agent
    }

    pub fn agent_mut(&mut self) -> &mut Agent<D, P, N> {
        &mut self.agent
    }

    /// Runs until a stop signal, or until the data plane is lost.
    pub async fn run(&mut self) -> Exit {
        loop {
            if let ControlFlow::Break(exit) = self.turn().await {
                return exit;
            }
        }
    }

    /// One turn: waits for an input and handles it.
    async fn turn(&mut self) -> ControlFlow<Exit, Result<(), PublishError>> {
        let wake = self.wait().await;
        self.handle(wake).await
    }

    /// Waits for the next input: one `select!` over every input. Cancel-safe (a caller may
    /// race it against its own timer): what it took is in the returned [`Wake`].
    pub async fn wait(&mut self) -> Wake {
        let EventLoop {
            agent,
            inputs,
            timers,
            ..
        } = self;
        let deadline = agent.next_deadline();
        let readers = agent.readers_deadline();
        let unknown_macs = agent.has_unknown_macs();
        tokio::select! {
            signal = inputs.signals.next() => Wake::Signal(signal),
            Some(reply) = inputs.reloads.recv() => Wake::ReloadRequest(reply),
            Some(report) = inputs.reports.recv() => {
                // Take what else is queued: one publish for a burst of verdicts.
                let mut batch = vec![report];
                while batch.len() < REPORT_BATCH {
                    match inputs.reports.try_recv() {
                        Ok(r) => batch.push(r),
                        Err(_) => break,
                    }
                }
                Wake::Reports(batch)
            }
            batch = next_or_pending(inputs.passive_events.as_mut().map(E::next_batch)) => {
                Wake::PassiveEvents(batch)
            }
            Some(batch) = next_or_pending(inputs.conn_events.as_mut().map(mpsc::Receiver::recv)) => {
                Wake::ConnEvents(batch)
            }
            Some(changes) = next_or_pending(
                inputs.cluster_changes.as_mut().map(mpsc::UnboundedReceiver::recv)
            ) => Wake::ClusterChanges(changes),
            _ = next_or_pending(timers.cluster_refresh.as_mut().map(Interval::tick)) => {
                Wake::ClusterRefresh
            }
            Some(req) = inputs.admin.recv() => Wake::Admin(req),
            _ = sleep_until(deadline) => Wake::Deadline,
            Some(reply) = inputs.snapshots.recv() => Wake::SnapshotRequest(reply),
            _ = sleep_until(readers) => Wake::ReadersDue,
            _ = timers.stats.tick() => Wake::Stats,
            _ = timers.mac_retry.tick(), if unknown_macs => Wake::MacRetry,
            Some(changes) = inputs.neighbour_changes.recv() => Wake::NeighbourChanges(changes),
            _ = next_or_pending(timers.watchdog.as_mut().map(Interval::tick)) => Wake::Watchdog,
            _ = next_or_pending(timers.announce_refresh.as_mut().map(Interval::tick)) => {
                Wake::AnnounceRefresh
            }
            _ = inputs.attachment.due() => Wake::AttachmentCheck,
            _ = agent.resolve_ready() => Wake::ResolveDue,
            sessions = next_bgp(&mut inputs.bgp) => Wake::Bgp(sessions),
        }
    }

    /// Hands what woke the loop to the agent, then answers the snapshot readers whose
    /// wait is over. A failed publish is logged (the loop goes on) and returned as well.
    pub async fn handle(&mut self, wake: Wake) -> ControlFlow<Exit, Result<(), PublishError>> {
        let agent = &mut self.agent;
        let published = match wake {
            Wake::Signal(Signal::Stop) => return ControlFlow::Break(Exit::Stopped),
            Wake::Signal(Signal::Reload) => {
                let _ = self.reload().await;
                Ok(())
            }
            Wake::ReloadRequest(reply) => {
                let _ = reply.send(self.reload().await);
                Ok(())
            }
            Wake::Reports(batch) => agent.on_probe_reports(batch),
            Wake::PassiveEvents(Ok(batch)) => agent.on_passive_events(&batch),
            Wake::PassiveEvents(Err(err)) => {
                warn!(error = %err, "event ring buffer failed; passive events stop");
                self.inputs.passive_events = None;
                Ok(())
            }
            Wake::Admin(req) => {
                agent.on_admin(req).await;
                Ok(())
            }
            Wake::ConnEvents(batch) => {
                agent.on_conn_events(&batch);
                Ok(())
            }
            Wake::ClusterChanges(changes) => {
                agent.on_cluster_changes(changes).await;
                Ok(())
            }
            Wake::ClusterRefresh => {
                agent.refresh_cluster().await;
                Ok(())
            }
            Wake::Deadline => agent.on_tick(Instant::now()),
            Wake::SnapshotRequest(reply) => {
                agent.on_snapshot_request(reply);
                Ok(())
            }
            Wake::ReadersDue => Ok(()),
            Wake::Stats => {
                agent.poll_stats();
                Ok(())
            }
            Wake::MacRetry => agent.retry_macs().await,
            Wake::NeighbourChanges(changes) => agent.on_neighbour_changes(&changes),
            Wake::Watchdog => {
                tell_systemd("WATCHDOG=1");
                Ok(())
            }
            Wake::AnnounceRefresh => {
                agent.refresh_announcements();
                Ok(())
            }
            Wake::AttachmentCheck => {
                match self.inputs.attachment.check(agent.dataplane_mut()) {
                    Ok(Some(status)) => agent.set_xdp_mode(&status),
                    Ok(None) => {}
                    Err(_) => return ControlFlow::Break(Exit::DataplaneLost),
                }
                Ok(())
            }
            Wake::ResolveDue => agent.reresolve().await,
            Wake::Bgp(sessions) => {
                agent.set_bgp_sessions(sessions);
                Ok(())
            }
        };
        if let Err(err) = &published {
            warn!(error = %err, "publishing to the data plane failed");
        }
        self.agent.answer_readers();
        ControlFlow::Continue(published)
    }

    /// Re-reads the configuration and applies it as a diff (what SIGHUP and the API's
    /// reload do); an invalid configuration leaves the running one in force.
    async fn reload(&mut self) -> Result<ReloadOutcome, String> {
        reload::reload(&mut self.agent, self.inputs.config.as_ref(), &self.running).await
    }
}

/// Sends `state` to systemd when it started the agent as `Type=notify`; a failure is
/// logged (systemd then times the start out, or the watchdog fires).
pub fn tell_systemd(state: &str) {
    if let Err(err) = crate::sd_notify::notify(state) {
        warn!(error = %err, state, "notifying systemd failed");
    }
}
