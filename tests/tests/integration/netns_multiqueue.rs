//! Flows handled on both CPUs at once never reach a backend the maps no longer name.
//!
//! Every veth of the bed has two queues; one sender in the client, pinned to CPU 0 and
//! CPU 1 in turn, sends one packet on every flow each round (UDP and TCP, to a nat and a
//! dsr service of each), so the lb's native program handles each flow's packets on both
//! CPUs, interleaved: each CPU sees each flow about twice per tick, the first time
//! through `LB_FLOWS`, the next from its per-CPU flow cache. It is checked, not assumed:
//! before each event, a flow of every cacheable service is in both CPUs' caches, and both
//! CPUs forwarded packets from their cache.
//!
//! Events, one after the other under that traffic: b3 drained through the API, then set
//! `down`; b1 dropped by a reload; b2's address moved to b4's MAC (the lb's neighbour entry
//! replaced); a reload that changes nothing; a restart whose config drops b3 too, which
//! retires b1; a restart that changes nothing. For each, a watch on `LB_BACKENDS` records
//! the moment the entries stopped naming the host (`lb_tests::scenario::unnamed`), and a
//! capture on every backend records what arrived; at the end, no frame of the services'
//! flows reached a host after its moment (a drained or dropped host: none but of the TCP
//! connections pinned to it, docs/membership.md), while b2's address, at b4, kept
//! receiving. docs/internals/fast-path.md, "The rule under several CPUs".

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    thread,
    time::Duration,
};

use lb_common::counters::{TX_DSR_CACHED, TX_NAT_FORWARD_CACHED};
use lb_tests::{
    agent::{
        api::Api,
        attached_maps::AttachedMaps,
        daemon::{Agent, AgentConfig, NAT_PORTS, Proto, START_TIMEOUT, Service, locate_binary},
    },
    net::topology::{Forwarding, HOST_IF, Host, Topology},
    scenario::{
        balance,
        unnamed::{HostId, Judgment, Named, Rule, Watch},
    },
    traffic::{
        arrivals::{Arrival, Capture},
        packet::{IPPROTO_TCP, IPPROTO_UDP},
        spread::{Spread, SpreadConfig},
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");

/// The services: `(name, protocol, forwarding, VIP port, backend port)`. Each has a
/// backend port of its own, so a frame's destination port says whose it is.
const SERVICES: [(&str, Proto, Forwarding, u16, u16); 4] = [
    ("tcp-dsr", Proto::Tcp, Forwarding::Dsr, 8080, 8080),
    ("udp-dsr", Proto::Udp, Forwarding::Dsr, 8081, 8081),
    ("tcp-nat", Proto::Tcp, Forwarding::Nat, 80, 8082),
    ("udp-nat", Proto::Udp, Forwarding::Nat, 53, 8083),
];
/// Flows per service: 12 in all, few enough that a round takes well under a millisecond.
const UDP_FLOWS: usize = 4;
const TCP_FLOWS: usize = 2;
/// Traffic after each event, before the next.
const PHASE: Duration = Duration::from_millis(1500);
/// How long an event may take to reach the maps (a restart: the agent's start).
const EVENT_LIMIT: Duration = Duration::from_secs(30);
/// The longest a frame without a stamp that the program sent before the write may take
/// from the lb to the backend: it crosses four veth queues on the CPU that handled it,
/// each emptied by that CPU's softirq, which on a loaded machine may wait in ksoftirqd
/// behind other tasks for a few ms. Stamped frames (every data packet) are judged by
/// their stamp, without this allowance.
const LATE: Duration = Duration::from_millis(10);
/// The sender's own bound (the whole scenario takes about 18 s).
const TRAFFIC_LIMIT: Duration = Duration::from_secs(120);

fn services(topo: &Topology, servers: &[&Host]) -> Vec<Service> {
    SERVICES
        .iter()
        .map(|&(name, protocol, forwarding, vip_port, port)| {
            let nat = forwarding == Forwarding::Nat;
            Service {
                name: name.to_owned(),
                vip: SocketAddr::new(IpAddr::V4(topo.vip4()), vip_port),
                protocol,
                forwarding,
                snat_ip: nat.then_some(IpAddr::V4(topo.lb().ipv4)),
                snat_ports: nat.then(|| format!("{}-{}", NAT_PORTS.start(), NAT_PORTS.end())),
                servers: servers
                    .iter()
                    .map(|h| (SocketAddr::new(IpAddr::V4(h.ipv4), port), 1))
                    .collect(),
                extra: Vec::new(),
            }
        })
        .collect()
}

/// Whether `a` is a frame of the scenario's flows (not a health probe): from the client
/// for a dsr port, from the lb's nat source ports for a nat port.
fn is_flow(topo: &Topology, a: &Arrival) -> bool {
    let Some(&(_, proto, forwarding, _, _)) = SERVICES.iter().find(|s| s.4 == a.dport) else {
        return false;
    };
    a.proto == ip_proto(proto)
        && match forwarding {
            Forwarding::Nat => a.src == topo.lb().ipv4 && NAT_PORTS.contains(&a.sport),
            _ => a.src == topo.client().ipv4,
        }
}

fn ip_proto(proto: Proto) -> u8 {
    match proto {
        Proto::Tcp => IPPROTO_TCP,
        Proto::Udp => IPPROTO_UDP,
    }
}

fn backend_ports() -> Vec<u16> {
    SERVICES.iter().map(|s| s.4).collect()
}

/// Checks that both CPUs hold a flow of every service the cache serves (TCP of both
/// modes, dsr UDP) in their caches right now; returns how many flows each CPU holds.
fn both_cpus_hold_flows(topo: &Topology, when: &str) -> Vec<usize> {
    let maps = AttachedMaps::open(&topo.lb().ns).expect("opening the program's maps");
    let by_cpu = maps.cached_flows().expect("reading the flow caches");
    assert!(by_cpu.len() >= 2, "{when}: {} CPUs", by_cpu.len());
    let client = u32::from_ne_bytes(topo.client().ipv4.octets());
    for &(name, proto, forwarding, vip_port, _) in &SERVICES {
        if proto == Proto::Udp && forwarding == Forwarding::Nat {
            // nat UDP always goes through LB_FLOWS (docs/internals/fast-path.md).
            continue;
        }
        let proto = ip_proto(proto);
        let of_service = |cpu: usize| {
            by_cpu[cpu]
                .iter()
                .filter(|k| k.src[0] == client && k.dport == vip_port.to_be() && k.proto == proto)
                .map(|k| k.sport)
                .collect::<Vec<_>>()
        };
        let (on0, on1) = (of_service(0), of_service(1));
        assert!(
            on0.iter().any(|p| on1.contains(p)),
            "{when}: {name}: no flow in both CPUs' caches (CPU 0 holds {} of its flows, \
             CPU 1 {}): the scenario does not spread flows over CPUs",
            on0.len(),
            on1.len()
        );
    }
    by_cpu.iter().map(Vec::len).collect()
}

/// The bed's hosts by role.
fn host<'t>(topo: &'t Topology, role: &str) -> &'t Host {
    topo.backends()
        .iter()
        .find(|b| b.role == role)
        .unwrap_or_else(|| panic!("no host {role}"))
}

