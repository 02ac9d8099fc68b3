//! Probe conditions through the real agent against real backends:
//! - http `test` over a response header, with the probe's method and body checked by the
//!   backend's echo of them: every server passes; a server whose header changes leaves
//!   within `fails × interval` (+ 1 s), the others stay;
//! - tcp `send = "data:…"` (Angie's form) against the TCP echo backends: the decoded data
//!   is sent, not the prefix, so the echo matches and every server comes up (that a
//!   failing tcp test fails the probe is checked against a loopback echo in
//!   lb-agent/tests/probe/test_condition.rs).

use std::{net::SocketAddr, path::Path, time::Duration};

use lb_tests::{
    agent::{api::Api, daemon::Agent},
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
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
    addrs: Vec<SocketAddr>,
    _topo: Topology,
}

/// `n` backends with testservers (each control file written with `control` first), the
/// agent serving "web" over all of them with `probe` and passive checks off, every
/// server up and probed.
fn setup(subnet: u8, n: usize, control: &str, probe: &Probe, addr_port: u16) -> Setup {
    let topo = Topology::builder()
        .backends(n)
        .forwarding(Forwarding::Nat)
        .subnet(subnet)
        .build()
        .expect("building the topology");
    let roles: Vec<&str> = topo.backends().iter().map(|b| b.role.as_str()).collect();
    let servers =
        HealthServers::start(&topo, Path::new(TESTSERVER), &[]).expect("knowing every backend");
    let mut servers = servers;
    for role in &roles {
        servers.control(role, control);
        servers.restart(role).expect("starting lb-testserver");
    }
    let weights = vec![1; n];
    let backends = balance::weighted(&topo, &weights);
    let svc = with_health(
        balance::tcp_service(&topo, &backends),
        &["max_fails = 0"],
        std::slice::from_ref(probe),
    );
    let agent = balance::start_agent(&topo, vec![svc], Some("native")).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let addrs: Vec<SocketAddr> = topo
        .backends()
        .iter()
        .map(|b| SocketAddr::new(b.ipv4.into(), addr_port))
        .collect();
    wait_all_probed_up(&api, "web", &addrs, FIRST_VERDICTS)
        .expect("every server up after its first probes (the test held)");
    Setup {
        _agent: agent,
        servers,
        api,
        addrs,
        _topo: topo,
    }
}

#[test]
fn health_http_test_matches_a_header_and_the_probe_sends_its_method_and_body() {
    let probe = Probe::http(INTERVAL, TIMEOUT, 2, 1)
        .key("method = \"POST\"")
        .key("body = \"probe-body-7\"")
        .key(
            "test = '$upstream_status == 200 && $upstream_http_x_role == primary \
             && $upstream_http_x_request_method == POST \
             && $upstream_http_x_request_body == probe-body-7'",
        );
    let s = setup(65, 3, "header X-Role: primary\n", &probe, BACKEND_TCP_PORT);
    let (b1, b2) = (s.addrs[0], s.addrs[1]);

    // b2 now answers 200 with another role: only the header tells.
    let t = s.servers.control("b2", "header X-Role: replica\n");
    let bound = probe.immediate_bound() + MARGIN;
    let ev = wait_event(&s.api, b2, "unhealthy", t, bound + MARGIN)
        .unwrap_or_else(|e| panic!("b2 answering X-Role: replica should turn unhealthy: {e}"));
    let took = event_time(&ev) - t;
    let probes = wait_state(&s.api, "web", b2, "unhealthy", Duration::from_secs(1))
        .expect("the API shows b2 unhealthy");
    println!(
        "http test on a header: b2 unhealthy {} after its X-Role changed (bound {}); cause: {}; \
         last result {:?}",
        secs(took),
        secs(bound.as_secs_f64()),
        ev.cause,
        probes.first().map(|p| p.last_result.clone())
    );
    assert!(
        took <= bound.as_secs_f64(),
        "a failed test is known at once: within {bound:?}, took {}",
        secs(took)
    );
    assert!(
        ev.cause.contains("test failed (status 200)"),
        "the cause names the failed test with a 200 status: {}",
        ev.cause
    );
    for (addr, role) in [(b1, "b1"), (s.addrs[2], "b3")] {
        let (state, probes) = server_health(&s.api, "web", addr).expect("status");
        assert_eq!(state, "up", "{role} still answers primary: {probes:?}");
    }

    // Back to primary: up again after one pass.
    let t = s.servers.control("b2", "header X-Role: primary\n");
    wait_event(
        &s.api,
        b2,
        "up",
        t,
        probe.recovery_bound() + MARGIN + MARGIN,
    )
    .unwrap_or_else(|e| panic!("b2 answering primary again should return: {e}"));
}

#[test]
fn health_tcp_send_data_form_sends_the_decoded_data_to_an_echo_backend() {
    // The echo backend answers "<name>\n" then "<name> <line>" per line: with the prefix
    // sent literally the echo would read "b1 data:PING" and the test would never hold.
    let probe = Probe::new("echo", ProbeKind::Tcp, INTERVAL, TIMEOUT, 1, 1)
        .key("send = \"data:PING\\n\"")
        .key("test = '$upstream_probe_response ~ \"b[0-9]+ PING\" && $upstream_probe_response !~ \"data:\"'");
    let s = setup(66, 2, "", &probe, BACKEND_TCP_PORT);
    for addr in &s.addrs {
        let (state, probes) = server_health(&s.api, "web", *addr).expect("status");
        assert_eq!(state, "up", "{addr}: {probes:?}");
        assert!(
            probes
                .iter()
                .all(|p| p.count > 0 && p.last_result == "passed"),
            "{addr}: the echo of the decoded data passed the test: {probes:?}"
        );
    }
}
