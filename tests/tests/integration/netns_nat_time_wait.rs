//! nat source ports against backends that close first: HTTP backends answer
//! with `Connection: close` and close, so each backend holds every 4-tuple it served in
//! TIME_WAIT for 60 s. A client opens HTTP connections back to back, paced, for 20 s
//! through a nat service with a 1,000-port range. No SYN may land in a backend's
//! TIME_WAIT (`TcpExtPAWSTimewait` on every backend stays 0, read from the backend's
//! own `/proc/net/netstat` as `nstat` does), every request is answered, and no passive
//! event reaches the agent.
//!
//! Against an agent whose ports came back 2 s after any close (set `LB_AGENT_BIN` to
//! one), the same run counts PAWS rejections: the figure is printed either way.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::daemon::{Proto, Service},
    net::topology::{Forwarding, Topology},
    scenario::balance::{self, SERVER_START},
    util::process::{NsProcess, STOP_GRACE},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const HTTP_PORT: u16 = 8090;
/// How long the client keeps opening connections, and how often.
const RUN: Duration = Duration::from_secs(20);
const PACE: Duration = Duration::from_millis(40);
/// Bound on connections whatever the clock does.
const MAX_CONNECTIONS: usize = 1_000;
const STEP_TIMEOUT: Duration = Duration::from_secs(3);

/// `TcpExtPAWSTimewait` of the namespace the calling thread is in.
fn paws_timewait() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/net/netstat")
        .expect("reading /proc/thread-self/net/netstat");
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let names = names.split_whitespace();
        let values = values.split_whitespace();
        for (n, v) in names.zip(values) {
            if n == "PAWSTimewait" {
                return v.parse().expect("a counter");
            }
        }
    }
    panic!("no TcpExt PAWSTimewait in /proc/net/netstat");
}

fn paws_per_backend(topo: &Topology) -> Vec<u64> {
    topo.backends()
        .iter()
        .map(|b| {
            b.ns.run(paws_timewait)
                .expect("entering a backend namespace")
        })
        .collect()
}

/// One HTTP/1.1 request on a fresh connection; the server closes after its answer.
fn get(vip: SocketAddr) -> Result<(), String> {
    let mut s =
        TcpStream::connect_timeout(&vip, STEP_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(STEP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: lb\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    if answer.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(format!("answer {:?}", String::from_utf8_lossy(&answer)))
    }
}

#[test]
fn nat_ports_do_not_land_in_a_backends_time_wait() {
    let topo = Topology::builder()
        .backends(3)
        .forwarding(Forwarding::Nat)
        .subnet(61)
        .build()
        .expect("building the topology");
    let port = HTTP_PORT.to_string();
    let _servers: Vec<NsProcess> = topo
        .backends()
        .iter()
        .map(|b| {
            let args = ["--name", b.role.as_str(), "--http", &port];
            let p = b
                .spawn(
                    &format!("testserver {}", b.role),
                    Path::new(TESTSERVER),
                    &args,
                )
                .expect("starting lb-testserver");
            p.wait_for_line(0, "ready", SERVER_START)
                .expect("lb-testserver ready");
            p
        })
        .collect();
    let backends: Vec<_> = topo.backends().iter().map(|b| (b, 1)).collect();
    let mut service = Service::on(&topo, "web", Proto::Tcp, false, 80, &backends, HTTP_PORT);
    service.snat_ports = Some("20000-20999".into());
    let vip = service.vip;
    let agent = balance::start_agent(&topo, vec![service], None).expect("starting lb-agent");

    let before = paws_per_backend(&topo);
    let client = topo.client();
    let (done, failures) = client
        .ns
        .run(|| {
            let start = Instant::now();
            let mut done = 0;
            let mut failures = Vec::new();
            while start.elapsed() < RUN && done < MAX_CONNECTIONS {
                let t = Instant::now();
                if let Err(e) = get(vip) {
                    failures.push(format!("request {done}: {e}"));
                }
                done += 1;
                if let Some(rest) = PACE.checked_sub(t.elapsed()) {
                    std::thread::sleep(rest);
                }
            }
            (done, failures)
        })
        .expect("entering the client namespace");
    let after = paws_per_backend(&topo);
    let paws: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let lines = agent.process().lines();
    let events: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("transition") || l.contains("passive"))
        .collect();
    println!(
        "nat, backends closing first, {done} connections in {RUN:?} over 1,000 source ports: \
         TcpExtPAWSTimewait per backend {paws:?}, {} failed, agent transitions/passive lines {}",
        failures.len(),
        events.len()
    );
    agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(
        done >= 300,
        "the client should manage 300 connections in {RUN:?}, did {done}"
    );
    assert!(failures.is_empty(), "every request answered: {failures:#?}");
    assert_eq!(paws, vec![0, 0, 0], "no SYN into a backend's TIME_WAIT");
    assert!(events.is_empty(), "no server transition: {events:#?}");
}