/// TCP: flows pinned before the moment may stay; UDP: nothing.
fn pinned_tcp(port: u16) -> Rule {
    match SERVICES.iter().find(|s| s.4 == port).map(|s| s.1) {
        Some(Proto::Tcp) => Rule::PinnedOnly,
        _ => Rule::Nothing,
    }
}

/// Traffic for [`PHASE`], then the flows both CPUs hold (checked).
fn phase(topo: &Topology, when: &'static str) -> (&'static str, Vec<usize>) {
    thread::sleep(PHASE);
    (when, both_cpus_hold_flows(topo, when))
}

fn id(h: &Host) -> HostId {
    HostId {
        ip: h.ipv4,
        mac: h.mac,
    }
}

/// Starts watching `host` on every port, runs `event`, and returns a judgment per port.
fn judged(
    topo: &Topology,
    event: &str,
    host: &Host,
    named: Named,
    rule: impl Fn(u16) -> Rule,
    run: impl FnOnce(),
) -> Vec<Judgment> {
    let maps = AttachedMaps::open(&topo.lb().ns).expect("opening the program's maps");
    let watch = Watch::start(maps, id(host), named, &backend_ports(), EVENT_LIMIT)
        .unwrap_or_else(|e| panic!("{event}: {e}"));
    run();
    let moments = watch.moments().unwrap_or_else(|e| panic!("{event}: {e}"));
    moments
        .into_iter()
        .map(|(port, moment_ns)| Judgment {
            event: event.to_owned(),
            host: host.role.clone(),
            port,
            moment_ns,
            rule: rule(port),
        })
        .collect()
}

