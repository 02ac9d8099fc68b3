//! Hitless restart with `pin_path` set to a bpffs shared with the host (the optional
//! pins, docs/restarts.md; restarts adopt through the interface either way, see
//! netns_restart_netns_exec.rs). A long-lived TCP connection and a steady stream of new
//! connections through the VIP see zero failures across SIGTERM + restart, SIGKILL +
//! restart, and a reload that adds and removes servers. In nat (replies translated by
//! the adopted NAT state) and in dsr.

use std::{path::Path, thread, time::Duration};

use lb_tests::{
    agent::{
        bpffs::PrivateBpffs,
        daemon::{Agent, AgentConfig, locate_binary},
    },
    net::topology::Forwarding,
    scenario::{
        balance::{self, WEIGHTS},
        restart::{Stream, assert_stream_clean, echoes, reload_out_and_back, sigkill},
    },
    traffic::clients::EchoConn,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const START: Duration = Duration::from_secs(30);

fn hitless(forwarding: Forwarding, subnet: u8) {
    let mode = forwarding.as_str();
    let bed = balance::Testbed::start(forwarding, subnet, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let pins = PrivateBpffs::mount(mode).expect("mounting a bpffs for the pins");
    let mut config = AgentConfig::new(vec![service.clone()]);
    config.pin_path = pins.pins().display().to_string();
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
    echoes(
        &mut conn,
        "after SIGTERM, before restart",
        mode,
        "while the agent is down",
    );
    let agent = start(&config);
    echoes(&mut conn, "after restart", mode, "after restart");
    thread::sleep(Duration::from_millis(300));

    // 2. SIGKILL (no chance to clean up), then a new agent.
    sigkill(agent);
    echoes(&mut conn, "after SIGKILL", mode, "after SIGKILL");
    let agent = start(&config);
    thread::sleep(Duration::from_millis(300));

    // 3. A reload that removes one server (not the long-lived connection's) and adds it
    //    back under a different weight.
    reload_out_and_back(&agent, topo, (&config, &service), &kept, &mut conn, mode);

    let tally = stream.finish();
    println!(
        "{mode}: {} new connections across SIGTERM+restart, SIGKILL+restart and two reloads \
         in {:?}: {} failed; long-lived connection to {kept} kept",
        tally.attempted,
        tally.elapsed,
        tally.failures.len()
    );
    assert_stream_clean(&tally, mode);
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
