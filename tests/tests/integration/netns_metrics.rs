//! `/metrics` of a running agent (nat, a tcp probe, announcement on `lo`) against
//! docs/metrics.md both ways — every family exposed is documented with its type, every
//! family documented is exposed (the cluster's with `[cluster]` only: netns_cluster_nat) — and the new families at work: the three packet
//! families add up to every packet the program saw, the table count finds the open
//! connections (`lb_server_active_flows`, `lb_nat_table_entries`,
//! `lb_flow_table_entries`), and a closed connection leaves `lb_server_active_flows`
//! within seconds, as an operator waiting for a drain needs; probe durations are a
//! histogram per service and probe. The contrib dashboard and alert rules name only
//! families the agent exports.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{
        api::{self, Api},
        daemon::{Agent, AgentConfig, START_TIMEOUT, locate_binary},
        metric_families::{
            CLUSTER_SECTION, documented, documented_by_section, exposed, named_in_contrib,
        },
    },
    net::topology::Forwarding,
    scenario::balance,
    traffic::clients::EchoConn,
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Open connections through the balancer.
const CONNS: usize = 6;
/// The table count runs every 5 s; a figure may take two rounds to show a change.
const COUNTED_WITHIN: Duration = Duration::from_secs(15);

/// `name -> type` of every `# TYPE` line.
fn sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) || l.starts_with(&format!("{family} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `/metrics` until `cond` holds on it (or the limit passed); the last text.
fn wait_metrics(api: &Api, limit: Duration, cond: impl Fn(&str) -> bool) -> (bool, String) {
    let start = Instant::now();
    loop {
        let text = api.metrics().expect("GET /metrics");
        if cond(&text) {
            return (true, text);
        }
        if start.elapsed() > limit {
            return (false, text);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn the_exposition_matches_the_docs_and_the_new_families_count() {
    let bed = balance::Testbed::start(Forwarding::Nat, 120, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &balance::WEIGHTS);
    let mut service = balance::tcp_service(topo, &backends);
    service.extra.extend([
        String::new(),
        "[[service.probe]]".into(),
        "type = \"tcp\"".into(),
        "interval = \"500ms\"".into(),
        "timeout = \"400ms\"".into(),
    ]);
    let vip = service.vip;
    let mut config = AgentConfig::new(vec![service]);
    config
        .agent_extra
        .push("announce_interface = \"lo\"".into());
    let binary = locate_binary("lb-agent").expect("lb-agent built");
    let agent = Agent::start(topo, &binary, &config, None, START_TIMEOUT).expect("lb-agent runs");
    let api = Api::new(&topo.lb().ns);
    let client = topo.client();

    let mut conns: Vec<EchoConn> = (0..CONNS)
        .map(|i| {
            let mut c = EchoConn::connect(&client.ns, IpAddr::V4(client.ipv4), vip)
                .expect("client namespace")
                .expect("a connection through the balancer");
            c.check_echo(&format!("hello {i}")).expect("an echo");
            c
        })
        .collect();

    // The count finds every open connection, on the server that holds it.
    // (One count reads the flow table, then the nat table: connections opened during a
    // count may show in the second only; the next count has them in both.)
    let active = |text: &str| sum(text, "lb_server_active_flows");
    let (counted, text) = wait_metrics(&api, COUNTED_WITHIN, |t| {
        active(t) >= CONNS as f64
            && api::metric(t, "lb_flow_table_entries", &[]).is_some_and(|v| v >= CONNS as f64)
    });
    assert!(
        counted,
        "lb_server_active_flows should reach {CONNS}:\n{text}"
    );
    eprintln!(
        "one count of both tables took {:.3} s",
        api::metric(&text, "lb_table_sample_duration_seconds", &[]).unwrap_or(-1.0)
    );
    assert_eq!(active(&text), CONNS as f64, "{text}");
    let mut per_backend: BTreeMap<&str, f64> = BTreeMap::new();
    for c in &conns {
        *per_backend.entry(c.backend()).or_default() += 1.0;
    }
    for (b, host) in backends.iter().map(|(h, _)| (h.role.as_str(), h)) {
        let server = format!("{}:{}", host.ipv4, balance::BACKEND_TCP_PORT);
        let v = api::metric(
            &text,
            "lb_server_active_flows",
            &[("service", "web"), ("server", &server)],
        )
        .unwrap_or(-1.0);
        assert_eq!(
            v,
            per_backend.get(b).copied().unwrap_or(0.0),
            "active flows of {b} ({server}):\n{text}"
        );
    }
    // The API's server view says the same (`active_flows`), as of its own snapshot.
    let view = api
        .request_ok("GET", "/api/v1/services/web", None)
        .expect("GET the service");
    let in_view: u64 = view
        .split("\"active_flows\":")
        .skip(1)
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(
        in_view, CONNS as u64,
        "active_flows in the server view: {view}"
    );
    for family in ["lb_nat_table_entries", "lb_flow_table_entries"] {
        let v = api::metric(&text, family, &[]).expect(family);
        assert!(v >= CONNS as f64, "{family} {v} < {CONNS}");
    }
    assert_eq!(
        api::metric(&text, "lb_flow_table_capacity", &[]),
        Some(1_048_576.0)
    );
    assert_eq!(
        api::metric(&text, "lb_nat_table_capacity", &[]),
        Some(524_288.0)
    );

    // The three packet families are every packet: their sum is the program's `rx`
    // counter, which `lb_interface_info`'s interface received.
    let rx = api::counter(&text, "rx").expect("rx");
    let outcomes = sum(&text, "lb_packets_forwarded_total")
        + sum(&text, "lb_packets_passed_total")
        + sum(&text, "lb_packets_dropped_total");
    assert!(rx > 0.0);
    assert_eq!(outcomes, rx, "forwarded + passed + dropped = every packet");
    let nat_forward = api::metric(
        &text,
        "lb_packets_forwarded_total",
        &[("reason", "nat_forward")],
    )
    .unwrap_or(0.0);
    assert!(
        nat_forward >= CONNS as f64 * 3.0,
        "SYN, ACK, data per connection"
    );

    // Probe durations: a histogram per service and probe.
    let (probed, text) = wait_metrics(&api, COUNTED_WITHIN, |t| {
        api::metric(
            t,
            "lb_probe_duration_seconds_count",
            &[("service", "web"), ("probe", "tcp")],
        )
        .is_some_and(|n| n >= 3.0)
    });
    assert!(probed, "probe durations in the histogram:\n{text}");
    assert!(
        text.contains(
            "lb_probe_duration_seconds_bucket{service=\"web\",probe=\"tcp\",le=\"+Inf\"}"
        )
    );

    // docs/metrics.md both ways.
    let exposed = exposed(&text);
    let documented = documented();
    let undocumented: Vec<_> = exposed
        .iter()
        .filter(|(n, t)| documented.get(*n) != Some(*t))
        .collect();
    assert!(
        undocumented.is_empty(),
        "exposed but not in docs/metrics.md (or with another type): {undocumented:?}"
    );
    // The cluster's families come with `[cluster]` (netns_cluster_nat checks them).
    let cluster_only = documented_by_section();
    let missing: Vec<_> = documented
        .keys()
        .filter(|n| !exposed.contains_key(*n))
        .filter(|n| {
            cluster_only
                .get(*n)
                .is_none_or(|(_, s)| s != CLUSTER_SECTION)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "in docs/metrics.md but not exposed: {missing:?}"
    );
    // The contrib dashboard and alert rules query only families this agent exports.
    let unexported: Vec<_> = named_in_contrib()
        .into_iter()
        .filter(|(n, _)| !exposed.contains_key(n))
        .collect();
    assert!(
        unexported.is_empty(),
        "named in contrib/ but not exposed: {unexported:?}"
    );

    // Closed connections leave the count within seconds (nat: their ports become
    // reclaimable 2 s after the close).
    let closed_at = Instant::now();
    conns.clear();
    let (gone, text) = wait_metrics(&api, COUNTED_WITHIN, |t| active(t) == 0.0);
    assert!(
        gone,
        "lb_server_active_flows should fall to 0 after the connections closed:\n{text}"
    );
    eprintln!(
        "active flows fell to 0 {:.1} s after the close",
        closed_at.elapsed().as_secs_f64()
    );

    let status = agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(status.success(), "lb-agent should exit 0, got {status}");
}
