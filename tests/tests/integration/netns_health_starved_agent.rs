//! A starved agent never blames servers for its own lateness (root, netns): the real
//! `lb-agent` pinned to one CPU with 100 healthy servers (two hosts, 50 ports each) probed
//! every second by the SYN check, then a `SCHED_FIFO` hog on that CPU for 15 s leaves
//! the agent about 5 % of it. Probes are judged by the kernel's stamps, a probe the agent
//! cannot judge is a local fault, and overdue probes are spread after the stall: no
//! server may change state during the stall or after it.

use std::{collections::BTreeMap, net::SocketAddr, path::Path, time::Duration};

use lb_tests::{
    agent::{
        api::{self, Api},
        daemon::{Proto, Service},
    },
    bench::cpu::{self, FifoHog},
    net::topology::{Forwarding, Topology},
    scenario::{
        balance,
        health::{HealthServers, Probe, ProbeKind, wait_all_probed_up, with_health},
    },
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Ports each backend host serves: 2 × 50 = 100 servers.
const PORTS: u16 = 50;
const FIRST_PORT: u16 = 9100;
const HOG: Duration = Duration::from_secs(15);
/// After the stall: every server probed a few times more.
const AFTER: Duration = Duration::from_secs(6);
const FIRST_VERDICTS: Duration = Duration::from_secs(30);
/// The agent's CPU (the hog's).
const CPU: usize = 1;

#[test]
fn a_starved_agent_changes_no_servers_state() {
    assert!(
        std::thread::available_parallelism().map_or(0, |n| n.get()) > CPU,
        "needs CPU {CPU}"
    );
    let topo = Topology::builder()
        .backends(2)
        .forwarding(Forwarding::Nat)
        .subnet(207)
        .build()
        .expect("building the topology");
    let hosts: BTreeMap<String, _> = topo
        .backends()
        .iter()
        .map(|b| (b.role.clone(), b.ns.clone()))
        .collect();
    let ports: Vec<u16> = (FIRST_PORT..FIRST_PORT + PORTS).collect();
    let flags: Vec<String> = ports
        .iter()
        .flat_map(|p| ["--tcp".to_owned(), p.to_string()])
        .collect();
    let roles: Vec<&str> = hosts.keys().map(String::as_str).collect();
    let _servers = HealthServers::start_on(
        topo.dir(),
        Path::new(TESTSERVER),
        hosts.clone(),
        flags,
        &roles,
    )
    .expect("starting lb-testserver on both backends");
    let addrs: Vec<SocketAddr> = topo
        .backends()
        .iter()
        .flat_map(|b| {
            ports
                .iter()
                .map(move |p| SocketAddr::new(b.ipv4.into(), *p))
        })
        .collect();
    // Probes every second; one miss turns a server unhealthy.
    let probe = Probe::new(
        "port",
        ProbeKind::Tcp,
        Duration::from_secs(1),
        Duration::from_millis(500),
        1,
        1,
    )
    .key("tcp_check = \"syn\"");
    let weighted = balance::weighted(&topo, &[1, 1]);
    let mut service = Service::on(&topo, "web", Proto::Tcp, false, 80, &weighted, FIRST_PORT);
    service.servers = addrs.iter().map(|a| (*a, 1)).collect();
    let service = with_health(service, &["max_fails = 0"], &[probe]);
    let agent =
        balance::start_agent(&topo, vec![service], Some("native")).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    wait_all_probed_up(&api, "web", &addrs, FIRST_VERDICTS).expect("every server up");
    let pid = agent.process().pid();
    cpu::pin(pid, CPU).expect("pinning the agent's threads");
    let transitions = |api: &Api| {
        api.events()
            .expect("GET /api/v1/events")
            .iter()
            .filter(|e| e.server != "-")
            .count()
    };
    let before = transitions(&api);
    let faults_before = local_faults(&api);
    let mark = agent.process().lines().len();

    let spun = FifoHog::start(CPU, HOG).join().expect("a SCHED_FIFO hog");
    std::thread::sleep(AFTER);

    let log = agent.process().lines()[mark..].join("\n");
    let faults = local_faults(&api) - faults_before;
    let after = transitions(&api);
    println!(
        "hog {spun:?} on CPU {CPU}; local faults during and after it: {faults}; \
         transitions {before} -> {after}"
    );
    assert!(
        !log.contains("to=\"unhealthy\""),
        "no server may turn unhealthy because the agent was starved:\n{log}"
    );
    assert_eq!(
        after, before,
        "no transition during or after the stall:\n{log}"
    );
    for a in &addrs {
        let (state, _) =
            lb_tests::scenario::health::server_health(&api, "web", *a).expect("server");
        assert_eq!(state, "up", "{a}");
    }
    agent.stop(STOP_GRACE).expect("stopping lb-agent");
}

fn local_faults(api: &Api) -> f64 {
    let text = api.metrics().expect("GET /metrics");
    api::metric(&text, "lb_agent_local_faults_total", &[]).unwrap_or(0.0)
}
