//! The whole agent with `resolve = true` servers: an [`Agent`] over the in-memory data
//! plane whose `agent.resolver` is a real DNS server (hickory-server on 127.0.0.1). SRV
//! targets become backends with their levels and weights; when the TTL runs out the
//! agent's re-resolution adds and removes backends in the data plane; DNS failures keep
//! them.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant as StdInstant},
};

use crate::util::{Mode, TestDns, addr, config, quick, srv};
use lb_agent::{
    agent::{Agent, Environment, Handles, StaticNeighbours},
    config::{Config, ProbeConfig},
    probe::{ProbeOutcome, Prober},
    publish::{addr_words, vip_key},
    testing::MemoryDataplane,
    view::ServerStatus,
};
use lb_common::{NO_BACKEND, maps::BACKEND_F_LIVE};

const SRV_NAME: &str = "_http._tcp.backends.example.";
const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

/// Services here have no probes; a prober is still needed to build the agent.
struct NoProbes;

impl Prober for NoProbes {
    async fn probe(&self, _: &ProbeConfig, _: SocketAddr) -> ProbeOutcome {
        ProbeOutcome::pass(Duration::ZERO, "no probes in these tests")
    }
}

type TestAgent = Agent<MemoryDataplane, NoProbes, StaticNeighbours>;

/// Priority 0 → two primaries (SRV weights 1 and 3), priority 1 → one backup.
fn records(ttl: u32, primaries: &[&str]) -> Vec<hickory_proto::rr::Record> {
    let mut r = vec![
        srv(SRV_NAME, ttl, 0, 1, 8080, "p1.example."),
        srv(SRV_NAME, ttl, 0, 3, 8080, "p2.example."),
        srv(SRV_NAME, ttl, 1, 1, 8080, "b.example."),
        addr("b.example.", ttl, "10.0.2.1"),
    ];
    if let Some(ip) = primaries.first() {
        r.push(addr("p1.example.", ttl, ip));
    }
    if let Some(ip) = primaries.get(1) {
        r.push(addr("p2.example.", ttl, ip));
    }
    r
}

fn web(dns: &TestDns) -> Config {
    config(
        dns.addr,
        "10.0.0.100:80",
        false,
        "[[service.server]]\naddress = \"backends.example\"\nservice = \"_http._tcp\"\nresolve = true\nbackup = \"prio\"\n\
         [[service.server]]\naddress = \"10.0.9.9:8080\"\nbackup = 3\n",
    )
}

async fn start(cfg: &Config) -> (TestAgent, Handles) {
    let neighbours = StaticNeighbours {
        default: Some(MAC),
        ..Default::default()
    };
    let (mut agent, handles) = Agent::new(
        MemoryDataplane::default(),
        Arc::new(NoProbes),
        Arc::new(neighbours),
        Environment::default(),
    );
    agent.set_discovery_options(quick());
    agent
        .apply_config(cfg)
        .await
        .expect("publishing into memory cannot fail");
    agent.publish_snapshot();
    (agent, handles)
}

/// Runs the agent's re-resolution arm (as `lb-agent run` does) until `cond` holds;
/// panics after `limit`.
async fn resolve_until(
    agent: &mut TestAgent,
    handles: &Handles,
    limit: Duration,
    what: &str,
    mut cond: impl FnMut(&TestAgent, &Handles) -> bool,
) {
    let end = StdInstant::now() + limit;
    while !cond(agent, handles) {
        assert!(StdInstant::now() < end, "within {limit:?}: {what}");
        tokio::time::timeout(Duration::from_secs(5), agent.resolve_ready())
            .await
            .expect("re-resolution has a deadline while a resolved server exists");
        agent
            .reresolve()
            .await
            .expect("publishing into memory cannot fail");
        agent.publish_snapshot();
    }
}

