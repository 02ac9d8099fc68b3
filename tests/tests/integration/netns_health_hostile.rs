//! Hostile backends against the real agent's http probes: one accepts and never answers,
//! one streams an endless body, one answers garbage. Each turns `unhealthy` within TR7's
//! `fails × (interval + timeout)` (+ 1 s), the agent keeps probing them without its
//! resident memory growing (< 64 MiB over 10 s), and the operator surface says so:
//! `lb-agent status` names them unhealthy, `/metrics` has
//! `lb_server_state{…,state="unhealthy"} 1`. Client traffic meanwhile goes to the one
//! healthy backend.
//!
//! Two http probes run side by side: `health` expects the body `ok` (what a health
//! endpoint answers), `plain` expects nothing but a 2xx status. An endless `200` body
//! fails `health` after `max_body` bytes; what `plain` makes of it is printed (the agent
//! reads up to `max_body` and judges the status: it passes).

use std::{
    net::SocketAddr,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{
        api::{self, Api},
        daemon::locate_binary,
    },
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{self, BACKEND_TCP_PORT},
        health::{
            HealthServers, MARGIN, Probe, event_time, rss_kib, secs, server_health,
            wait_all_probed_up, wait_event, wait_state, with_health,
        },
    },
    traffic::{clients, pacer::wall_now},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// How long the agent probes the hostile backends while its memory is watched.
const WATCH: Duration = Duration::from_secs(10);
/// Allowed growth of the agent's resident memory over [`WATCH`].
const RSS_GROWTH_KIB: u64 = 64 * 1024;

