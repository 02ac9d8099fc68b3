//! Fail-open through the real agent (DESIGN.md §6): b1, b2, b3 weighted 1:1:2, probed by
//! `tcp` on a separate health listener (port 9000) while the service port (8080) is
//! served by another process. Killing every health listener makes every probe fail while
//! every server still answers on the service port.
//!
//! - `fail_open = true` (default): the API says `fail_open: true`, `/metrics` says
//!   `lb_service_fail_open{service="web"} 1`, and client connections still succeed,
//!   spread over all servers by weight, with no `drop_no_backend`.
//! - `fail_open = false`: new connections fail, and each dropped SYN is counted in
//!   `lb_packets_dropped_total{reason="no_backend"}`.
//!
//! Both end with the health listeners back and traffic served normally.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::api::{self, Api},
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{SHARE_TOLERANCE, WEIGHTS},
        redundancy::{self, Backends, HEALTH_PORT, Member, SourcePorts, TcpProbe},
    },
    traffic::clients,
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// ±15 % of the smallest share (1/4) is 2.6 standard deviations of a binomial share over
/// 900 connections; source ports and addresses are fixed, so a run's shares repeat.
const CONNECTIONS: usize = 900;
const DEADLINE: Duration = Duration::from_secs(90);
const VERDICT_WAIT: Duration = Duration::from_secs(15);
/// Connection attempts expected to fail, and how long each waits for its SYN-ACK.
const ATTEMPTS: usize = 10;
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);
/// The agent refreshes its counters every 500 ms; wait well beyond that.
const COUNTER_WAIT: Duration = Duration::from_secs(10);

const NAMES: [&str; 3] = ["b1", "b2", "b3"];

fn drops(api: &Api) -> f64 {
    let text = api.metrics().expect("GET /metrics");
    api::metric(
        &text,
        "lb_packets_dropped_total",
        &[("reason", "no_backend")],
    )
    .expect("lb_packets_dropped_total{reason=\"no_backend\"} in /metrics")
}

fn fail_open_metric(api: &Api) -> f64 {
    let text = api.metrics().expect("GET /metrics");
    api::metric(&text, "lb_service_fail_open", &[("service", "web")])
        .expect("lb_service_fail_open{service=\"web\"} in /metrics")
}

