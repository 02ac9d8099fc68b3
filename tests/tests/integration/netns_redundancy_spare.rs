//! Spare servers through the real agent (DESIGN.md §6): primaries p1 (weight 2) and p2
//! (weight 1), spares s1 (weight 1) and s2 (weight 2), a `tcp` probe every 300 ms.
//!
//! 1. All primaries up: spares idle, traffic on p1:p2 = 2:1, none on the spares.
//! 2. p1's server is killed: the fewest spares covering the missing weight 2 run — s2
//!    alone (largest weight first) — so new connections go to p2:s2 = 1:2 and s1 gets
//!    none; the API shows `spare: running` / `idle`, `spare_num` 1, `active_weight` 1.
//! 3. p1 comes back: s2 retires (idle, no new connections), while a long-lived connection
//!    opened on s2 during step 2 keeps echoing.

use std::{path::Path, time::Duration};

use lb_tests::{
    agent::api::Api,
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::SHARE_TOLERANCE,
        redundancy::{self, Backends, Member, SourcePorts, TcpProbe},
    },
    traffic::clients,
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Connections per distribution check: the smallest expected share is 1/3, and ±15 % of
/// it is 3 standard deviations of a binomial share over 900 connections.
const CONNECTIONS: usize = 900;
const DEADLINE: Duration = Duration::from_secs(90);
/// Wait for a verdict seen through the API: the probe's detection bound (1.3 s) plus a
/// wide margin for a machine busy with other builds.
const VERDICT_WAIT: Duration = Duration::from_secs(15);

