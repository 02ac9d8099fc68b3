//! The removal cap through the real agent (DESIGN.md §6, Azure's
//! `WEBSITE_HEALTHCHECK_MAXUNHEALTHYWORKERPERCENT`): four servers b1..b4 of weight 1,
//! `max_unhealthy_percent = 50`, probed by `tcp` on a separate health listener while the
//! service port keeps answering.
//!
//! The probes of b1, b2 and b3 fail, in that order: health may remove at most 2 of 4, so
//! b1 and b2 (the earliest failures) leave the table and b3, the latest, is held in it —
//! new connections go to b3:b4 = 1:1. When b1 recovers only two are unhealthy, within
//! the cap: b3 is released and leaves the table, and traffic goes to b1:b4.

use std::{path::Path, time::Duration};

use lb_tests::{
    agent::api::Api,
    net::topology::{Forwarding, Topology},
    scenario::redundancy::{self, Backends, HEALTH_PORT, Member, SourcePorts, TcpProbe},
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Two backends at 1:1: ±15 % is more than 3.5 standard deviations over 600.
const CONNECTIONS: usize = 600;
const VERDICT_WAIT: Duration = Duration::from_secs(15);

#[test]
fn removal_cap_holds_the_latest_failure_in_traffic() {
    let topo = Topology::builder()
        .backends(4)
        .forwarding(Forwarding::Nat)
        .subnet(149)
        .build()
        .expect("building the topology");
    let h = topo.backends();
    let members = [
        Member::primary("b1", &h[0], 1),
        Member::primary("b2", &h[1], 1),
        Member::primary("b3", &h[2], 1),
        Member::primary("b4", &h[3], 1),
    ];
    let [b1, b2, b3, b4] = members;
    let mut backends = Backends::start(Path::new(TESTSERVER), &members, true)
        .expect("starting a testserver and a health listener per member");
    let probe = TcpProbe::fast().on_port(HEALTH_PORT);
    let service = redundancy::service(
        &topo,
        "web",
        &members,
        &probe,
        &["max_unhealthy_percent = 50"],
    );
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
    .unwrap_or_else(|e| panic!("all four servers should be up after start: {e}"));

    // One after the other, so that the order of failure is known.
    for m in [b1, b2, b3] {
        backends
            .kill_health(m.name)
            .expect("stopping a health listener");
        let (_, took) = api
            .wait_service("web", &format!("{} unhealthy", m.name), VERDICT_WAIT, |s| {
                s.server(m.addr()).is_some_and(|v| v.state == "unhealthy")
            })
            .unwrap_or_else(|e| {
                panic!(
                    "{}'s probe fails once its health listener is gone: {e}",
                    m.name
                )
            });
        println!(
            "cap: {} health listener killed; unhealthy after {took:.2?}",
            m.name
        );
    }
    let view = api.service("web").expect("GET service");
    println!(
        "cap: three of four probes failing, max_unhealthy_percent = 50\n{}",
        view.describe(name)
    );
    let active: Vec<String> = view
        .servers
        .iter()
        .filter(|s| s.active)
        .map(|s| name(s.address))
        .collect();
    assert_eq!(
        active,
        ["b3", "b4"],
        "at most 2 of 4 may leave: b1 and b2 (earliest failures) out, b3 held, b4 in:\n{}",
        view.describe(name)
    );
    let events = api.events().expect("GET /api/v1/events");
    let held = events
        .iter()
        .find(|e| e.cause.starts_with("removal cap") && e.cause.contains(&b3.addr().to_string()))
        .unwrap_or_else(|| panic!("an event should say the cap holds b3: {events:#?}"));
    println!("cap: event {}: {}", held.time, held.cause);

    redundancy::expect_shares(
        client,
        &mut ports,
        vip,
        CONNECTIONS,
        &[&b3, &b4],
        &format!("cap: {CONNECTIONS} connections with b3 held"),
        "with b1 and b2 removed and b3 held, traffic should be b3:b4 = 1:1",
    );

    // b1 recovers: two unhealthy of four is within the cap, so b3 is released.
    backends
        .restart_health(b1.name)
        .expect("restarting b1's health listener");
    let (view, took) = api
        .wait_service("web", "b1 back and b3 released", VERDICT_WAIT, |s| {
            s.server(b1.addr()).is_some_and(|v| v.active)
                && s.server(b3.addr()).is_some_and(|v| !v.active)
        })
        .unwrap_or_else(|e| panic!("once b1 recovers the cap no longer needs to hold b3: {e}"));
    println!(
        "cap: b1's health listener back; after {took:.2?}\n{}",
        view.describe(name)
    );
    redundancy::expect_shares(
        client,
        &mut ports,
        vip,
        CONNECTIONS,
        &[&b1, &b4],
        &format!("cap: {CONNECTIONS} connections with b1 back"),
        "with b2 and b3 unhealthy (within the cap), traffic should be b1:b4 = 1:1",
    );

    let status = agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(
        status.success(),
        "lb-agent should exit 0 on SIGTERM, got {status}"
    );
}
