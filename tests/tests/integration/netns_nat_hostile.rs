//! Hostile input against nat source ports, end to end.
//!
//! Row 2: a flood of SYNs from spoofed, unrouted sources toward a nat VIP. The backends answer every one (their SYN-ACKs go back to the client's
//! segment and are dropped there, and they retransmit them for a minute); with 100
//! source ports per backend the flood takes every port. Those entries are half-open:
//! they must give their ports back within seconds (docs/nat-ports.md, row 2), after
//! which every legitimate connection succeeds. Before the lifecycle, a backend's SYN-ACK
//! alone marked the port established and held it 900 s.
//!
//! Row 3: one client sends thousands of one-datagram UDP flows; its source bucket cuts
//! them, and another client's queries keep getting source ports.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
    time::Duration,
};

use lb_tests::{
    agent::{
        api::Api,
        daemon::{Proto, Service},
    },
    net::topology::{Forwarding, HOST_IF},
    scenario::balance::{self, BACKEND_UDP_PORT},
    traffic::{
        clients, inject,
        packet::{Frame, TCP_SYN},
    },
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Enough that every (address, port) pair is taken: 3 backends x 100 ports, and a SYN
/// that finds its 8 candidates taken is dropped.
const SPOOFED: u16 = 3_000;
/// Half-open entries come back 8.6 s after their SYN (`NAT_HALF_OPEN_REUSE`).
const HALF_OPEN: Duration = Duration::from_millis(8_600);
const DEADLINE: Duration = Duration::from_secs(60);

/// The data plane's counter `name` from the agent's `/metrics`.
fn counter(api: &Api, name: &str) -> u64 {
    let text = api
        .request_ok("GET", "/metrics", None)
        .expect("GET /metrics");
    lb_tests::agent::api::counter(&text, name).unwrap_or_else(|| panic!("no {name} in /metrics"))
        as u64
}

#[test]
fn spoofed_syn_flood_gives_its_ports_back_within_seconds() {
    let bed = balance::Testbed::start(Forwarding::Nat, 62, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let mut service = balance::tcp_service(topo, &balance::weighted(topo, &[1, 1, 1]));
    service.snat_ports = Some("20000-20099".into());
    let vip = service.vip;
    let agent = balance::start_agent(topo, vec![service], None).expect("starting lb-agent");

    let client = topo.client();
    let lb_mac = topo.lb().mac.0;
    let frames: Vec<Vec<u8>> = (0..SPOOFED)
        .map(|i| {
            let src = IpAddr::V4(Ipv4Addr::new(198, 18, (i >> 8) as u8, i as u8));
            Frame::tcp(src, 30_000 + i, vip.ip(), vip.port(), TCP_SYN)
                .macs(client.mac.0, lb_mac)
                .bytes()
        })
        .collect();
    inject::send_frames(&client.ns, HOST_IF, &frames, Duration::ZERO)
        .expect("sending the spoofed SYNs");

    // Every pair is held by a half-open entry: the rest of the flood found none.
    let api = Api::new(&topo.lb().ns);
    // The agent reads the data-plane counters twice a second.
    std::thread::sleep(Duration::from_millis(1_500));
    let refused = counter(&api, "drop_nat_ports");
    assert!(
        refused >= 1_000,
        "the flood must take every source pair (drop_nat_ports {refused})"
    );
    // Past the half-open time (counted from the flood, plus margin for the coarse clock).
    std::thread::sleep(HALF_OPEN + Duration::from_millis(500));
    let reclaimed_before = counter(&api, "nat_port_reclaimed");
    let after = clients::tcp_names(&client.ns, client.ipv4.into(), 11_000, vip, 100, DEADLINE)
        .expect("entering the client namespace");
    std::thread::sleep(Duration::from_millis(1_500));
    let reclaimed = counter(&api, "nat_port_reclaimed") - reclaimed_before;
    println!(
        "{SPOOFED} spoofed SYNs over 300 source pairs (drop_nat_ports {refused}); {:.1} s \
         later {} of 100 legitimate connections answered, {reclaimed} on reclaimed pairs",
        HALF_OPEN.as_secs_f64() + 2.0,
        after.answered()
    );
    agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(
        reclaimed >= 50,
        "the flood's pairs were reclaimed ({reclaimed})"
    );
    assert_eq!(
        after.answered(),
        100,
        "every legitimate connection once the half-open entries expired: {:?}",
        after.failures
    );
}

#[test]
fn one_clients_udp_flood_leaves_ports_for_others() {
    const FLOOD: u16 = 2_500;
    let bed = balance::Testbed::start(Forwarding::Nat, 63, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &[1, 1, 1]);
    let mut service = Service::on(
        topo,
        "dns",
        Proto::Udp,
        false,
        53,
        &backends,
        BACKEND_UDP_PORT,
    );
    // 3 x 1,000 source pairs; one client may open 100 flows a second, 200 at once.
    service.snat_ports = Some("20000-20999".into());
    service.extra.push("source_rate = 100".into());
    service.extra.push("source_burst = 200".into());
    let vip = service.vip;
    let agent = balance::start_agent(topo, vec![service], None).expect("starting lb-agent");

    let client = topo.client();
    let flood_src = client.ipv4;
    let o = flood_src.octets();
    let other = Ipv4Addr::new(o[0], o[1], o[2], 60);
    client
        .ns
        .ip(&["addr", "add", &format!("{other}/24"), "dev", HOST_IF])
        .expect("a second client address");
    client
        .ns
        .run(|| -> std::io::Result<()> {
            for i in 0..FLOOD {
                let s = std::net::UdpSocket::bind((flood_src, 30_000 + i))?;
                s.send_to(b"flood", vip)?;
            }
            Ok(())
        })
        .expect("entering the client namespace")
        .expect("sending the flood");
    let api = Api::new(&topo.lb().ns);
    std::thread::sleep(Duration::from_millis(1_500));
    let limited = counter(&api, "drop_source_limit");
    let others = clients::udp_names(&client.ns, other.into(), 12_000, vip, 100, DEADLINE)
        .expect("entering the client namespace");
    println!(
        "{FLOOD} one-datagram UDP flows from one client: drop_source_limit {limited}; \
         another client: {} of 100 queries answered",
        others.answered()
    );
    agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(
        limited >= u64::from(FLOOD) - 1_000,
        "the flooding client is held to its bucket (drop_source_limit {limited})"
    );
    assert_eq!(
        others.answered(),
        100,
        "another client gets source ports: {:?}",
        others.failures
    );
}