#[test]
fn spare_covers_missing_weight_and_retires() {
    let topo = Topology::builder()
        .backends(4)
        .forwarding(Forwarding::Nat)
        .subnet(141)
        .build()
        .expect("building the topology");
    let hosts = topo.backends();
    let p1 = Member::primary("p1", &hosts[0], 2);
    let p2 = Member::primary("p2", &hosts[1], 1);
    let s1 = Member::spare("s1", &hosts[2], 1);
    let s2 = Member::spare("s2", &hosts[3], 2);
    let members = [p1, p2, s1, s2];
    let mut backends = Backends::start(Path::new(TESTSERVER), &members, false)
        .expect("starting a testserver per member");
    let probe = TcpProbe::fast();
    let service = redundancy::service(&topo, "web", &members, &probe, &[]);
    let vip = service.vip;
    let agent = lb_tests::scenario::balance::start_agent(&topo, vec![service], Some("native"))
        .expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let name = |a| redundancy::name_of(&members, a);
    let client = topo.client();
    let mut ports = SourcePorts::new();

    // 1. Everything up: spares idle.
    let (view, _) = api
        .wait_service("web", "every server up", VERDICT_WAIT, |s| {
            s.servers.iter().all(|v| v.state == "up")
        })
        .unwrap_or_else(|e| panic!("all four servers should be up after start: {e}"));
    println!("spare: at start\n{}", view.describe(name));
    assert_eq!(
        (view.main_weight, view.active_weight, view.spare_num),
        (3, 3, 0),
        "main_weight = p1+p2 = 3, all of it active, no spare running:\n{}",
        view.describe(name)
    );
    for s in [s1, s2] {
        let v = view.server(s.addr()).expect("spare in the API");
        assert_eq!(
            (v.spare.as_deref(), v.active),
            (Some("idle"), false),
            "{} should be an idle spare, out of the table, while the primaries are up",
            s.name
        );
    }
    redundancy::expect_shares(
        client,
        &mut ports,
        vip,
        CONNECTIONS,
        &[&p1, &p2],
        &format!("spare: {CONNECTIONS} connections, primaries up"),
        "with the primaries up, traffic should be p1:p2 = 2:1 and none on spares",
    );

    // 2. p1 fails: s2 (weight 2) covers its weight 2 alone.
    backends.kill("p1").expect("stopping p1's server");
    let (view, took) = api
        .wait_service("web", "s2 running after p1 failed", VERDICT_WAIT, |s| {
            s.server(s2.addr())
                .is_some_and(|v| v.spare.as_deref() == Some("running") && v.active)
                && s.server(p1.addr()).is_some_and(|v| !v.active)
        })
        .unwrap_or_else(|e| {
            panic!("after p1's server is killed, spare s2 should run in its place: {e}")
        });
    println!(
        "spare: p1 killed; s2 running after {took:.2?} (probe detection bound {:?})\n{}",
        probe.detection_bound(),
        view.describe(name)
    );
    assert_eq!(
        (view.main_weight, view.active_weight, view.spare_num),
        (3, 1, 1),
        "main_weight 3, active_weight = p2 = 1, one spare running:\n{}",
        view.describe(name)
    );
    let v1 = view.server(s1.addr()).expect("s1 in the API");
    assert_eq!(
        (v1.spare.as_deref(), v1.active),
        (Some("idle"), false),
        "s1 (weight 1) must stay idle: s2 (weight 2) alone covers the missing weight 2"
    );
    assert_ne!(
        view.server(p1.addr()).map(|v| v.state.as_str()),
        Some("up"),
        "p1 should not be up once its server is gone"
    );

    let mut pinned = redundancy::echo_on(&client.ns, client.ipv4.into(), vip, s2.name, 40)
        .unwrap_or_else(|e| panic!("a long-lived connection to s2 while it runs: {e}"));
    pinned
        .check_echo("while s2 runs")
        .unwrap_or_else(|e| panic!("long-lived connection on s2: {e}"));

    let tally = clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        ports.take(CONNECTIONS),
        vip,
        CONNECTIONS,
        DEADLINE,
    )
    .expect("entering the client namespace");
    let want = redundancy::shares(&[&p2, &s2]);
    println!(
        "spare: {CONNECTIONS} connections, p1 down:\n{}",
        tally.table(&want)
    );
    tally
        .check_shares(&want, SHARE_TOLERANCE)
        .unwrap_or_else(|e| {
            panic!(
                "with p1 down and s2 running, traffic should be p2:s2 = 1:2, none on p1 or s1:\n{e}"
            )
        });

    // 3. p1 back: s2 retires; its pinned flow stays.
    backends.restart("p1").expect("restarting p1's server");
    let (view, took) = api
        .wait_service("web", "s2 idle after p1 recovered", VERDICT_WAIT, |s| {
            s.spare_num == 0
                && s.server(p1.addr())
                    .is_some_and(|v| v.state == "up" && v.active)
        })
        .unwrap_or_else(|e| panic!("after p1 is back, s2 should retire: {e}"));
    println!(
        "spare: p1 restarted; s2 idle after {took:.2?} (recovery bound {:?})\n{}",
        probe.recovery_bound(),
        view.describe(name)
    );
    let v2 = view.server(s2.addr()).expect("s2 in the API");
    assert_eq!(
        (v2.spare.as_deref(), v2.active, v2.state.as_str()),
        (Some("idle"), false, "up"),
        "s2 should be a healthy idle spare, out of the table"
    );
    assert_eq!(view.active_weight, 3, "p1 and p2 active again");

    redundancy::expect_shares(
        client,
        &mut ports,
        vip,
        CONNECTIONS,
        &[&p1, &p2],
        &format!("spare: {CONNECTIONS} connections, p1 back"),
        "after s2 retired, new connections should be p1:p2 = 2:1 and none on s2",
    );
    for i in 0..3 {
        pinned
            .check_echo(&format!("after s2 retired {i}"))
            .unwrap_or_else(|e| {
                panic!("a flow pinned to s2 should keep working after s2 retired: {e}")
            });
    }
    println!(
        "spare: the connection from {} pinned to s2 still echoes after s2 retired",
        pinned
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    );

    let status = agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(
        status.success(),
        "lb-agent should exit 0 on SIGTERM, got {status}"
    );
}