#[test]
fn flows_on_both_cpus_never_reach_a_backend_the_maps_no_longer_name() {
    let topo = Topology::builder()
        .backends(4)
        .forwarding(Forwarding::Dsr)
        .queues(2)
        .build()
        .expect("building the topology");
    let (b1, b2, b3, b4) = (
        host(&topo, "b1"),
        host(&topo, "b2"),
        host(&topo, "b3"),
        host(&topo, "b4"),
    );
    let _servers = balance::start_testservers_with(
        &topo,
        Path::new(TESTSERVER),
        &[
            "--tcp", "8080", "--tcp", "8082", "--udp", "8081", "--udp", "8083",
        ],
    )
    .expect("starting lb-testserver on every backend");
    let captures: Vec<(String, Capture)> = topo
        .backends()
        .iter()
        .map(|b| {
            let c = Capture::start(&b.ns, HOST_IF).expect("starting a capture");
            (b.role.clone(), c)
        })
        .collect();

    let binary = locate_binary("lb-agent").expect("finding lb-agent");
    let mut config = AgentConfig::new(services(&topo, &[b1, b2, b3]));
    let mut agent = Agent::start(&topo, &binary, &config, Some("native"), START_TIMEOUT)
        .expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    for (name, ..) in SERVICES {
        api.wait_service(name, "every server up", START_TIMEOUT, |s| {
            s.servers.iter().all(|v| v.state == "up" && v.active)
        })
        .expect("every server up");
    }

    let vip = IpAddr::V4(topo.vip4());
    let sender = Spread::start(
        &topo.client().ns,
        SpreadConfig {
            src: IpAddr::V4(topo.client().ipv4),
            targets: SERVICES
                .iter()
                .map(|&(_, proto, _, vip_port, _)| {
                    let n = if proto == Proto::Udp {
                        UDP_FLOWS
                    } else {
                        TCP_FLOWS
                    };
                    (proto, SocketAddr::new(vip, vip_port), n)
                })
                .collect(),
            round: Duration::from_micros(200),
            burst: 1,
            tcp_rounds: 600,
            limit: TRAFFIC_LIMIT,
        },
    );
    let mut held = vec![phase(&topo, "warm-up")];
    let mut judgments: Vec<Judgment> = Vec::new();

    // b3 drained: UDP flows leave it at once, TCP connections pinned to it stay, no new
    // connection reaches it (docs/membership.md: `Sticky`).
    let patch = |body: &str| {
        for &(name, _, _, _, port) in &SERVICES {
            api.patch_server(name, SocketAddr::new(IpAddr::V4(b3.ipv4), port), body)
                .unwrap_or_else(|e| panic!("PATCH {body} for b3 in {name}: {e}"));
        }
    };
    judgments.extend(judged(
        &topo,
        "b3 drained",
        b3,
        Named::Serving,
        pinned_tcp,
        || patch(r#"{"drain": true}"#),
    ));
    held.push(phase(&topo, "after the drain"));

    // b3 down: its pinned connections go too (`Removed`).
    judgments.extend(judged(
        &topo,
        "b3 down",
        b3,
        Named::Live,
        |_| Rule::Nothing,
        || patch(r#"{"down": true}"#),
    ));
    held.push(phase(&topo, "after b3 down"));

    // b1 dropped by a reload: `Sticky` for its grace period, as a drain.
    config = AgentConfig {
        services: services(&topo, &[b2, b3]),
        ..config
    };
    judgments.extend(judged(
        &topo,
        "b1 dropped by a reload",
        b1,
        Named::Serving,
        pinned_tcp,
        || {
            agent
                .reload(&config, START_TIMEOUT)
                .expect("reloading without b1");
        },
    ));
    held.push(phase(&topo, "after the reload"));

    // b2's address moves to b4: the lb's neighbour entry names b4's MAC, the flows pinned
    // to b2's backend ids follow the address.
    judgments.extend(judged(
        &topo,
        "b2's address moved to b4",
        b2,
        Named::Live,
        |_| Rule::Nothing,
        || {
            let cidr = format!("{}/24", b2.ipv4);
            b2.ns
                .ip(&["addr", "del", &cidr, "dev", HOST_IF])
                .expect("taking the address from b2");
            b4.ns
                .ip(&["addr", "add", &cidr, "dev", HOST_IF])
                .expect("giving the address to b4");
            topo.lb()
                .ns
                .ip(&[
                    "neigh",
                    "replace",
                    &b2.ipv4.to_string(),
                    "lladdr",
                    &b4.mac.to_string(),
                    "dev",
                    HOST_IF,
                    "nud",
                    "permanent",
                ])
                .expect("pointing the lb's neighbour entry at b4");
        },
    ));
    held.push(phase(&topo, "after the move"));

    // A reload that changes nothing.
    agent
        .reload_unchanged(START_TIMEOUT)
        .expect("reloading unchanged");
    held.push(phase(&topo, "after the plain reload"));

    // A restart whose config no longer has b3 either: the new agent retires b1, still in
    // its grace period, at its first publish (`Removed`).
    config = AgentConfig {
        services: services(&topo, &[b2]),
        ..config
    };
    judgments.extend(judged(
        &topo,
        "b1 retired by a restart",
        b1,
        Named::Live,
        |_| Rule::Nothing,
        || {
            std::fs::write(agent.config_path(), config.render_in(topo.dir()))
                .expect("writing the config without b3");
            agent
                .restart(&topo, libc::SIGTERM, START_TIMEOUT)
                .expect("restarting without b3");
        },
    ));
    held.push(phase(&topo, "after the restart"));

    // A restart that changes nothing.
    agent
        .restart(&topo, libc::SIGTERM, START_TIMEOUT)
        .expect("restarting unchanged");
    held.push(phase(&topo, "after the plain restart"));

    let maps = AttachedMaps::open(&topo.lb().ns).expect("opening the program's maps");
    let cached: Vec<Vec<u64>> = [TX_DSR_CACHED, TX_NAT_FORWARD_CACHED]
        .iter()
        .map(|&c| maps.counter_by_cpu(c).expect("reading the counters"))
        .collect();
    let report = sender.stop().expect("the sender");
    let arrivals: Vec<(String, Vec<Arrival>)> = captures
        .into_iter()
        .map(|(role, c)| (role, c.stop().expect("the capture")))
        .collect();
    let at = |role: &str| -> &[Arrival] {
        &arrivals
            .iter()
            .find(|(r, _)| r == role)
            .expect("a capture per backend")
            .1
    };

    println!("sender: {report:?}");
    println!("flows cached per CPU at each sample: {held:?}");
    println!("forwarded from the cache per CPU (dsr, nat): {cached:?}");
    for (role, a) in &arrivals {
        println!(
            "{role}: {} frames of the flows",
            a.iter().filter(|a| is_flow(&topo, a)).count()
        );
    }
    assert!(
        report.rounds_by_cpu.iter().all(|&r| r > 100),
        "the sender ran on both CPUs: {report:?}"
    );
    for (what, per_cpu) in ["dsr", "nat"].iter().zip(&cached) {
        assert!(
            per_cpu.iter().take(2).all(|&n| n > 0),
            "both CPUs forwarded {what} packets from their cache: {per_cpu:?}"
        );
    }

    let mut failures = Vec::new();
    for j in &judgments {
        let role = j.host.as_str();
        let late = j.late_arrivals(at(role), |a| is_flow(&topo, a), LATE);
        let before = j.arrivals_before(at(role), |a| is_flow(&topo, a));
        println!(
            "{}: port {} of {role}: {before} frames before the moment, {} after",
            j.event,
            j.port,
            late.len()
        );
        if !late.is_empty() {
            failures.push(format!(
                "{}: {} frames reached {role} on port {} after the maps stopped naming it \
                 (first: {:?}, {} µs after the moment)",
                j.event,
                late.len(),
                j.port,
                late[0],
                late[0].at_ns.saturating_sub(j.moment_ns) / 1000
            ));
        }
    }
    // Every event took flows away from its host, and the host still named kept them.
    for role in ["b1", "b2", "b3"] {
        let before: usize = judgments
            .iter()
            .filter(|j| j.host == role)
            .map(|j| j.arrivals_before(at(role), |a| is_flow(&topo, a)))
            .sum();
        assert!(before > 0, "{role} had flows before its event");
    }
    let last = judgments.iter().map(|j| j.moment_ns).max().unwrap_or(0);
    for &(name, _, _, _, port) in &SERVICES {
        let kept = at("b4")
            .iter()
            .filter(|a| a.dport == port && is_flow(&topo, a) && a.at_ns > last)
            .count();
        assert!(
            kept > 0,
            "{name}: b2's address at b4 kept receiving after the last event"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
