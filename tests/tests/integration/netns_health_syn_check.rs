//! Tcp probes as SYN checks (`tcp_check = "syn"`) through the real agent. An
//! open port passes (on a verified SYN-ACK, counted in `/metrics`), a closed port fails at once
//! (RST: refused), a port nftables drops times out, and a port whose host answers every
//! SYN with a forged SYN-ACK and RST (wrong acknowledgement numbers) times out too and is
//! never believed: the agent counts those replies as rejected in `/metrics`. Last, the
//! balancer's own interface queue drops every packet: each SYN fails locally (ENOBUFS,
//! a local fault) and the open server stays up.

use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::api::{self, Api},
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{
            HealthServers, MARGIN, Probe, ProbeKind, event_time, find_event,
            local_faults_while_the_queue_drops, secs, server_health, syn_packets,
            wait_all_probed_up, wait_event, with_health,
        },
        syn_bed::nft_port,
    },
    traffic::syn_forge::SynForger,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const FIRST_VERDICTS: Duration = Duration::from_secs(15);
const INTERVAL: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_millis(500);
/// How long the forger runs at most (the test needs well under this).
const FORGE_LIMIT: Duration = Duration::from_secs(30);

#[test]
fn health_syn_check_passes_open_fails_closed_and_silent_and_ignores_forgeries() {
    let probe =
        Probe::new("port", ProbeKind::Tcp, INTERVAL, TIMEOUT, 2, 2).key("tcp_check = \"syn\"");
    let topo = Topology::builder()
        .backends(4)
        .forwarding(Forwarding::Nat)
        .subnet(231)
        .build()
        .expect("building the topology");
    let roles: Vec<&str> = topo.backends().iter().map(|b| b.role.as_str()).collect();
    let mut servers = HealthServers::start(&topo, Path::new(TESTSERVER), &roles)
        .expect("starting lb-testserver on every backend");
    let backends = balance::weighted(&topo, &[1, 1, 1, 1]);
    let service = with_health(
        balance::tcp_service(&topo, &backends),
        &["max_fails = 0"],
        std::slice::from_ref(&probe),
    );
    let _agent =
        balance::start_agent(&topo, vec![service], Some("native")).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let a: Vec<SocketAddr> = topo
        .backends()
        .iter()
        .map(|b| SocketAddr::new(b.ipv4.into(), BACKEND_TCP_PORT))
        .collect();
    wait_all_probed_up(&api, "web", &a, FIRST_VERDICTS)
        .expect("every server up after its first SYN checks");

    // Open ports passed by SYN check, not by connect.
    let text = api.metrics().expect("GET /metrics");
    assert_eq!(
        api::metric(&text, "lb_probe_tcp_syn_check", &[]),
        Some(1.0),
        "the agent runs SYN checks"
    );
    let accepted = syn_packets(&api, "accepted");
    assert!(
        accepted >= 4.0,
        "every open port passed on a SYN-ACK ({accepted})"
    );

    let bound = probe.detection_bound() + MARGIN;
    let rejected_before = syn_packets(&api, "rejected");

    // b2: closed (refused), b3: silent (dropped), b4: silent but forging answers.
    let t_closed = servers.kill("b2").expect("killing b2's server");
    let t_silent = lb_tests::traffic::pacer::wall_now();
    nft_port(&topo.backends()[2].ns, BACKEND_TCP_PORT, "drop");
    let b4 = &topo.backends()[3].ns;
    nft_port(b4, BACKEND_TCP_PORT, "drop");
    let forger = SynForger::start(b4, BACKEND_TCP_PORT, FORGE_LIMIT).expect("forger in b4");
    let t_forged = lb_tests::traffic::pacer::wall_now();

    let mut lines = Vec::new();
    for (i, since, what, want) in [
        (1, t_closed, "closed port", "refused"),
        (2, t_silent, "dropped port", "timeout"),
        (3, t_forged, "dropped port with forged replies", "timeout"),
    ] {
        let ev = wait_event(&api, a[i], "unhealthy", since, bound + MARGIN)
            .unwrap_or_else(|e| panic!("{what}: {} should turn unhealthy: {e}", a[i]));
        let took = event_time(&ev) - since;
        let (state, probes) = server_health(&api, "web", a[i]).expect("status");
        assert_eq!(state, "unhealthy", "{what}: {probes:?}");
        let last = probes[0].last_result.clone();
        assert!(
            took <= bound.as_secs_f64(),
            "{what}: unhealthy within {bound:?}, took {}",
            secs(took)
        );
        assert!(
            last.contains(want),
            "{what}: last result {last:?}, want {want:?}"
        );
        lines.push(format!(
            "{what}: unhealthy after {}, last {last:?}",
            secs(took)
        ));
    }

    // The forger keeps answering for a few more rounds: b4 never comes back.
    let watch = Instant::now();
    while watch.elapsed() < 3 * INTERVAL {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        find_event(&api.events().expect("events"), a[3], "up", t_forged).is_none(),
        "a forged SYN-ACK must never bring b4 back"
    );
    let forged = forger.forged();
    drop(forger);
    let rejected = syn_packets(&api, "rejected") - rejected_before;
    assert!(forged >= 8, "the forger answered SYNs ({forged})");
    assert!(
        rejected >= 4.0,
        "forged replies counted as rejected: {rejected} of {forged} forged"
    );
    let (state, _) = server_health(&api, "web", a[0]).expect("b1's status");
    assert_eq!(state, "up", "b1's open port stays up");

    // The balancer's own queue drops every packet (a pfifo of length 0): each SYN fails
    // locally (ENOBUFS), a local fault, never a verdict against b1.
    let local = local_faults_while_the_queue_drops(&topo, &api, 3 * INTERVAL);
    let (state, probes) = server_health(&api, "web", a[0]).expect("b1's status");
    assert!(
        local >= 2.0,
        "SYNs dropped by the balancer's own queue are local faults ({local}); b1: {probes:?}"
    );
    assert_eq!(
        state, "up",
        "a local drop says nothing about b1: {probes:?}"
    );
    println!(
        "SYN check (interval 1 s, timeout 500 ms, fails 2; bound {}):\n  {}\n  {forged} forged \
         replies, {rejected} rejected",
        secs(bound.as_secs_f64()),
        lines.join("\n  ")
    );
}