/// Waits until `drop_no_backend` reaches `at_least`; returns the last value seen.
fn wait_drops(api: &Api, at_least: f64) -> f64 {
    let start = Instant::now();
    loop {
        let now = drops(api);
        if now >= at_least || start.elapsed() > COUNTER_WAIT {
            return now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn fail_open(fail_open: bool, subnet: u8) {
    let label = if fail_open {
        "fail_open = true"
    } else {
        "fail_open = false"
    };
    let topo = Topology::builder()
        .backends(3)
        .forwarding(Forwarding::Nat)
        .subnet(subnet)
        .build()
        .expect("building the topology");
    let h = topo.backends();
    let members = [
        Member::primary("b1", &h[0], WEIGHTS[0]),
        Member::primary("b2", &h[1], WEIGHTS[1]),
        Member::primary("b3", &h[2], WEIGHTS[2]),
    ];
    let mut backends = Backends::start(Path::new(TESTSERVER), &members, true)
        .expect("starting a testserver and a health listener per member");
    let probe = TcpProbe::fast().on_port(HEALTH_PORT);
    let setting = format!("fail_open = {fail_open}");
    let service = redundancy::service(&topo, "web", &members, &probe, &[&setting]);
    let vip = service.vip;
    let agent = lb_tests::scenario::balance::start_agent(&topo, vec![service], Some("native"))
        .expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let name = |a| redundancy::name_of(&members, a);
    let client = topo.client();
    let mut ports = SourcePorts::new();
    api.wait_service("web", "every server up", VERDICT_WAIT, |s| {
        s.servers.iter().all(|v| v.state == "up" && v.active)
    })
    .unwrap_or_else(|e| panic!("{label}: all servers should be up after start: {e}"));
    assert_eq!(
        fail_open_metric(&api),
        0.0,
        "{label}: not failing open at start"
    );

    for n in NAMES {
        backends.kill_health(n).expect("stopping a health listener");
    }
    let (view, took) = api
        .wait_service("web", "every server unhealthy", VERDICT_WAIT, |s| {
            s.servers.iter().all(|v| v.state == "unhealthy")
        })
        .unwrap_or_else(|e| {
            panic!("{label}: every probe fails once the health listeners are gone: {e}")
        });
    println!(
        "{label}: every health listener killed; all unhealthy after {took:.2?}\n{}",
        view.describe(name)
    );
    assert_eq!(
        view.fail_open, fail_open,
        "{label}: the API's fail_open with every server unhealthy"
    );
    assert_eq!(
        view.servers.iter().all(|s| s.active),
        fail_open,
        "{label}: every server in the table exactly when failing open:\n{}",
        view.describe(name)
    );
    let metric = fail_open_metric(&api);
    println!("{label}: lb_service_fail_open{{service=\"web\"}} = {metric}");
    assert_eq!(
        metric,
        f64::from(u8::from(fail_open)),
        "{label}: lb_service_fail_open{{service=\"web\"}} with every server unhealthy"
    );

    let before = drops(&api);
    if fail_open {
        let tally = clients::tcp_names(
            &client.ns,
            client.ipv4.into(),
            ports.take(CONNECTIONS),
            vip,
            CONNECTIONS,
            DEADLINE,
        )
        .expect("entering the client namespace");
        let want: Vec<(&str, u32)> = members.iter().map(|m| (m.name, m.weight)).collect();
        println!(
            "{label}: {CONNECTIONS} connections while every probe fails:\n{}",
            tally.table(&want)
        );
        tally
            .check_shares(&want, SHARE_TOLERANCE)
            .unwrap_or_else(|e| {
                panic!(
                    "{label}: failing open, connections should succeed, spread 1:1:2 over all:\n{e}"
                )
            });
        // Give the counters a refresh; nothing may have been dropped.
        std::thread::sleep(Duration::from_millis(1200));
        let after = drops(&api);
        println!("{label}: drop_no_backend {before} -> {after}");
        assert_eq!(
            after, before,
            "{label}: failing open, no packet should be dropped for want of a backend"
        );
    } else {
        let tally = redundancy::tcp_attempts(
            &client.ns,
            client.ipv4.into(),
            ports.take(ATTEMPTS),
            vip,
            ATTEMPTS,
            ATTEMPT_TIMEOUT,
            DEADLINE,
        )
        .expect("entering the client namespace");
        let after = wait_drops(&api, before + ATTEMPTS as f64);
        println!(
            "{label}: {ATTEMPTS} connection attempts ({ATTEMPT_TIMEOUT:?} each): {}; \
             drop_no_backend {before} -> {after}",
            redundancy::spread(&tally)
        );
        assert_eq!(
            tally.answered(),
            0,
            "{label}: with every server unhealthy no new connection may be answered: {:?}",
            tally.counts
        );
        assert!(
            after >= before + ATTEMPTS as f64,
            "{label}: each of the {ATTEMPTS} SYNs should count as drop_no_backend \
             ({before} -> {after})"
        );
    }

    for n in NAMES {
        backends
            .restart_health(n)
            .expect("restarting a health listener");
    }
    let (view, took) = api
        .wait_service("web", "every server up again", VERDICT_WAIT, |s| {
            !s.fail_open && s.servers.iter().all(|v| v.state == "up" && v.active)
        })
        .unwrap_or_else(|e| {
            panic!("{label}: servers should recover with their health listeners: {e}")
        });
    println!(
        "{label}: health listeners back; all up after {took:.2?}\n{}",
        view.describe(name)
    );
    assert_eq!(fail_open_metric(&api), 0.0, "{label}: fail-open over");
    let tally = clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        ports.take(100),
        vip,
        100,
        DEADLINE,
    )
    .expect("entering the client namespace");
    println!("{label}: after recovery: {}", redundancy::spread(&tally));
    assert!(
        tally.failures.is_empty(),
        "{label}: every connection answered after recovery: {:?}",
        &tally.failures[..tally.failures.len().min(5)]
    );

    let status = agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(
        status.success(),
        "lb-agent should exit 0 on SIGTERM, got {status}"
    );
}

#[test]
fn fail_open_spreads_over_all_servers() {
    fail_open(true, 147);
}

#[test]
fn fail_closed_drops_and_counts() {
    fail_open(false, 148);
}
