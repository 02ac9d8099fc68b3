//! Hostile input must not cost legitimate users (the hostile-input issue), nat:
//! - 600 SYNs to the VIP from spoofed, unrouted sources (198.18.0.0/15, which no host
//!   of the topology routes), then ordinary traffic: every request answered, no server
//!   changes state;
//! - one client sending 2,500 one-datagram UDP flows (a fresh source port each), then
//!   another client's UDP queries: every one answered, no server changes state.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    path::Path,
    thread,
    time::Duration,
};

use lb_tests::{
    net::topology::{Forwarding, HOST_IF},
    scenario::realistic::{Bed, Role},
    traffic::{
        inject,
        ordinary::{Ordinary, OrdinaryConfig},
        packet::{Frame, TCP_SYN},
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const SPOOFED_SYNS: usize = 600;
const UDP_FLOWS: usize = 2_500;
const QUERIES: usize = 200;

#[test]
fn spoofed_syns_leave_legitimate_connections_alone_nat() {
    let bed = Bed::start(
        Forwarding::Nat,
        175,
        &Role::primaries(4),
        Path::new(TESTSERVER),
    );
    let start = bed.start_readings();
    let (client, lb) = (bed.topo.client(), bed.topo.lb());
    let frames: Vec<Vec<u8>> = (0..SPOOFED_SYNS)
        .map(|i| {
            let src = Ipv4Addr::new(198, 18, (i / 250) as u8, (i % 250) as u8 + 1);
            Frame::tcp(
                IpAddr::V4(src),
                1024 + i as u16,
                bed.vip.ip(),
                bed.vip.port(),
                TCP_SYN,
            )
            .macs(client.mac.0, lb.mac.0)
            .bytes()
        })
        .collect();
    let sent = inject::send_frames(&client.ns, HOST_IF, &frames, Duration::from_millis(1))
        .expect("sending the spoofed SYNs");
    assert_eq!(sent, SPOOFED_SYNS);
    // The backends answer what reached them and retransmit their SYN-ACKs; give the
    // first retransmissions time to happen before legitimate traffic starts.
    thread::sleep(Duration::from_secs(2));
    let report = Ordinary::start(
        &client.ns,
        &OrdinaryConfig::new(bed.vip, Duration::from_secs(10)),
    )
    .finish(false);
    let events = bed.events_since(bed.baseline).expect("reading the events");
    let readings = bed.finish_readings(&start, &events);
    println!(
        "spoofed SYNs: {sent} sent, then {}  {}\n  events:\n{}",
        report.summary(),
        readings.line(),
        bed.describe_events(&events, start_of(&report))
    );
    assert_eq!(
        report.failures().count(),
        0,
        "legitimate requests after {SPOOFED_SYNS} spoofed SYNs must all be answered:\n{}",
        report.summary()
    );
    assert!(
        events.is_empty(),
        "spoofed SYNs must not move health:\n{}",
        bed.describe_events(&events, start_of(&report))
    );
}

#[test]
fn udp_flood_from_one_client_leaves_others_served_nat() {
    let bed = Bed::start_with(
        Forwarding::Nat,
        176,
        &Role::primaries(4),
        Path::new(TESTSERVER),
        true,
    );
    let start = bed.start_readings();
    let client = bed.topo.client();
    let vip = SocketAddr::new(bed.vip.ip(), 53);
    // A second client on the same segment: another address of the client's interface.
    let other = Ipv4Addr::new(10, 77, bed.topo.subnet(), 9);
    client
        .ns
        .ip(&["addr", "add", &format!("{other}/24"), "dev", HOST_IF])
        .expect("adding the second client's address");

    let flooded = client
        .ns
        .run(|| {
            let mut sent = 0;
            for _ in 0..UDP_FLOWS {
                // A fresh socket per datagram: a fresh ephemeral port, a new flow.
                let Ok(s) = UdpSocket::bind((client.ipv4, 0)) else {
                    continue;
                };
                if s.send_to(b"flood", vip).is_ok() {
                    sent += 1;
                }
            }
            sent
        })
        .expect("entering the client namespace");
    thread::sleep(Duration::from_millis(500));

    let (answered, failures) = client
        .ns
        .run(|| {
            let mut answered = 0;
            let mut failures = Vec::new();
            for i in 0..QUERIES {
                let result = (|| -> std::io::Result<String> {
                    let s = UdpSocket::bind((other, 0))?;
                    s.set_read_timeout(Some(Duration::from_secs(1)))?;
                    s.send_to(format!("query {i}").as_bytes(), vip)?;
                    let mut buf = [0u8; 256];
                    let (n, _) = s.recv_from(&mut buf)?;
                    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
                })();
                match result {
                    Ok(name) if name.starts_with('b') => answered += 1,
                    Ok(other) => failures.push(format!("query {i}: answer {other:?}")),
                    Err(e) => failures.push(format!("query {i}: {e}")),
                }
            }
            (answered, failures)
        })
        .expect("entering the client namespace");
    let events = bed.events_since(bed.baseline).expect("reading the events");
    let readings = bed.finish_readings(&start, &events);
    println!(
        "udp flood: {flooded} one-datagram flows from {}, then {answered} of {QUERIES} queries \
         from {other} answered; first failures: {:?}\n  {}\n  events:\n{}",
        client.ipv4,
        &failures[..failures.len().min(5)],
        readings.line(),
        bed.describe_events(&events, bed.baseline)
    );
    assert_eq!(
        answered, QUERIES,
        "another client's UDP queries must all be answered after one client's {UDP_FLOWS} flows: {failures:?}"
    );
    assert!(
        events.is_empty(),
        "a UDP flood must not move health:\n{}",
        bed.describe_events(&events, bed.baseline)
    );
}

fn start_of(report: &lb_tests::traffic::ordinary::Report) -> f64 {
    report.started
}
