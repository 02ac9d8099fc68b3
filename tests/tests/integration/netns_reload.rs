//! Reload under traffic: a long-lived TCP connection to one backend keeps working while
//! *another* backend is removed from the config and the agent gets SIGHUP; new
//! connections then avoid the removed backend. A backend removed and added back while
//! its connections still run keeps them, also while its probe has not passed again. In
//! nat and in dsr.

use std::{path::Path, time::Duration};

use lb_tests::{
    agent::daemon::{AgentConfig, RELOAD_TIMEOUT},
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT, WEIGHTS},
        pinned::{self, PinnedToB1, VERDICT_WAIT},
        redundancy,
        restart::other_backend,
    },
    traffic::clients::{EchoConn, Tally},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const AFTER: usize = 300;
const DEADLINE: Duration = Duration::from_secs(60);

fn removal_keeps_other_flows(forwarding: Forwarding, subnet: u8) {
    let mode = forwarding.as_str();
    let bed = balance::Testbed::start(forwarding, subnet, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let agent = balance::start_agent(topo, vec![service.clone()], Some("native"))
        .expect("starting lb-agent");

    let client = topo.client();
    let mut conn = EchoConn::connect(&client.ns, client.ipv4.into(), vip)
        .expect("entering the client namespace")
        .unwrap_or_else(|e| panic!("{mode}: a connection to {vip} should be answered: {e}"));
    let kept = conn.backend().to_owned();
    for i in 0..3 {
        conn.check_echo(&format!("before reload {i}"))
            .unwrap_or_else(|e| {
                panic!("{mode}: long-lived connection to {kept} before the reload: {e}")
            });
    }

    // Remove a backend other than the one serving the long-lived connection.
    let (removed, removed_addr) = other_backend(topo, &kept);
    let config = AgentConfig::new(vec![service.without(removed_addr)]);
    let line = agent.reload(&config, RELOAD_TIMEOUT).unwrap_or_else(|e| {
        panic!(
            "{mode}: reload without {} should succeed: {e}",
            removed.role
        )
    });
    println!(
        "{mode}: removed {} ({removed_addr}) while {} ({}) held a connection: {line}",
        removed.role,
        kept,
        conn.local_addr().map(|a| a.to_string()).unwrap_or_default()
    );

    for i in 0..3 {
        conn.check_echo(&format!("after reload {i}"))
            .unwrap_or_else(|e| {
                panic!(
                    "{mode}: the long-lived connection to {kept} should survive removing {}: {e}",
                    removed.role
                )
            });
    }

    let tally: Tally = lb_tests::traffic::clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        10_000,
        vip,
        AFTER,
        DEADLINE,
    )
    .expect("entering the client namespace");
    let remaining: Vec<(&str, u32)> = balance::expected(&backends)
        .into_iter()
        .filter(|(name, _)| *name != removed.role)
        .collect();
    println!(
        "{mode}: {AFTER} new connections after removing {}:\n{}",
        removed.role,
        tally.table(&remaining)
    );
    assert!(
        tally.failures.is_empty(),
        "{mode}: every new connection should be answered after the reload, {} failed: {:?}",
        tally.failures.len(),
        &tally.failures[..tally.failures.len().min(5)]
    );
    assert_eq!(
        tally.counts.get(&removed.role),
        None,
        "{mode}: no new connection should reach the removed backend {}",
        removed.role
    );
    for (name, _) in &remaining {
        assert!(
            tally.counts.get(*name).is_some_and(|n| *n > 0),
            "{mode}: {name} should still get new connections: {:?}",
            tally.counts
        );
    }

    conn.check_echo("at the end").unwrap_or_else(|e| {
        panic!("{mode}: the long-lived connection to {kept} after the new connections: {e}")
    });
}

#[test]
fn reload_nat_keeps_long_lived_connection() {
    removal_keeps_other_flows(Forwarding::Nat, 31);
}

#[test]
fn reload_dsr_keeps_long_lived_connection() {
    removal_keeps_other_flows(Forwarding::Dsr, 32);
}

/// b1 holds a long-lived connection; a reload removes b1 (it takes no new flow, the
/// connection stays) and, with b1's health listener stopped, a second reload adds it
/// back: b1 is `checking` again, and the connection pinned to it keeps echoing until
/// and after its probe passes.
fn added_back_keeps_its_connection(forwarding: Forwarding, subnet: u8) {
    let mode = forwarding.as_str();
    let topo = pinned::topology(forwarding, subnet);
    let mut bed = PinnedToB1::start(&topo, Path::new(TESTSERVER));
    let all = bed.service_of(&topo, &bed.members);
    let without_b1 = bed.service_of(&topo, &bed.members[1..]);
    let b1 = bed.members[0];
    bed.agent
        .reload(&AgentConfig::new(vec![without_b1]), RELOAD_TIMEOUT)
        .unwrap_or_else(|e| panic!("{mode}: reload without b1: {e}"));
    bed.pinned
        .check_echo("after the removal")
        .unwrap_or_else(|e| panic!("{mode}: removed b1 keeps its connection: {e}"));

    bed.backends
        .kill_health("b1")
        .expect("stopping b1's health listener");
    bed.agent
        .reload(&AgentConfig::new(vec![all]), RELOAD_TIMEOUT)
        .unwrap_or_else(|e| panic!("{mode}: reload adding b1 back: {e}"));
    let (view, _) = bed
        .api
        .wait_service("web", "b1 back, checking", VERDICT_WAIT, |s| {
            s.server(b1.addr())
                .is_some_and(|v| v.state == "checking" && !v.active)
        })
        .unwrap_or_else(|e| panic!("{mode}: b1 is back and checking: {e}"));
    println!(
        "added back {mode}: b1 checking\n{}",
        view.describe(|a| redundancy::name_of(&bed.members, a))
    );
    for i in 0..3 {
        bed.pinned
            .check_echo(&format!("while b1 is checking again {i}"))
            .unwrap_or_else(|e| {
                panic!(
                    "{mode}: b1 added back within its grace period must keep its connection: {e}"
                )
            });
        std::thread::sleep(Duration::from_millis(300));
    }

    bed.b1_health_returns(mode);
}

