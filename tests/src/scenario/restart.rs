//! Pieces the restart and reload scenarios share: a steady stream of new connections
//! run across restarts, the reload that takes one server out and back, and the checks
//! on what the stream and a short batch of connections saw.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    agent::daemon::{Agent, AgentConfig, RELOAD_TIMEOUT, Service},
    net::topology::{Host, Topology},
    scenario::balance::BACKEND_TCP_PORT,
    traffic::clients::{EchoConn, Tally, tcp_names},
};

/// Pause between two new connections of the steady stream.
pub const PACE: Duration = Duration::from_millis(5);
/// Upper bound on the steady stream, whatever happens.
pub const STREAM_LIMIT: Duration = Duration::from_secs(90);
/// Connections of a [`assert_served`] batch.
const BATCH: usize = 20;
/// Time allowed for a [`assert_served`] batch.
const BATCH_DEADLINE: Duration = Duration::from_secs(10);

/// New connections, one every [`PACE`], from the client namespace until told to stop.
pub struct Stream {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Tally>,
}

impl Stream {
    pub fn start(topo: &Topology, vip: SocketAddr) -> Stream {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let ns = topo.client().ns.clone();
        let src = topo.client().ipv4.into();
        let handle = thread::spawn(move || {
            let started = Instant::now();
            let mut total = Tally::default();
            let mut i: u32 = 0;
            while !flag.load(Ordering::Relaxed) && started.elapsed() < STREAM_LIMIT {
                // Fresh source ports: no TIME_WAIT reuse between connections.
                let port = 30_000 + (i % 30_000) as u16;
                i += 1;
                let one = tcp_names(&ns, src, port, vip, 1, Duration::from_secs(5))
                    .expect("entering the client namespace");
                total.attempted += one.attempted;
                total.failures.extend(one.failures);
                for (name, n) in one.counts {
                    *total.counts.entry(name).or_default() += n;
                }
                thread::sleep(PACE);
            }
            total.elapsed = started.elapsed();
            total
        });
        Stream { stop, handle }
    }

    /// Stops the stream and returns what it saw.
    pub fn finish(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("the stream thread")
    }
}

/// A backend other than `kept` (by name), with its TCP server's address.
pub fn other_backend<'t>(topo: &'t Topology, kept: &str) -> (&'t Host, SocketAddr) {
    let other = topo
        .backends()
        .iter()
        .find(|b| b.role != kept)
        .expect("a second backend");
    (other, SocketAddr::new(other.ipv4.into(), BACKEND_TCP_PORT))
}

/// Two SIGHUP reloads: a server other than `kept` out of `service`, then `config` again;
/// `conn` must still echo afterwards. Panics prefixed with `mode`.
pub fn reload_out_and_back(
    agent: &Agent,
    topo: &Topology,
    (config, service): (&AgentConfig, &Service),
    kept: &str,
    conn: &mut EchoConn,
    mode: &str,
) {
    let (_, removed_addr) = other_backend(topo, kept);
    let mut smaller = config.clone();
    smaller.services = vec![service.without(removed_addr)];
    agent
        .reload(&smaller, RELOAD_TIMEOUT)
        .unwrap_or_else(|e| panic!("{mode}: reload removing {removed_addr}: {e}"));
    thread::sleep(Duration::from_millis(300));
    agent
        .reload(config, RELOAD_TIMEOUT)
        .unwrap_or_else(|e| panic!("{mode}: reload adding {removed_addr} back: {e}"));
    thread::sleep(Duration::from_millis(300));
    echoes(conn, "after the reloads", mode, "after reloads");
}

/// `conn` still echoes `step`, or a panic `"{mode}: long-lived connection {when}: {e}"`.
pub fn echoes(conn: &mut EchoConn, step: &str, mode: &str, when: &str) {
    conn.check_echo(step)
        .unwrap_or_else(|e| panic!("{mode}: long-lived connection {when}: {e}"));
}

/// SIGKILL (no chance to clean up), then 300 ms of traffic with no agent.
pub fn sigkill(agent: Agent) {
    agent
        .process()
        .signal(libc::SIGKILL)
        .expect("killing the agent");
    drop(agent);
    thread::sleep(Duration::from_millis(300));
}

/// The steady stream ran (more than 100 attempts) and no connection of it failed.
pub fn assert_stream_clean(tally: &Tally, mode: &str) {
    assert!(
        tally.attempted > 100,
        "{mode}: the steady stream should have run (got {} attempts)",
        tally.attempted
    );
    assert!(
        tally.failures.is_empty(),
        "{mode}: no new connection may fail across restarts and reloads, {} did: {:?}",
        tally.failures.len(),
        &tally.failures[..tally.failures.len().min(10)]
    );
}

/// Twenty new connections from the client, from `first_port` on, to `vip`: each must be
/// answered, or a panic `"{what}: [failures]"`.
pub fn assert_served(topo: &Topology, vip: SocketAddr, first_port: u16, what: &str) {
    let client = topo.client();
    let tally = tcp_names(
        &client.ns,
        client.ipv4.into(),
        first_port,
        vip,
        BATCH,
        BATCH_DEADLINE,
    )
    .expect("entering the client namespace");
    assert!(tally.failures.is_empty(), "{what}: {:?}", tally.failures);
}
