//! A local fault end to end: the real `lb-agent` runs with a descriptor limit below what
//! its API's connection cap (64) can hold (`prlimit --nofile=64:64`: its own raise to the
//! hard limit cannot help; it uses about 30 at rest) and a client opens idle connections
//! to its API (up to 400, until one is no longer answered), so the agent runs out of
//! descriptors. Its tcp
//! probes then fail with EMFILE: a local fault. No server may change state, the service
//! must not fail open, and the agent must say so in its log; once the connections close,
//! `/metrics` counts the local faults and no transition happened.

use std::{
    net::{SocketAddr, TcpStream},
    path::Path,
    time::Duration,
};

use lb_tests::{
    agent::{
        api::{self, Api},
        daemon::{AgentConfig, READY_LINE},
    },
    net::topology::{Forwarding, HOST_IF, Topology},
    scenario::{
        balance::WEIGHTS,
        redundancy::{self, Backends, Member, TcpProbe},
    },
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const VERDICT_WAIT: Duration = Duration::from_secs(15);
const START: Duration = Duration::from_secs(30);
/// More than the limit: the agent accepts until EMFILE.
const IDLE_CONNECTIONS: usize = 400;
/// Below the ~30 descriptors the agent holds at rest plus the API's 64-connection cap.
const NOFILE: &str = "--nofile=64:64";

#[test]
fn agent_out_of_descriptors_keeps_every_verdict() {
    let topo = Topology::builder()
        .backends(3)
        .forwarding(Forwarding::Nat)
        .subnet(173)
        .build()
        .expect("building the topology");
    let h = topo.backends();
    let members = [
        Member::primary("b1", &h[0], WEIGHTS[0]),
        Member::primary("b2", &h[1], WEIGHTS[1]),
        Member::primary("b3", &h[2], WEIGHTS[2]),
    ];
    let _backends = Backends::start(Path::new(TESTSERVER), &members, false)
        .expect("starting a testserver per member");
    let service = redundancy::service(&topo, "web", &members, &TcpProbe::fast(), &[]);
    let config = topo.dir().join("lb.toml");
    std::fs::write(&config, AgentConfig::new(vec![service]).render()).expect("writing lb.toml");
    let binary = lb_tests::agent::daemon::locate_binary("lb-agent").expect("lb-agent binary");
    let binary = binary.display().to_string();
    let config = config.display().to_string();
    let agent = topo
        .lb()
        .spawn(
            "lb-agent",
            Path::new("/usr/bin/prlimit"),
            &[
                NOFILE,
                "--",
                &binary,
                "run",
                "--config",
                &config,
                "--interface",
                HOST_IF,
                "--xdp-mode",
                "native",
            ],
        )
        .expect("starting lb-agent under prlimit");
    agent
        .wait_for_line(0, READY_LINE, START)
        .expect("lb-agent ready");
    let api = Api::new(&topo.lb().ns);
    api.wait_service("web", "every server up", VERDICT_WAIT, |s| {
        s.servers.iter().all(|v| v.state == "up" && v.active)
    })
    .expect("all three servers up after start");
    let transitions_before = api
        .events()
        .expect("GET /api/v1/events")
        .iter()
        .filter(|e| e.server != "-")
        .count();
    let mark = agent.lines().len();

    // Idle connections to the API until the agent has no descriptor left: once it stops
    // accepting, its listen backlog fills and a connect times out; the connections
    // held by then exhaust it, so the first timeout ends the loop.
    let api_addr: SocketAddr = lb_tests::agent::daemon::API_LISTEN.parse().unwrap();
    let held: Vec<TcpStream> = topo
        .lb()
        .ns
        .run(|| {
            (0..IDLE_CONNECTIONS)
                .map_while(|_| TcpStream::connect_timeout(&api_addr, Duration::from_secs(1)).ok())
                .collect()
        })
        .expect("entering the lb namespace");
    println!("{} idle API connections held", held.len());
    let fault = agent.wait_for_line(mark, "local fault", Duration::from_secs(10));
    // Twenty probe intervals with no descriptor.
    std::thread::sleep(Duration::from_secs(6));
    let log = agent.lines()[mark..].join("\n");
    let held_count = held.len();
    drop(held);

    let fault = fault.unwrap_or_else(|e| {
        panic!("the agent must log the local fault once out of descriptors: {e}\n{log}")
    });
    println!(
        "local faults: {} idle API connections; agent said: {fault}",
        held_count
    );
    assert!(
        !log.contains("to=\"unhealthy\"") && !log.contains("fail-open"),
        "no server may turn unhealthy and the service must not fail open:\n{log}"
    );
    // The API answers again once the connections are gone.
    let view = api
        .wait_service("web", "every server still up", VERDICT_WAIT, |s| {
            s.servers.iter().all(|v| v.state == "up" && v.active)
        })
        .map(|(v, _)| v)
        .expect("every server still up after the descriptor exhaustion");
    assert!(!view.fail_open);
    let transitions_after = api
        .events()
        .expect("GET /api/v1/events")
        .iter()
        .filter(|e| e.server != "-")
        .count();
    assert_eq!(
        transitions_after, transitions_before,
        "no server transition during the exhaustion"
    );
    let text = api.metrics().expect("GET /metrics");
    let faults = api::metric(&text, "lb_agent_local_faults_total", &[]).unwrap_or(0.0);
    println!("lb_agent_local_faults_total = {faults}");
    assert!(faults >= 5.0, "local faults counted: {faults}");
    agent.stop(STOP_GRACE).expect("stopping lb-agent");
}
