//! End to end: a client forges ICMP port unreachables to the lb's
//! address quoting `snat:P -> backend:port` for every P of the snat range, for every
//! backend of a TCP and a UDP nat service, once from its own address and once with the
//! backend's address as source, while it holds TCP connections and UDP flows through
//! those services. `max_fails = 1` (the most sensitive setting).
//!
//! Nothing may change: every server stays `up`, no `icmp_unreachable` event, nothing
//! translated (`tx_icmp_nat` 0), the connections still echo; `icmp_ignored` counts
//! exactly the forged errors that hit a live flow (two per flow). Then the control: the
//! backend itself sends the same sweep about its UDP flows, which is believed, and the
//! server goes `unavailable` with cause `icmp_unreachable` — so the silence above is
//! the checks', not a broken event path.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::api::{self, Api},
    net::topology::{Forwarding, HOST_IF, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT, BACKEND_UDP_PORT},
        health::wait_state,
    },
    traffic::{
        clients::EchoConn,
        icmp_forge::{port_unreachable_v4, send_raw_v4},
        pacer::wall_now,
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const SNAT_PORTS: std::ops::RangeInclusive<u16> = 20000..=29999;
const TCP_CONNS: usize = 6;
const UDP_FLOWS: usize = 6;
/// The agent reads the event ring and publishes counters within this (generous).
const SETTLE: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(10);

fn counter(api: &Api, name: &str) -> f64 {
    let text = api.metrics().expect("GET /metrics");
    api::counter(&text, name).unwrap_or_else(|| panic!("{name} in the metrics"))
}

/// Every forged error: for each backend and each service, every snat port, from `src`
/// (or from the backend's own address when `src` is `None`).
fn sweep(lb: Ipv4Addr, backends: &[Ipv4Addr], src: Option<Ipv4Addr>, tcp: bool) -> Vec<Vec<u8>> {
    let port = if tcp {
        BACKEND_TCP_PORT
    } else {
        BACKEND_UDP_PORT
    };
    let mut out = Vec::new();
    for &b in backends {
        for p in SNAT_PORTS {
            out.push(port_unreachable_v4(
                src.unwrap_or(b),
                lb,
                tcp,
                (lb, p),
                (b, port),
            ));
        }
    }
    out
}

#[test]
fn health_icmp_forged_unreachables_across_the_snat_range_change_nothing() {
    let bed = balance::Testbed::start(Forwarding::Nat, 112, false, Path::new(TESTSERVER));
    let topo: &Topology = &bed.topo;
    let backends = balance::weighted(topo, &[1, 1, 1]);
    let mut web = balance::tcp_service(topo, &backends);
    let mut dns = balance::udp_service(topo, &backends);
    for s in [&mut web, &mut dns] {
        s.extra.push("max_fails = 1".into());
        s.extra.push("fail_timeout = \"30s\"".into());
    }
    let (web_vip, dns_vip) = (web.vip, dns.vip);
    let _agent = balance::start_agent(topo, vec![web, dns], Some("native")).expect("lb-agent");
    let api = Api::new(&topo.lb().ns);
    let client = topo.client();
    let lb = topo.lb().ipv4;
    let b_addrs: Vec<Ipv4Addr> = topo.backends().iter().map(|b| b.ipv4).collect();

    // Live flows: long-lived TCP connections and UDP sockets that got their answer.
    let mut conns: Vec<EchoConn> = (0..TCP_CONNS)
        .map(|_| {
            EchoConn::connect(&client.ns, IpAddr::V4(client.ipv4), web_vip)
                .expect("client namespace")
                .expect("TCP connection through the VIP")
        })
        .collect();
    let udp: Vec<(UdpSocket, String)> = client
        .ns
        .run(|| {
            (0..UDP_FLOWS)
                .map(|_| {
                    let s = UdpSocket::bind((client.ipv4, 0))?;
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    s.send_to(b"hello", dns_vip)?;
                    let mut buf = [0u8; 256];
                    let (n, _) = s.recv_from(&mut buf)?;
                    Ok((s, String::from_utf8_lossy(&buf[..n]).into_owned()))
                })
                .collect::<std::io::Result<Vec<_>>>()
        })
        .expect("client namespace")
        .expect("UDP flows through the VIP");
    let flows = (TCP_CONNS + UDP_FLOWS) as f64;

    let ignored_before = counter(&api, "icmp_ignored");
    let started = wall_now();
    let mut packets = Vec::new();
    for tcp in [true, false] {
        packets.extend(sweep(lb, &b_addrs, Some(client.ipv4), tcp));
        packets.extend(sweep(lb, &b_addrs, None, tcp));
    }
    // 120,000 packets outrun the lb's XDP ring whenever its NAPI waits for a CPU: a
    // queue on the sender makes the veth push back instead of dropping some.
    client
        .ns
        .hold_bursts(HOST_IF, 10_000)
        .expect("a queue on the client's interface");
    let t = Instant::now();
    let sent = send_raw_v4(&client.ns, &packets)
        .expect("client namespace")
        .expect("raw socket");
    eprintln!(
        "{sent} of {} forged port unreachables sent in {:?}",
        packets.len(),
        t.elapsed()
    );
    assert_eq!(sent, packets.len(), "every forged error left the client");

    // icmp_ignored reaches two per live flow and stays there.
    let want = ignored_before + 2.0 * flows;
    let deadline = Instant::now() + WAIT;
    while counter(&api, "icmp_ignored") < want && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    thread::sleep(SETTLE);
    assert_eq!(
        counter(&api, "icmp_ignored") - ignored_before,
        2.0 * flows,
        "icmp_ignored: two forged errors per live flow ({flows} flows)"
    );
    assert_eq!(
        counter(&api, "tx_icmp_nat"),
        0.0,
        "no forged error translated"
    );
    let icmp_events: Vec<_> = api
        .events()
        .expect("events")
        .into_iter()
        .filter(|e| e.cause.contains("icmp"))
        .collect();
    assert!(icmp_events.is_empty(), "ICMP events: {icmp_events:?}");
    for (svc, port) in [("web", BACKEND_TCP_PORT), ("dns", BACKEND_UDP_PORT)] {
        let view = api.service(svc).expect("service view");
        for b in &b_addrs {
            let addr = SocketAddr::new(IpAddr::V4(*b), port);
            let state = view.server(addr).map(|s| s.state.clone());
            assert_eq!(
                state.as_deref(),
                Some("up"),
                "{svc} {addr} after the forgeries"
            );
        }
    }
    for (i, c) in conns.iter_mut().enumerate() {
        c.check_echo(&format!("still here {i}"))
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
    }

    // Control: the same sweep about the UDP service, from a backend that has flows,
    // through its own stack and MAC: believed.
    let (_, name) = &udp[0];
    let role = name.split_whitespace().next().unwrap_or(name);
    let host = topo
        .backends()
        .iter()
        .find(|b| b.role == role)
        .unwrap_or_else(|| panic!("UDP answer {name:?} names no backend"));
    let genuine: Vec<Vec<u8>> = SNAT_PORTS
        .map(|p| port_unreachable_v4(host.ipv4, lb, false, (lb, p), (host.ipv4, BACKEND_UDP_PORT)))
        .collect();
    host.ns
        .hold_bursts(HOST_IF, 10_000)
        .expect("a queue on the backend's interface");
    let sent = send_raw_v4(&host.ns, &genuine)
        .expect("backend namespace")
        .expect("raw socket");
    assert_eq!(sent, genuine.len(), "every genuine error left {role}");
    let addr = SocketAddr::new(IpAddr::V4(host.ipv4), BACKEND_UDP_PORT);
    wait_state(&api, "dns", addr, "unavailable", WAIT)
        .unwrap_or_else(|e| panic!("{role}'s own port unreachables: {e}"));
    let events = api.events().expect("events");
    let cause = events
        .iter()
        .find(|e| e.server == addr.to_string() && e.to == "unavailable")
        .map(|e| e.cause.clone());
    assert!(
        cause.as_deref().is_some_and(|c| c.contains("icmp")),
        "{addr} unavailable for {cause:?} (expected icmp_unreachable); started {started}"
    );
    drop(udp);
}
