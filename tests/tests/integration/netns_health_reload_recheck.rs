//! `persistent` through the real agent (docs/probes.md): a SIGHUP reload
//! of the unchanged file re-runs a non-persistent essential probe on every up server —
//! each goes back to `checking` and returns with a fresh `checking -> up` transition,
//! promptly (first probes within 250 ms, not the 5 s interval) — while with
//! `persistent = true` the servers stay up with no transition at all.

use std::{net::SocketAddr, path::Path, thread, time::Duration};

use lb_tests::{
    agent::{
        api::Api,
        daemon::{AgentConfig, RELOAD_TIMEOUT},
    },
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{
            HealthServers, MARGIN, Probe, event_time, find_event, secs, server_health,
            wait_all_probed_up, wait_event, with_health,
        },
    },
    traffic::pacer::wall_now,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const FIRST_VERDICTS: Duration = Duration::from_secs(15);
/// Long, so that a re-check within it can only be the prompt first run.
const INTERVAL: Duration = Duration::from_secs(5);
const TIMEOUT: Duration = Duration::from_millis(500);
/// `probe::PROMPT_SPREAD`: the first probes of a re-checked server fall within it.
const PROMPT: Duration = Duration::from_millis(250);

/// Starts a 3-server service with an essential http probe (plus the `extra` probe line),
/// reloads the unchanged file once every server is up, and hands the API, the server
/// addresses and the reload's wall time to `check`.
fn reload_unchanged(subnet: u8, extra: &str, check: impl FnOnce(&Api, &[SocketAddr], f64)) {
    let topo = Topology::builder()
        .backends(3)
        .forwarding(Forwarding::Nat)
        .subnet(subnet)
        .build()
        .expect("building the topology");
    let roles: Vec<&str> = topo.backends().iter().map(|b| b.role.as_str()).collect();
    let _servers = HealthServers::start(&topo, Path::new(TESTSERVER), &roles)
        .expect("starting lb-testserver on every backend");
    let mut probe = Probe::http(INTERVAL, TIMEOUT, 1, 1).essential();
    if !extra.is_empty() {
        probe = probe.key(extra);
    }
    let backends = balance::weighted(&topo, &[1, 1, 1]);
    let svc = with_health(
        balance::tcp_service(&topo, &backends),
        &["max_fails = 0"],
        std::slice::from_ref(&probe),
    );
    let agent =
        balance::start_agent(&topo, vec![svc.clone()], Some("native")).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let addrs: Vec<SocketAddr> = topo
        .backends()
        .iter()
        .map(|b| SocketAddr::new(b.ipv4.into(), BACKEND_TCP_PORT))
        .collect();
    wait_all_probed_up(&api, "web", &addrs, FIRST_VERDICTS)
        .expect("every server up after its first probes");
    // Past the first interval's spread, so that no first-round probe is still due.
    thread::sleep(Duration::from_millis(200));
    let t_reload = wall_now();
    agent
        .reload(&AgentConfig::new(vec![svc]), RELOAD_TIMEOUT)
        .expect("reloading the same file");
    check(&api, &addrs, t_reload);
    drop(agent);
}

#[test]
fn health_reload_rechecks_a_non_persistent_essential_probe_promptly() {
    reload_unchanged(68, "", |api, addrs, t_reload| {
        let bound = PROMPT + TIMEOUT + MARGIN;
        for &addr in addrs {
            let up = wait_event(api, addr, "up", t_reload, bound + MARGIN).unwrap_or_else(|e| {
                panic!("{addr}: the reload should re-check it and bring it back up: {e}")
            });
            let took = event_time(&up) - t_reload;
            println!(
                "reload re-check: {addr} checking -> up {} after the reload ({}; bound {}, \
                 interval {})",
                secs(took),
                up.cause,
                secs(bound.as_secs_f64()),
                secs(INTERVAL.as_secs_f64())
            );
            assert_eq!(up.from, "checking", "it went back to checking: {up:?}");
            assert!(
                took <= bound.as_secs_f64(),
                "{addr}: re-checked within {bound:?} (not the {INTERVAL:?} interval), took {}",
                secs(took)
            );
        }
    });
}

#[test]
fn health_reload_keeps_servers_whose_essential_probe_is_persistent() {
    reload_unchanged(69, "persistent = true", |api, addrs, t_reload| {
        // Longer than a prompt re-check would take: any transition would be there by now.
        thread::sleep(PROMPT + TIMEOUT + MARGIN);
        let events = api.events().expect("the event log");
        for &addr in addrs {
            let (state, probes) = server_health(api, "web", addr).expect("status");
            assert_eq!(state, "up", "{addr}: persistent keeps it up: {probes:?}");
            assert!(
                find_event(&events, addr, "checking", t_reload).is_none()
                    && find_event(&events, addr, "up", t_reload).is_none(),
                "{addr}: no transition at the reload: {events:?}"
            );
        }
    });
}
