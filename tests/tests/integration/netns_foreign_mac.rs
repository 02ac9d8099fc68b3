//! End to end: frames for the VIP addressed to a foreign unicast MAC (as a
//! switch floods unknown unicast) reach the attached lb, which must pass them untouched
//! (`pass_not_for_host`), so the switch never learns the foreign MAC on lb's port. The
//! same frames addressed to lb's MAC are balanced: the agent gave the program the
//! interface's MAC at attach.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::api::{self, Api},
    net::topology::{BRIDGE, Forwarding, HOST_IF},
    scenario::balance,
    traffic::{
        inject,
        packet::{Frame, TCP_SYN},
    },
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const FOREIGN_MAC: [u8; 6] = [0x02, 0x66, 0, 0, 0, 0x01];
const FRAMES: u16 = 20;
const DEADLINE: Duration = Duration::from_secs(15);

fn counter(api: &Api, name: &str) -> f64 {
    let text = api.metrics().expect("GET /metrics");
    api::counter(&text, name).unwrap_or(0.0)
}

/// Polls the counter until it reached `at_least` or the deadline passed; its last value.
fn wait_counter(api: &Api, name: &str, at_least: f64) -> f64 {
    let start = Instant::now();
    loop {
        let v = counter(api, name);
        if v >= at_least || start.elapsed() > DEADLINE {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn frames_for_a_foreign_mac_are_not_balanced() {
    let bed = balance::Testbed::start(Forwarding::Dsr, 150, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &balance::WEIGHTS);
    let service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let agent = balance::start_agent(topo, vec![service], None).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let client = topo.client();
    let syns = |first_port: u16, dst_mac: [u8; 6]| -> Vec<Vec<u8>> {
        (0..FRAMES)
            .map(|i| {
                Frame::tcp(
                    client.ipv4.into(),
                    first_port + i,
                    vip.ip(),
                    vip.port(),
                    TCP_SYN,
                )
                .macs(client.mac.0, dst_mac)
                .bytes()
            })
            .collect()
    };

    let before = counter(&api, "pass_not_for_host");
    let tx_before = counter(&api, "tx_dsr");
    inject::send_frames(
        &client.ns,
        HOST_IF,
        &syns(31_000, FOREIGN_MAC),
        Duration::ZERO,
    )
    .expect("sending the foreign-MAC SYNs");
    let passed = wait_counter(&api, "pass_not_for_host", before + f64::from(FRAMES));
    assert!(
        passed >= before + f64::from(FRAMES),
        "all {FRAMES} SYNs to the foreign MAC must count pass_not_for_host (went {before} -> {passed})"
    );
    // (Multicast on the segment counts pass_not_for_host too: tx_dsr is the sharp check.)
    let tx = counter(&api, "tx_dsr");
    assert_eq!(
        tx, tx_before,
        "no SYN to the foreign MAC may be balanced (tx_dsr {tx_before} -> {tx})"
    );
    let fdb = topo
        .switch()
        .run(|| {
            Command::new("bridge")
                .args(["fdb", "show", "br", BRIDGE])
                .output()
        })
        .expect("entering the switch namespace")
        .expect("running bridge fdb show");
    let fdb = String::from_utf8_lossy(&fdb.stdout);
    let foreign = "02:66:00:00:00:01";
    assert!(
        !fdb.lines().any(|l| l.starts_with(foreign)),
        "the switch learned the foreign MAC {foreign} (lb sent frames from it):\n{fdb}"
    );

    let before = counter(&api, "tx_dsr");
    inject::send_frames(
        &client.ns,
        HOST_IF,
        &syns(32_000, topo.lb().mac.0),
        Duration::ZERO,
    )
    .expect("sending SYNs to lb's MAC");
    let forwarded = wait_counter(&api, "tx_dsr", before + f64::from(FRAMES));
    assert!(
        forwarded >= before + f64::from(FRAMES),
        "the same SYNs to lb's own MAC must be balanced (tx_dsr {before} -> {forwarded})"
    );

    let status = agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(status.success(), "lb-agent should exit 0, got {status}");
}