#[test]
fn health_hostile_backends_fail_their_probes_and_memory_stays_bounded() {
    let topo = Topology::builder()
        .backends(4)
        .forwarding(Forwarding::Nat)
        .subnet(91)
        .build()
        .expect("building the topology");
    let roles: Vec<&str> = topo.backends().iter().map(|b| b.role.as_str()).collect();
    let servers = HealthServers::start(&topo, Path::new(TESTSERVER), &roles)
        .expect("starting lb-testserver on every backend");
    let interval = Duration::from_millis(500);
    let timeout = Duration::from_millis(300);
    let health = Probe::http(interval, timeout, 2, 2).key("expect_body = \"ok\"");
    let plain = Probe::http(interval, timeout, 2, 2).named("plain");
    let backends = balance::weighted(&topo, &[1, 1, 1, 1]);
    let svc = with_health(
        balance::tcp_service(&topo, &backends),
        &["max_fails = 0"],
        &[health.clone(), plain],
    );
    let vip = svc.vip;
    let agent = balance::start_agent(&topo, vec![svc], Some("native")).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let addrs: Vec<SocketAddr> = topo
        .backends()
        .iter()
        .map(|b| SocketAddr::new(b.ipv4.into(), BACKEND_TCP_PORT))
        .collect();
    wait_all_probed_up(&api, "web", &addrs, Duration::from_secs(15))
        .expect("every server up after its first probes");
    let pid = agent.process().pid();
    thread::sleep(Duration::from_secs(1));
    let rss_before = rss_kib(pid).expect("the agent's VmRSS");

    let modes = [("b1", "hang"), ("b2", "endless"), ("b3", "garbage")];
    let mut since = Vec::new();
    for (role, mode) in modes {
        since.push(servers.control(role, &format!("http {mode}")));
    }
    let bound = health.detection_bound() + MARGIN;
    let mut lines = Vec::new();
    for (i, (role, mode)) in modes.iter().enumerate() {
        let ev = wait_event(&api, addrs[i], "unhealthy", since[i], bound + MARGIN)
            .unwrap_or_else(|e| panic!("{role} ({mode}) should turn unhealthy: {e}"));
        let took = event_time(&ev) - since[i];
        lines.push((role, mode, took, ev.cause));
    }

    // Keep probing the three for a while and watch the agent's memory.
    let counts_before: Vec<u64> = addrs[..3].iter().map(|a| probe_count(&api, *a)).collect();
    let start = Instant::now();
    let mut rss_max = rss_before;
    while start.elapsed() < WATCH {
        thread::sleep(Duration::from_millis(250));
        rss_max = rss_max.max(rss_kib(pid).expect("the agent's VmRSS"));
    }
    let rss_after = rss_kib(pid).expect("the agent's VmRSS");
    let counts_after: Vec<u64> = addrs[..3].iter().map(|a| probe_count(&api, *a)).collect();

    let mut report = format!(
        "hostile backends (http probes every 500 ms, timeout 300 ms, fails 2; bound {}):\n",
        secs(bound.as_secs_f64())
    );
    for (i, (role, mode, took, cause)) in lines.iter().enumerate() {
        let (state, probes) = server_health(&api, "web", addrs[i]).expect("the server's status");
        report.push_str(&format!(
            "  {role} {mode}: unhealthy after {} ({cause}); now {state}; probes run during \
             the watch: {}; last results: {}\n",
            secs(*took),
            counts_after[i].saturating_sub(counts_before[i]),
            probes
                .iter()
                .map(|p| format!("{} {:?}", p.name, p.last_result))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    report.push_str(&format!(
        "  agent VmRSS: {} KiB before, {} KiB max and {} KiB at the end of {WATCH:?} of \
         probing (growth {} KiB, bound {RSS_GROWTH_KIB} KiB)",
        rss_before,
        rss_max,
        rss_after,
        rss_max.saturating_sub(rss_before)
    ));
    println!("{report}");

    for (role, mode, took, _) in &lines {
        assert!(
            *took <= bound.as_secs_f64(),
            "{role} ({mode}) should be unhealthy within {bound:?}, took {}",
            secs(*took)
        );
    }
    for (i, (role, mode)) in modes.iter().enumerate() {
        wait_state(&api, "web", addrs[i], "unhealthy", Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("{role} ({mode}) should still be unhealthy: {e}"));
        // A probe is bounded by its timeout and never overlaps itself: it keeps running.
        let ran = counts_after[i].saturating_sub(counts_before[i]);
        let want = (WATCH.as_millis() / interval.as_millis() / 2) as u64;
        assert!(
            ran >= want,
            "{role} ({mode}): the agent should keep probing it (every {interval:?}); only {ran} \
             probes of `health` in {WATCH:?}, expected at least {want}"
        );
    }
    wait_state(&api, "web", addrs[3], "up", Duration::from_secs(1))
        .expect("b4, the healthy backend, should stay up");
    assert!(
        rss_max.saturating_sub(rss_before) < RSS_GROWTH_KIB,
        "the agent's resident memory should stay bounded while probing hostile backends: \
         {rss_before} KiB -> {rss_max} KiB"
    );

    // The operator's view.
    let binary = locate_binary("lb-agent").expect("the lb-agent binary");
    let table = api::cli(
        &topo.lb().ns,
        &binary,
        &["status", "--api", &api.url()],
        Duration::from_secs(10),
    )
    .expect("lb-agent status");
    println!("lb-agent status:\n{table}");
    for (i, (role, _)) in modes.iter().enumerate() {
        let addr = addrs[i].to_string();
        assert!(
            table
                .lines()
                .any(|l| l.contains(&addr) && l.contains("unhealthy")),
            "lb-agent status should name {role} ({addr}) unhealthy:\n{table}"
        );
    }
    assert!(
        table
            .lines()
            .any(|l| l.contains(&addrs[3].to_string()) && l.contains(" up ")),
        "lb-agent status should show b4 up:\n{table}"
    );
    let metrics = api.metrics().expect("GET /metrics");
    for (i, (role, _)) in modes.iter().enumerate() {
        let line = format!(
            "lb_server_state{{service=\"web\",server=\"{}\",state=\"unhealthy\"}} 1",
            addrs[i]
        );
        assert!(
            metrics.lines().any(|l| l == line),
            "/metrics should have `{line}` for {role}; its lb_server_state lines:\n{}",
            metrics
                .lines()
                .filter(|l| l.starts_with("lb_server_state"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert_eq!(
        api::metric(
            &metrics,
            "lb_server_state",
            &[("server", &addrs[3].to_string()), ("state", "up")]
        ),
        Some(1.0),
        "/metrics should have b4 up"
    );

    // Client traffic goes to the healthy one only.
    let client = topo.client();
    let t = wall_now();
    let tally = clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        30_000,
        vip,
        100,
        Duration::from_secs(30),
    )
    .expect("entering the client namespace");
    println!(
        "100 connections after the verdicts ({:.2} s): {:?}, {} failed",
        wall_now() - t,
        tally.counts,
        tally.failures.len()
    );
    assert!(
        tally.failures.is_empty() && tally.counts.keys().all(|k| k == "b4"),
        "every connection should be answered by b4, the only healthy backend: {:?} {:?}",
        tally.counts,
        tally.failures
    );
    drop(agent);
    drop(servers);
}

/// Runs of the `health` probe of the server at `addr` so far.
fn probe_count(api: &Api, addr: SocketAddr) -> u64 {
    server_health(api, "web", addr)
        .expect("the server's status")
        .1
        .iter()
        .find(|p| p.name == "health")
        .map_or(0, |p| p.count)
}