/// Backends of `web` in the data plane: address → Maglev slots.
fn slots(agent: &TestAgent, cfg: &Config) -> BTreeMap<SocketAddr, usize> {
    let svc = &cfg.services[0];
    let dp = agent.dataplane();
    let meta = dp
        .service(&vip_key(svc.vip, svc.protocol.ip_proto()))
        .expect("the service is published");
    let table = dp.tables.get(&meta.service_id).cloned().unwrap_or_default();
    let mut out = BTreeMap::new();
    for (id, b) in &dp.backends {
        if b.service_id != meta.service_id {
            continue;
        }
        let ip = ["10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.2.1", "10.0.9.9"]
            .iter()
            .map(|s| s.parse().unwrap())
            .find(|ip| addr_words(*ip).0 == b.addr)
            .expect("only the test's addresses are backends");
        let n = table
            .iter()
            .filter(|s| **s == *id && **s != NO_BACKEND)
            .count();
        *out.entry(SocketAddr::new(ip, u16::from_be(b.port)))
            .or_default() += n;
    }
    out
}

fn servers(handles: &Handles) -> BTreeMap<String, ServerStatus> {
    let snap = handles.snapshot.borrow().clone();
    snap.services[0]
        .servers
        .iter()
        .map(|s| (s.address.clone(), ServerStatus::clone(s)))
        .collect()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[tokio::test]
async fn srv_targets_become_backends_with_their_levels_and_weights() {
    let dns = TestDns::start(records(60, &["10.0.1.1", "10.0.1.2"])).await;
    let cfg = web(&dns);
    let (agent, handles) = start(&cfg).await;

    let status = servers(&handles);
    let got: Vec<(&str, u32, u32)> = status
        .values()
        .map(|s| (s.address.as_str(), s.backup, s.weight))
        .collect();
    assert_eq!(
        got,
        [
            ("10.0.1.1:8080", 0, 1),
            ("10.0.1.2:8080", 0, 3),
            ("10.0.2.1:8080", 1, 1),
            ("10.0.9.9:8080", 3, 1)
        ],
        "SRV priority 0 → primaries weighted by SRV weight, priority 1 → level 1, the static backup at 3"
    );

    let slots = slots(&agent, &cfg);
    let (a, b) = (slots[&sa("10.0.1.1:8080")], slots[&sa("10.0.1.2:8080")]);
    assert_eq!(
        a + b,
        // A few servers: the smallest table size.
        lb_common::MAGLEV_SIZES[0] as usize,
        "the primaries hold the whole table"
    );
    let share = b as f64 / (a + b) as f64;
    assert!(
        (share - 0.75).abs() < 0.01,
        "weights 1:3 → 75% for 10.0.1.2, got {share:.3}"
    );
    assert_eq!(
        slots[&sa("10.0.2.1:8080")],
        0,
        "the backup level gets no slots while primaries are up"
    );
}

#[tokio::test]
async fn a_changed_answer_adds_and_removes_backends_when_the_ttl_expires() {
    let dns = TestDns::start(records(0, &["10.0.1.1", "10.0.1.2"])).await;
    let cfg = web(&dns);
    let (mut agent, handles) = start(&cfg).await;
    let deadline = agent
        .next_resolve_deadline()
        .expect("a resolved server has a re-resolution deadline");
    assert!(
        deadline <= tokio::time::Instant::now() + Duration::from_millis(200),
        "TTL 0 → the minimum (200 ms here)"
    );

    dns.set(records(0, &["10.0.1.1", "10.0.1.3"]));
    resolve_until(
        &mut agent,
        &handles,
        Duration::from_secs(5),
        "10.0.1.3 replaces 10.0.1.2",
        |a, _| slots(a, &cfg).contains_key(&sa("10.0.1.3:8080")),
    )
    .await;
    let slots = slots(&agent, &cfg);
    assert!(
        slots[&sa("10.0.1.3:8080")] > 0,
        "the new primary takes slots: {slots:?}"
    );
    assert_eq!(
        slots.get(&sa("10.0.1.2:8080")).copied().unwrap_or(0),
        0,
        "the removed primary has no slots left: {slots:?}"
    );
    let (words, _) = addr_words("10.0.1.2".parse().unwrap());
    let gone: Vec<u8> = agent
        .dataplane()
        .backends
        .values()
        .filter(|b| b.addr == words)
        .map(|b| b.flags)
        .collect();
    assert_eq!(
        gone,
        vec![BACKEND_F_LIVE],
        "gone from DNS: no new flow, established flows kept (LIVE without SERVING)"
    );
    let status = servers(&handles);
    assert!(!status.contains_key("10.0.1.2:8080"), "removed from status");
    assert_eq!(status["10.0.1.3:8080"].weight, 3, "takes p2's SRV weight");
    assert!(
        status.contains_key("10.0.9.9:8080"),
        "static servers are not touched"
    );
    let events: Vec<(String, String)> = handles
        .events
        .lock()
        .await
        .iter()
        .map(|e| (e.server.clone(), e.to.clone()))
        .collect();
    assert!(
        events.contains(&("10.0.1.3:8080".into(), "added".into()))
            && events.contains(&("10.0.1.2:8080".into(), "removed".into())),
        "both changes are in the transition log: {events:?}"
    );
}

#[tokio::test]
async fn a_changed_priority_moves_a_backend_to_another_level() {
    let dns = TestDns::start(records(0, &["10.0.1.1", "10.0.1.2"])).await;
    let cfg = web(&dns);
    let (mut agent, handles) = start(&cfg).await;
    let mut moved = records(0, &["10.0.1.1", "10.0.1.2"]);
    moved[1] = srv(SRV_NAME, 0, 2, 3, 8080, "p2.example.");
    dns.set(moved);
    resolve_until(
        &mut agent,
        &handles,
        Duration::from_secs(5),
        "10.0.1.2 moves to level 2",
        |_, h| servers(h)["10.0.1.2:8080"].backup == 2,
    )
    .await;
    let slots = slots(&agent, &cfg);
    assert_eq!(
        slots[&sa("10.0.1.1:8080")],
        // A few servers: the smallest table size.
        lb_common::MAGLEV_SIZES[0] as usize,
        "the only primary left holds the table: {slots:?}"
    );
}

#[tokio::test]
async fn dns_failures_keep_the_backends() {
    let dns = TestDns::start(records(0, &["10.0.1.1", "10.0.1.2"])).await;
    let cfg = web(&dns);
    let (mut agent, handles) = start(&cfg).await;
    let before = slots(&agent, &cfg);
    // Questions sent by two lookups: one SRV question each when it fails, and a silent
    // server is asked twice per lookup before it times out.
    for (mode, questions) in [(Mode::NxDomain, 2), (Mode::Silent, 4)] {
        dns.mode(mode);
        let asked = dns.queries();
        resolve_until(
            &mut agent,
            &handles,
            Duration::from_secs(5),
            "two failed lookups",
            |_, _| dns.queries() >= asked + questions,
        )
        .await;
        assert_eq!(
            slots(&agent, &cfg),
            before,
            "{mode:?}: the data plane keeps the last answer's backends"
        );
    }
}

/// docs/probes.md: a server added at runtime — here by re-resolution — waits in
/// `checking` for its probes, even a plain one; the servers resolved at start did not.
#[tokio::test]
async fn a_backend_added_by_re_resolution_is_held_back_until_its_probes_pass() {
    let dns = TestDns::start(records(0, &["10.0.1.1", "10.0.1.2"])).await;
    let cfg = config(
        dns.addr,
        "10.0.0.100:80",
        false,
        // A long interval: no probe result arrives during the test (and this harness
        // does not feed results to the agent anyway), so every state is the start state.
        "[[service.server]]\naddress = \"backends.example\"\nservice = \"_http._tcp\"\nresolve = true\nbackup = \"prio\"\n\
         [[service.probe]]\ntype = \"tcp\"\ninterval = \"1h\"\n",
    );
    let (mut agent, handles) = start(&cfg).await;
    let status = servers(&handles);
    assert_eq!(
        status["10.0.1.2:8080"].state, "up",
        "at start a plain probe does not gate (Angie)"
    );

    dns.set(records(0, &["10.0.1.1", "10.0.1.3"]));
    resolve_until(
        &mut agent,
        &handles,
        Duration::from_secs(5),
        "10.0.1.3 is added",
        |_, h| servers(h).contains_key("10.0.1.3:8080"),
    )
    .await;
    let status = servers(&handles);
    assert_eq!(
        status["10.0.1.3:8080"].state, "checking",
        "added by re-resolution: held back until its probe passes"
    );
    assert_eq!(
        slots(&agent, &cfg)
            .get(&sa("10.0.1.3:8080"))
            .copied()
            .unwrap_or(0),
        0,
        "no slot before a pass"
    );
    assert_eq!(status["10.0.1.1:8080"].state, "up", "the kept one stays up");
}
