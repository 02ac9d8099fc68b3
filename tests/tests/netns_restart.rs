//! Hitless restart with `pin_path` set to a bpffs shared with the host (the optional
//! pins, docs/restarts.md; restarts adopt through the interface either way, see
//! netns_restart_netns_exec.rs). A long-lived TCP connection and a steady stream of new
//! connections through the VIP see zero failures across SIGTERM + restart, SIGKILL +
//! restart, and a reload that adds and removes servers. In nat (replies translated by
//! the adopted NAT state) and in dsr.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{Agent, AgentConfig, RELOAD_TIMEOUT, locate_binary},
    scenario::{self, BACKEND_TCP_PORT, WEIGHTS},
    topology::{Forwarding, Topology},
    traffic::{EchoConn, Tally, tcp_names},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const START: Duration = Duration::from_secs(30);
/// Pause between two new connections of the steady stream.
const PACE: Duration = Duration::from_millis(5);
/// Upper bound on the steady stream, whatever happens.
const STREAM_LIMIT: Duration = Duration::from_secs(90);

/// A private bpffs for the test's pins, removed when the test ends (also on panic).
///
/// Not under /sys/fs/bpf: `ip netns exec` remounts /sys in a fresh mount namespace, so
/// a bpffs mounted there by the agent would vanish with it. A bpffs mounted here, in the
/// test's (root) mount namespace, is seen by the agent's namespace too.
struct PinGuard {
    mount: PathBuf,
    pins: PathBuf,
}

impl PinGuard {
    fn new(tag: &str) -> PinGuard {
        let mount = PathBuf::from(format!("/run/lbt-bpf-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&mount).expect("creating the bpffs mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&mount)
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting bpffs at {}", mount.display());
        PinGuard {
            pins: mount.join("lb"),
            mount,
        }
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        let _ = lb_agent::dataplane::pin::remove(&self.pins);
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .status();
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// New connections, one every [`PACE`], from the client namespace until told to stop.
struct Stream {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Tally>,
}

impl Stream {
    fn start(topo: &Topology, vip: SocketAddr) -> Stream {
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

    fn finish(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("the stream thread")
    }
}

fn hitless(forwarding: Forwarding, subnet: u8) {
    let mode = forwarding.as_str();
    let bed = scenario::Testbed::start(forwarding, subnet, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = scenario::weighted(topo, &WEIGHTS);
    let service = scenario::tcp_service(topo, &backends);
    let vip = service.vip;
    let pins = PinGuard::new(mode);
    let mut config = AgentConfig::new(vec![service.clone()]);
    config.pin_path = pins.pins.display().to_string();
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let start = |config: &AgentConfig| {
        Agent::start(topo, &binary, config, Some("native"), START)
            .unwrap_or_else(|e| panic!("{mode}: starting lb-agent: {e}"))
    };

    let agent = start(&config);
    let client = topo.client();
    let mut conn = EchoConn::connect(&client.ns, client.ipv4.into(), vip)
        .expect("entering the client namespace")
        .unwrap_or_else(|e| panic!("{mode}: a connection to {vip} should be answered: {e}"));
    let kept = conn.backend().to_owned();
    let stream = Stream::start(topo, vip);
    thread::sleep(Duration::from_millis(300));

    // 1. SIGTERM, then a new agent on the pinned state.
    let status = agent
        .stop(Duration::from_secs(10))
        .expect("stopping the agent");
    assert!(
        status.success(),
        "{mode}: SIGTERM should exit 0, got {status}"
    );
    thread::sleep(Duration::from_millis(300)); // traffic while no agent runs
    conn.check_echo("after SIGTERM, before restart")
        .unwrap_or_else(|e| panic!("{mode}: long-lived connection while the agent is down: {e}"));
    let agent = start(&config);
    conn.check_echo("after restart")
        .unwrap_or_else(|e| panic!("{mode}: long-lived connection after restart: {e}"));
    thread::sleep(Duration::from_millis(300));

    // 2. SIGKILL (no chance to clean up), then a new agent.
    agent
        .process()
        .signal(libc::SIGKILL)
        .expect("killing the agent");
    drop(agent);
    thread::sleep(Duration::from_millis(300));
    conn.check_echo("after SIGKILL")
        .unwrap_or_else(|e| panic!("{mode}: long-lived connection after SIGKILL: {e}"));
    let agent = start(&config);
    thread::sleep(Duration::from_millis(300));

    // 3. A reload that removes one server (not the long-lived connection's) and adds it
    //    back under a different weight.
    let removed = topo
        .backends()
        .iter()
        .find(|b| b.role != kept)
        .expect("a second backend");
    let removed_addr = SocketAddr::new(removed.ipv4.into(), BACKEND_TCP_PORT);
    let mut smaller = config.clone();
    smaller.services = vec![service.without(removed_addr)];
    agent
        .reload(&smaller, RELOAD_TIMEOUT)
        .unwrap_or_else(|e| panic!("{mode}: reload removing {removed_addr}: {e}"));
    thread::sleep(Duration::from_millis(300));
    agent
        .reload(&config, RELOAD_TIMEOUT)
        .unwrap_or_else(|e| panic!("{mode}: reload adding {removed_addr} back: {e}"));
    thread::sleep(Duration::from_millis(300));
    conn.check_echo("after the reloads")
        .unwrap_or_else(|e| panic!("{mode}: long-lived connection after reloads: {e}"));

    let tally = stream.finish();
    println!(
        "{mode}: {} new connections across SIGTERM+restart, SIGKILL+restart and two reloads \
         in {:?}: {} failed; long-lived connection to {kept} kept",
        tally.attempted,
        tally.elapsed,
        tally.failures.len()
    );
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
    let status = agent.stop(Duration::from_secs(10)).expect("stopping");
    assert!(status.success());
}

#[test]
fn restart_and_reload_under_traffic_nat() {
    hitless(Forwarding::Nat, 61);
}

#[test]
fn restart_and_reload_under_traffic_dsr() {
    hitless(Forwarding::Dsr, 62);
}
