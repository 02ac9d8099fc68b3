//! tcp, udp and icmp probes through the real agent: each detects its kind of failure and
//! the server's state in `GET /api/v1/services/{name}` becomes `unhealthy` within TR7's
//! `fails × (interval + timeout)` (+ 1 s), while the healthy servers stay `up`.
//! - tcp: the server is killed (connection refused);
//! - udp (`send` / `expect`): one responder answers the wrong text, one falls silent,
//!   one is killed (ICMP port unreachable); with `max_response = 0` (no reply read) a
//!   killed one still fails on the port unreachable, a silent one stays up;
//! - icmp: the backend's namespace ignores echo requests; icmp ignores ports, so a
//!   backend whose service port is closed stays up.

use std::{net::SocketAddr, path::Path, time::Duration};

use lb_tests::{
    agent::{api::Api, daemon::Agent},
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT, BACKEND_UDP_PORT},
        health::{
            HealthServers, MARGIN, Probe, ProbeKind, event_time, secs, server_health,
            wait_all_probed_up, wait_event, wait_state, with_health,
        },
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const FIRST_VERDICTS: Duration = Duration::from_secs(15);
const INTERVAL: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_millis(500);

/// Fields drop in order: the agent, then the servers, then the topology.
struct Setup {
    _agent: Agent,
    servers: HealthServers,
    api: Api,
    topo: Topology,
}

/// `n` backends with testservers, the agent serving `service` (built from the topology)
/// with passive checks off, every server up and probed.
fn setup(
    subnet: u8,
    n: usize,
    service: impl Fn(&Topology) -> lb_tests::agent::daemon::Service,
    name: &str,
    port: u16,
) -> Setup {
    let topo = Topology::builder()
        .backends(n)
        .forwarding(Forwarding::Nat)
        .subnet(subnet)
        .build()
        .expect("building the topology");
    let roles: Vec<&str> = topo.backends().iter().map(|b| b.role.as_str()).collect();
    let servers = HealthServers::start(&topo, Path::new(TESTSERVER), &roles)
        .expect("starting lb-testserver on every backend");
    let agent = balance::start_agent(&topo, vec![service(&topo)], Some("native"))
        .expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let addrs = addrs(&topo, port);
    wait_all_probed_up(&api, name, &addrs, FIRST_VERDICTS)
        .expect("every server up after its first probes");
    Setup {
        _agent: agent,
        servers,
        api,
        topo,
    }
}

fn addrs(topo: &Topology, port: u16) -> Vec<SocketAddr> {
    topo.backends()
        .iter()
        .map(|b| SocketAddr::new(b.ipv4.into(), port))
        .collect()
}

/// Waits for `addr` to turn unhealthy after `since`; checks the bound and the API state;
/// returns the detection time and the probe's last result.
fn expect_unhealthy(
    s: &Setup,
    service: &str,
    addr: SocketAddr,
    since: f64,
    probe: &Probe,
    what: &str,
) -> (f64, String) {
    let bound = probe.detection_bound() + MARGIN;
    let ev = wait_event(&s.api, addr, "unhealthy", since, bound + MARGIN)
        .unwrap_or_else(|e| panic!("{what}: {addr} should turn unhealthy: {e}"));
    let took = event_time(&ev) - since;
    let probes = wait_state(&s.api, service, addr, "unhealthy", Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("{what}: the API should show {addr} unhealthy: {e}"));
    assert!(
        took <= bound.as_secs_f64(),
        "{what}: {addr} should be unhealthy within {bound:?}, took {}",
        secs(took)
    );
    let last = probes
        .first()
        .map(|p| p.last_result.clone())
        .unwrap_or_default();
    (took, last)
}

fn assert_up(s: &Setup, service: &str, addr: SocketAddr, what: &str) {
    let (state, probes) = server_health(&s.api, service, addr).expect("the server's status");
    assert_eq!(state, "up", "{what}: {addr} should stay up: {probes:?}");
}

#[test]
fn health_tcp_probe_detects_a_killed_server() {
    let probe = Probe::new("tcp", ProbeKind::Tcp, INTERVAL, TIMEOUT, 2, 2);
    let service = |topo: &Topology| {
        let backends = balance::weighted(topo, &[1, 1, 1]);
        with_health(
            balance::tcp_service(topo, &backends),
            &["max_fails = 0"],
            std::slice::from_ref(&probe),
        )
    };
    let mut s = setup(71, 3, service, "web", BACKEND_TCP_PORT);
    let a = addrs(&s.topo, BACKEND_TCP_PORT);
    let t_kill = s.servers.kill("b2").expect("killing b2's server");
    let (took, last) = expect_unhealthy(&s, "web", a[1], t_kill, &probe, "tcp");
    println!(
        "tcp probe (interval 1 s, timeout 500 ms, fails 2): b2 killed -> unhealthy after {} \
         (bound {}), last result {last:?}",
        secs(took),
        secs((probe.detection_bound() + MARGIN).as_secs_f64())
    );
    assert!(
        last.contains("refused"),
        "a killed server's port refuses: {last:?}"
    );
    assert_up(&s, "web", a[0], "tcp");
    assert_up(&s, "web", a[2], "tcp");
}