#[test]
fn reload_adding_back_a_removed_backend_keeps_its_connection_nat() {
    added_back_keeps_its_connection(Forwarding::Nat, 34);
}

#[test]
fn reload_adding_back_a_removed_backend_keeps_its_connection_dsr() {
    added_back_keeps_its_connection(Forwarding::Dsr, 35);
}

/// `lb-agent ready` promises a working agent, SIGHUP handling included: a reload sent
/// the moment the line appears must be a reload, not the default action of SIGHUP
/// (which ends the process). Tried a few times, as the window is short.
#[test]
fn reload_right_after_ready_is_handled() {
    let topo = Topology::builder()
        .backends(1)
        .forwarding(Forwarding::Nat)
        .subnet(33)
        .build()
        .expect("building the topology");
    let backends = balance::weighted(&topo, &[1]);
    let config = AgentConfig::new(vec![balance::tcp_service(&topo, &backends)]);
    for attempt in 1..=5 {
        let agent = balance::start_agent(&topo, config.services.clone(), Some("native"))
            .expect("starting lb-agent");
        agent.reload(&config, RELOAD_TIMEOUT).unwrap_or_else(|e| {
            panic!(
                "attempt {attempt}: SIGHUP right after `lb-agent ready` should reload the config \
                 (signal handlers installed before the ready line), got: {e}"
            )
        });
        let status = agent
            .stop(lb_tests::util::process::STOP_GRACE)
            .expect("stopping lb-agent");
        assert!(
            status.success(),
            "attempt {attempt}: lb-agent should exit 0 on SIGTERM, got {status}"
        );
    }
}

/// `lb-agent reload` (through the API): an invalid file, and one with a dsr backend
/// behind a router, is refused with its error and the running config stays in force; a
/// valid one is applied.
#[test]
fn reload_command_refuses_a_bad_file_and_applies_a_good_one() {
    let bed = balance::Testbed::start(Forwarding::Nat, 33, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let _agent = balance::start_agent(topo, vec![service.clone()], Some("native"))
        .expect("starting lb-agent");
    let binary = lb_tests::agent::daemon::locate_binary("lb-agent").expect("lb-agent binary");
    let config_path = topo.dir().join("lb.toml");
    let socket = lb_tests::agent::daemon::socket_path(topo.dir())
        .display()
        .to_string();
    let reload = || {
        lb_tests::agent::api::cli(
            &topo.lb().ns,
            &binary,
            &["reload", "--socket", &socket],
            Duration::from_secs(10),
        )
    };

    let good = std::fs::read_to_string(&config_path).expect("reading the config");
    std::fs::write(
        &config_path,
        format!("{good}\n[[service.server]]\nweight = 0\n"),
    )
    .expect("writing a bad config");
    let refused = reload().expect_err("a config with an error must be refused");
    let text = refused.to_string();
    assert!(
        text.contains("lb.toml:") && text.contains("service[0].server[3]"),
        "the refusal should name the file, line and key: {text}"
    );
    // A dsr backend behind a router is refused too, as doctor calls it a blocker: the
    // program would send its packets to the router, which sends them back.
    let client = topo.client();
    topo.lb()
        .ns
        .ip(&[
            "route",
            "add",
            "10.88.0.0/24",
            "via",
            &client.ipv4.to_string(),
        ])
        .expect("a route through the client");
    std::fs::write(
        &config_path,
        format!(
            "{good}\n[[service]]\nname = \"routed\"\nvip = \"{}:8080\"\nforwarding = \"dsr\"\n\n\
             [[service.server]]\naddress = \"10.88.0.11:8080\"\n",
            vip.ip()
        ),
    )
    .expect("writing a config with a routed dsr backend");
    let refused = reload().expect_err("a dsr backend behind a router must be refused");
    let text = refused.to_string();
    assert!(
        text.contains("dsr backend 10.88.0.11 is reached through the router"),
        "the refusal should say why: {text}"
    );
    let tally = lb_tests::traffic::clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        12_000,
        vip,
        60,
        DEADLINE,
    )
    .expect("entering the client namespace");
    assert!(
        tally.failures.is_empty() && tally.counts.len() == 3,
        "the running config stays in force after a refused reload: {:?} {:?}",
        tally.counts,
        tally.failures
    );

    let removed = &topo.backends()[0];
    let removed_addr = std::net::SocketAddr::new(removed.ipv4.into(), BACKEND_TCP_PORT);
    let config = AgentConfig::new(vec![service.without(removed_addr)]);
    std::fs::write(&config_path, config.render_in(topo.dir())).expect("writing the new config");
    let out = reload().expect("a valid config must be applied");
    assert!(
        out.contains("config reloaded"),
        "lb-agent reload said: {out}"
    );
    let tally = lb_tests::traffic::clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        13_000,
        vip,
        120,
        DEADLINE,
    )
    .expect("entering the client namespace");
    println!(
        "reload command: after removing {}: {:?}",
        removed.role, tally.counts
    );
    assert!(tally.failures.is_empty(), "{:?}", tally.failures);
    assert_eq!(
        tally.counts.get(&removed.role),
        None,
        "no new connection may reach the removed backend"
    );
}
