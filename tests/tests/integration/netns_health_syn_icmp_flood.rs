//! Hostile input at volume: a backend host floods the balancer with forged ICMP
//! host unreachables (IPv4 and IPv6) quoting TCP segments from the balancer's address to
//! the backends' service port, from random ephemeral source ports (the SYN check's claimed
//! ports among them) with random sequence numbers, while the agent SYN-checks an open
//! server and a server whose port is dropped (so its probes are in flight during the
//! flood). Nothing may change: the open server stays up with "passed", the dropped one
//! keeps failing by "timeout", never by "No route to host"; the errors the agent read
//! are counted (`icmp_unmatched`/`icmp_rejected`). Prints what the agent's process
//! spent per error read (BENCHMARKS.md §3, "ICMP errors"); no timing is asserted.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{
        api::Api,
        daemon::{Proto, Service},
    },
    bench::cpu,
    net::{
        netns::NetNs,
        topology::{Forwarding, Topology},
    },
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{
            HealthServers, Probe, ProbeKind, server_health, syn_packets, wait_all_probed_up,
            wait_state, with_health,
        },
    },
    traffic::packet::{Frame, TCP_SYN, Transport},
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const FIRST_VERDICTS: Duration = Duration::from_secs(15);
const INTERVAL: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_millis(1500);
/// Forged errors per family, and the most time the flood may take.
const FLOOD: usize = 100_000;
const FLOOD_LIMIT: Duration = Duration::from_secs(20);
/// `IPPROTO_RAW`: sending implies `IP_HDRINCL` (and `IPV6_HDRINCL` on IPv6).
const IPPROTO_RAW: i32 = 255;

/// Errors the agent read and ignored so far.
fn ignored(api: &Api) -> f64 {
    ["icmp_unmatched", "icmp_rejected", "malformed"]
        .iter()
        .map(|k| syn_packets(api, k))
        .sum()
}

/// A small xorshift generator: reproducible forgeries without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `n` ICMP host unreachables from `from` to `lb`, each quoting a SYN from `lb` to one
/// of `targets` (whole IP packets).
fn forgeries(from: IpAddr, lb: IpAddr, targets: &[SocketAddr], n: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    (0..n)
        .map(|i| {
            let t = targets[i % targets.len()];
            let r = rng.next();
            let sport = 32_768 + (r % 28_232) as u16;
            let mut quoted = Frame::tcp(lb, sport, t.ip(), t.port(), TCP_SYN);
            quoted.transport = Transport::Tcp {
                sport,
                dport: t.port(),
                flags: TCP_SYN,
                seq: (r >> 32) as u32,
                ack: 0,
            };
            let (ty, code) = if from.is_ipv4() { (3, 1) } else { (1, 3) };
            Frame::icmp(from, lb, ty, code)
                .payload(&quoted.ip_bytes())
                .ip_bytes()
        })
        .collect()
}

/// Sends `packets` to `to` from inside `ns` through a raw socket, within `limit`;
/// returns how many the kernel took.
fn flood(ns: &NetNs, to: IpAddr, packets: &[Vec<u8>], limit: Duration) -> usize {
    ns.run(|| {
        let domain = if to.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        let s =
            Socket::new(domain, Type::RAW, Some(Protocol::from(IPPROTO_RAW))).expect("raw socket");
        let dst = SockAddr::from(SocketAddr::new(to, 0));
        let end = Instant::now() + limit;
        let mut sent = 0;
        for p in packets {
            if Instant::now() > end {
                break;
            }
            sent += usize::from(s.send_to(p, &dst).is_ok());
        }
        sent
    })
    .expect("entering the backend's namespace")
}

