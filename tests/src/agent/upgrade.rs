//! Upgrades and rollbacks between two builds (docs/upgrades.md): where the previous
//! release's `lb-agent` is (built by `cargo xtask prev-release`), keep-alive connections
//! that exchange requests all along and check their backend each time, and the agents'
//! adoption lines.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use crate::{agent::daemon::Agent, net::topology::Topology, traffic::clients::EchoConn};

/// The previous release's commit (full hash): the file `cargo xtask prev-release` reads.
pub const PREVIOUS_RELEASE: &str = include_str!("../../previous-release");

/// Pause between two rounds of requests over the keep-alive connections.
const ROUND_PAUSE: Duration = Duration::from_millis(20);
/// Upper bounds on the keep-alive traffic, whatever happens.
const KEEPALIVE_LIMIT: Duration = Duration::from_secs(90);
const MAX_ROUNDS: u64 = 4_000;

/// The previous release's `lb-agent`: `$LB_PREV_AGENT_BIN`, else
/// `<target>/prev-release/<commit>/target/debug/lb-agent` next to this test's target
/// directory. Panics with the command that builds it when it is missing.
pub fn previous_agent() -> PathBuf {
    let commit = PREVIOUS_RELEASE.trim();
    let path = match std::env::var_os("LB_PREV_AGENT_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            // A test runs from <target>/<profile>/deps/.
            let exe = std::env::current_exe().expect("the test's own path");
            let target = exe
                .ancestors()
                .nth(3)
                .expect("a test binary under <target>/<profile>/deps")
                .to_path_buf();
            target
                .join("prev-release")
                .join(commit)
                .join("target/debug/lb-agent")
        }
    };
    assert!(
        path.is_file(),
        "the previous release's lb-agent (commit {commit}) is missing at {}: `cargo xtask \
         prev-release` builds it once (`cargo xtask test` does before the scenarios), or set \
         LB_PREV_AGENT_BIN",
        path.display()
    );
    path
}

/// What the keep-alive connections saw.
#[derive(Debug, Default)]
pub struct KeepAliveTally {
    /// Connections held.
    pub connections: usize,
    /// Requests sent over them (one echo each).
    pub requests: usize,
    /// Failed requests: an error, or an answer from another backend than the first.
    pub failures: Vec<String>,
    /// Connections whose every answer came from the backend of their first one.
    pub kept_backend: usize,
    /// Backend of each connection.
    pub backends: Vec<String>,
}

/// Keep-alive connections to one VIP that send a request (an echo) each, round after
/// round, from a thread until told to stop; every answer must come from the backend
/// that greeted the connection.
pub struct KeepAlive {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<KeepAliveTally>,
}

impl KeepAlive {
    /// Opens `n` connections from the client to `vip` (each must be answered) and starts
    /// the requests.
    pub fn start(topo: &Topology, vip: SocketAddr, n: usize) -> KeepAlive {
        let client = topo.client();
        let conns: Vec<EchoConn> = (0..n)
            .map(|i| {
                EchoConn::connect(&client.ns, client.ipv4.into(), vip)
                    .expect("entering the client namespace")
                    .unwrap_or_else(|e| panic!("keep-alive connection {i} to {vip}: {e}"))
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || run(conns, &flag));
        KeepAlive { stop, handle }
    }

    /// Stops the requests after one last round (each connection still up is checked once
    /// more, after whatever the caller did before) and returns what they saw.
    pub fn finish(self) -> KeepAliveTally {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("the keep-alive thread")
    }
}

fn run(mut conns: Vec<EchoConn>, stop: &AtomicBool) -> KeepAliveTally {
    let started = Instant::now();
    let mut tally = KeepAliveTally {
        connections: conns.len(),
        backends: conns.iter().map(|c| c.backend().to_owned()).collect(),
        ..KeepAliveTally::default()
    };
    let mut broken = vec![false; conns.len()];
    let mut round = 0u64;
    let mut one_round = |round: u64, tally: &mut KeepAliveTally| {
        for (i, conn) in conns.iter_mut().enumerate() {
            if broken[i] {
                continue;
            }
            tally.requests += 1;
            if let Err(e) = conn.check_echo(&format!("r{round}c{i}")) {
                tally
                    .failures
                    .push(format!("connection {i} at {:?}: {e}", started.elapsed()));
                // One failure ends a connection's requests (a reset one answers no more).
                broken[i] = true;
            }
        }
    };
    while !stop.load(Ordering::Relaxed) && started.elapsed() < KEEPALIVE_LIMIT && round < MAX_ROUNDS
    {
        one_round(round, &mut tally);
        round += 1;
        thread::sleep(ROUND_PAUSE);
    }
    // One more round once told to stop: a round that began before the event being
    // checked may have ended after it (a broken connection's request waits for its read
    // timeout), so without it the connections that round reached early would count as
    // kept without a request after the event.
    one_round(round, &mut tally);
    tally.kept_backend = broken.iter().filter(|b| !**b).count();
    tally
}

/// The first line of `agent`'s log containing `needle`, or a panic naming `what` with
/// the log's tail.
pub fn line_with(agent: &Agent, needle: &str, what: &str) -> String {
    agent
        .process()
        .lines()
        .into_iter()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| {
            panic!(
                "{what}: no line with {needle:?}; last lines:\n{}",
                agent.process().tail(30)
            )
        })
}