#[test]
fn health_udp_probe_detects_wrong_silent_and_closed_responders() {
    let probe = Probe::new("udp", ProbeKind::Udp, INTERVAL, TIMEOUT, 2, 2)
        .key("send = \"ping\\r\\n\"")
        .key("expect = \"^b[0-9]+$\"");
    let service = |topo: &Topology| {
        let backends = balance::weighted(topo, &[1, 1, 1, 1]);
        with_health(
            balance::udp_service(topo, &backends),
            &["max_fails = 0"],
            std::slice::from_ref(&probe),
        )
    };
    let mut s = setup(72, 4, service, "dns", BACKEND_UDP_PORT);
    let a = addrs(&s.topo, BACKEND_UDP_PORT);
    let t_wrong = s.servers.control("b1", "udp reply not-a-backend-name");
    let t_silent = s.servers.control("b2", "udp silent");
    let t_kill = s.servers.kill("b3").expect("killing b3's server");
    let mut lines = Vec::new();
    for (i, since, what, want) in [
        (0, t_wrong, "wrong reply", "did not match"),
        (1, t_silent, "silent", "timeout"),
        (2, t_kill, "closed port", "unreachable"),
    ] {
        let (took, last) = expect_unhealthy(&s, "dns", a[i], since, &probe, what);
        lines.push(format!(
            "b{} {what}: unhealthy after {}, last result {last:?}",
            i + 1,
            secs(took)
        ));
        assert!(
            last.contains(want),
            "udp {what}: the probe's last result should say {want:?}: {last:?}"
        );
    }
    assert_up(&s, "dns", a[3], "udp");
    println!(
        "udp probe (send \"ping\\r\\n\", expect ^b[0-9]+$, interval 1 s, timeout 500 ms, \
         fails 2; bound {}):\n  {}",
        secs((probe.detection_bound() + MARGIN).as_secs_f64()),
        lines.join("\n  ")
    );
}

/// `max_response = 0` reads no reply, but the probe still waits its timeout for the ICMP
/// port unreachable of a closed port (a probe that stopped after its send checked
/// nothing): the killed responder turns unhealthy, a silent one and an answering one stay
/// up.
#[test]
fn health_udp_probe_without_reading_a_reply_still_detects_a_closed_port() {
    let probe = Probe::new("udp", ProbeKind::Udp, INTERVAL, TIMEOUT, 2, 2)
        .key("send = \"ping\\r\\n\"")
        .key("max_response = 0");
    let service = |topo: &Topology| {
        let backends = balance::weighted(topo, &[1, 1, 1]);
        with_health(
            balance::udp_service(topo, &backends),
            &["max_fails = 0"],
            std::slice::from_ref(&probe),
        )
    };
    let mut s = setup(74, 3, service, "dns", BACKEND_UDP_PORT);
    let a = addrs(&s.topo, BACKEND_UDP_PORT);
    s.servers.control("b1", "udp silent");
    let t_kill = s.servers.kill("b2").expect("killing b2's server");
    let (took, last) = expect_unhealthy(&s, "dns", a[1], t_kill, &probe, "closed port");
    assert!(
        last.contains("unreachable"),
        "the closed port's ICMP error fails the probe: {last:?}"
    );
    // Two more probe rounds: the silent and the answering responder stay up.
    std::thread::sleep(2 * INTERVAL + TIMEOUT);
    assert_up(&s, "dns", a[0], "udp silent, max_response = 0");
    assert_up(&s, "dns", a[2], "udp answering, max_response = 0");
    println!(
        "udp probe (send \"ping\\r\\n\", max_response = 0, interval 1 s, timeout 500 ms, \
         fails 2): b2 killed -> unhealthy after {} (bound {}), last result {last:?}; silent b1 \
         and answering b3 up",
        secs(took),
        secs((probe.detection_bound() + MARGIN).as_secs_f64())
    );
}

#[test]
fn health_icmp_probe_detects_ignored_echo_and_ignores_ports() {
    let probe = Probe::new("ping", ProbeKind::Icmp, INTERVAL, TIMEOUT, 2, 2);
    let service = |topo: &Topology| {
        let backends = balance::weighted(topo, &[1, 1, 1]);
        with_health(
            balance::tcp_service(topo, &backends),
            &["max_fails = 0"],
            std::slice::from_ref(&probe),
        )
    };
    let mut s = setup(73, 3, service, "web", BACKEND_TCP_PORT);
    let a = addrs(&s.topo, BACKEND_TCP_PORT);
    // b1's service port closes: an icmp probe does not look at ports.
    let probes_of_b1 = || server_health(&s.api, "web", a[0]).expect("b1's status").1[0].count;
    let b1_count = probes_of_b1();
    s.servers.kill("b1").expect("killing b1's server");
    let b3 = &s.topo.backends()[2];
    let t_drop = lb_tests::traffic::pacer::wall_now();
    b3.ns
        .sysctl("net.ipv4.icmp_echo_ignore_all", "1")
        .expect("b3 ignoring ICMP echo");
    let (took, last) = expect_unhealthy(&s, "web", a[2], t_drop, &probe, "icmp");
    // Let b1 be probed `fails` times with its port closed.
    let start = std::time::Instant::now();
    while probes_of_b1() < b1_count + 2 + 1 && start.elapsed() < 3 * INTERVAL + MARGIN {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_up(&s, "web", a[0], "icmp (port closed, host answers ping)");
    assert_up(&s, "web", a[1], "icmp");
    println!(
        "icmp probe (interval 1 s, timeout 500 ms, fails 2): b3 ignoring echo -> unhealthy \
         after {} (bound {}), last result {last:?}; b1 with its port closed stays up",
        secs(took),
        secs((probe.detection_bound() + MARGIN).as_secs_f64())
    );
    assert!(
        last.contains("timeout"),
        "an ignored echo fails by timeout: {last:?}"
    );
}