#[test]
fn forged_icmp_floods_never_steer_syn_checks() {
    let topo = Topology::builder()
        .backends(2)
        .forwarding(Forwarding::Nat)
        .ipv6(true)
        .subnet(234)
        .build()
        .expect("building the topology");
    let roles: Vec<&str> = topo.backends().iter().map(|b| b.role.as_str()).collect();
    let _servers = HealthServers::start(&topo, Path::new(TESTSERVER), &roles)
        .expect("starting lb-testserver on every backend");
    let probe =
        Probe::new("port", ProbeKind::Tcp, INTERVAL, TIMEOUT, 2, 2).key("tcp_check = \"syn\"");
    let backends = balance::weighted(&topo, &[1, 1]);
    let port = balance::vip_port(Forwarding::Nat, BACKEND_TCP_PORT, 80);
    let services: Vec<Service> = [(false, "web4"), (true, "web6")]
        .into_iter()
        .map(|(v6, name)| {
            with_health(
                Service::on(
                    &topo,
                    name,
                    Proto::Tcp,
                    v6,
                    port,
                    &backends,
                    BACKEND_TCP_PORT,
                ),
                &["max_fails = 0"],
                std::slice::from_ref(&probe),
            )
        })
        .collect();
    let agent = balance::start_agent(&topo, services, Some("native")).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let pid = agent.process().pid();
    let addrs = |v6: bool| -> Vec<SocketAddr> {
        topo.backends()
            .iter()
            .map(|b| SocketAddr::new(b.addr(v6).unwrap(), BACKEND_TCP_PORT))
            .collect()
    };
    for (v6, name) in [(false, "web4"), (true, "web6")] {
        wait_all_probed_up(&api, name, &addrs(v6), FIRST_VERDICTS)
            .unwrap_or_else(|e| panic!("{name}: every server up first: {e}"));
    }
    // b2's port drops: its probes wait for their timeout during the flood.
    let rules = format!(
        "table inet syncheck {{ chain input {{ type filter hook input priority 0; \
         tcp dport {BACKEND_TCP_PORT} drop; }}; }}"
    );
    let b2 = &topo.backends()[1].ns;
    b2.nft(&[&rules]).expect("nft drops b2's port");
    for (v6, name) in [(false, "web4"), (true, "web6")] {
        wait_state(
            &api,
            name,
            addrs(v6)[1],
            "unhealthy",
            probe.detection_bound() * 2,
        )
        .unwrap_or_else(|e| panic!("{name}: the dropped port fails first: {e}"));
    }

    let mut lines = Vec::new();
    for (v6, name) in [(false, "web4"), (true, "web6")] {
        let targets = addrs(v6);
        let from = topo.backends()[0].addr(v6).unwrap();
        let lb = topo.lb().addr(v6).unwrap();
        let packets = forgeries(from, lb, &targets, FLOOD);
        // The agent's CPU over a quiet stretch as long as the flood, for its baseline.
        let (ignored0, cpu0, t0) = (ignored(&api), cpu::process_on_cpu(pid), Instant::now());
        let sent = flood(&topo.backends()[0].ns, lb, &packets, FLOOD_LIMIT);
        let took = t0.elapsed();
        // Let the receiver finish what is queued.
        std::thread::sleep(Duration::from_millis(500));
        let (ignored1, cpu1) = (ignored(&api), cpu::process_on_cpu(pid));
        std::thread::sleep(took + Duration::from_millis(500));
        let cpu2 = cpu::process_on_cpu(pid);
        let read = ignored1 - ignored0;
        let spent = (cpu1 - cpu0).saturating_sub(cpu2 - cpu1);

        assert!(
            sent >= FLOOD / 2,
            "{name}: the flood went out ({sent} of {FLOOD})"
        );
        assert!(
            read >= 1000.0,
            "{name}: the agent read the forged errors ({read} of {sent})"
        );
        let (state, probes) = server_health(&api, name, targets[0]).expect("status");
        assert_eq!(state, "up", "{name}: the open server stays up: {probes:?}");
        assert_eq!(probes[0].last_result, "passed", "{name}: {probes:?}");
        let (state, probes) = server_health(&api, name, targets[1]).expect("status");
        assert_eq!(state, "unhealthy", "{name}: {probes:?}");
        assert_eq!(
            probes[0].last_result, "failed: timeout",
            "{name}: the dropped port fails by its timeout, never by a forged error"
        );
        assert_eq!(
            syn_packets(&api, "unreachable"),
            0.0,
            "no forged error was believed"
        );
        lines.push(format!(
            "{name}: {sent} forged errors sent in {:.2} s ({:.0}/s); the agent read {read} \
             ({:.0} %; the rest overflowed its socket buffer); its process spent {:.0} ms \
             above its baseline: {:.2} µs per error read",
            took.as_secs_f64(),
            sent as f64 / took.as_secs_f64(),
            100.0 * read / sent as f64,
            spent.as_secs_f64() * 1e3,
            spent.as_secs_f64() * 1e6 / read.max(1.0)
        ));
    }
    println!("forged ICMP flood:\n  {}", lines.join("\n  "));
}
