//! Backup levels through the real agent (DESIGN.md §6): primaries p1, p2 (weight 1 each),
//! level-1 backup b1, level-2 backup b2, a `tcp` probe every 300 ms. One topology per
//! `backup_switch` setting:
//!
//! - default: both primaries fail → b1 (`active_backup_level` 1); b1 fails → b2 (level 2);
//!   the primaries recover → traffic returns to them at once.
//! - `{ permanent = "3s" }`: after the primaries recover, traffic stays on b1 until the
//!   retry 3 s after the level was entered, then returns (the agent's own event times
//!   must be ≥ 3 s apart).
//! - `{ permanent = true }`: traffic stays on b1 after the primaries recover; when b1
//!   fails it moves to the next level b2 (not to the usable primaries); when b2, the
//!   highest level, fails it returns to the primary group.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::api::{Api, EventView, ServiceView},
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::SHARE_TOLERANCE,
        redundancy::{self, Backends, Member, SourcePorts, TcpProbe},
    },
    traffic::clients,
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
/// Connections per phase: enough to see that no other backend gets any, and for the
/// 1:1 split of the primaries to sit within ±15 % by 3.5 standard deviations.
const CONNECTIONS: usize = 600;
const DEADLINE: Duration = Duration::from_secs(60);
/// Wait for a verdict seen through the API: the probe's detection bound (1.3 s) plus a
/// wide margin for a machine busy with other builds.
const VERDICT_WAIT: Duration = Duration::from_secs(15);
/// `permanent = "3s"`.
const RETRY: Duration = Duration::from_secs(3);

/// One scenario's topology, servers, agent and API.
struct Setup {
    // Drop order: agent, servers, then the namespaces.
    agent: Option<lb_tests::agent::daemon::Agent>,
    backends: Backends,
    api: Api,
    vip: std::net::SocketAddr,
    ports: SourcePorts,
    topo: Topology,
}

fn members(topo: &Topology) -> [Member<'_>; 4] {
    let h = topo.backends();
    [
        Member::primary("p1", &h[0], 1),
        Member::primary("p2", &h[1], 1),
        Member::backup("b1", &h[2], 1),
        Member::backup("b2", &h[3], 2),
    ]
}

impl Setup {
    fn new(subnet: u8, backup_switch: Option<&str>) -> Setup {
        let topo = Topology::builder()
            .backends(4)
            .forwarding(Forwarding::Nat)
            .subnet(subnet)
            .build()
            .expect("building the topology");
        let m = members(&topo);
        let backends = Backends::start(Path::new(TESTSERVER), &m, false)
            .expect("starting a testserver per member");
        let setting = backup_switch.map(|s| format!("backup_switch = {s}"));
        let settings: Vec<&str> = setting.iter().map(String::as_str).collect();
        let service = redundancy::service(&topo, "web", &m, &TcpProbe::fast(), &settings);
        let vip = service.vip;
        let agent = lb_tests::scenario::balance::start_agent(&topo, vec![service], Some("native"))
            .expect("starting lb-agent");
        let api = Api::new(&topo.lb().ns);
        let s = Setup {
            agent: Some(agent),
            backends,
            api,
            vip,
            ports: SourcePorts::new(),
            topo,
        };
        s.wait("every server up", |v| {
            v.servers.iter().all(|s| s.state == "up") && v.active_backup_level == 0
        });
        s
    }

    fn member(&self, name: &str) -> Member<'_> {
        members(&self.topo)
            .into_iter()
            .find(|m| m.name == name)
            .expect("a member name")
    }

    fn describe(&self, view: &ServiceView) -> String {
        view.describe(|a| redundancy::name_of(&members(&self.topo), a))
    }

    fn wait(&self, what: &str, cond: impl Fn(&ServiceView) -> bool) -> (ServiceView, Duration) {
        self.api
            .wait_service("web", what, VERDICT_WAIT, cond)
            .unwrap_or_else(|e| panic!("expected {what}: {e}"))
    }

    fn level(&self, level: u64, what: &str) -> (ServiceView, Duration) {
        self.wait(what, |v| v.active_backup_level == level)
    }

    fn up(&self, names: &[&str]) -> (ServiceView, Duration) {
        let addrs: Vec<_> = names.iter().map(|n| self.member(n).addr()).collect();
        self.wait(&format!("{names:?} up"), |v| {
            addrs
                .iter()
                .all(|a| v.server(*a).is_some_and(|s| s.state == "up"))
        })
    }

    /// `count` new connections; every one answered, by the `expected` members only, in
    /// proportion to their weights.
    fn traffic(&mut self, label: &str, count: usize, expected: &[&str]) {
        let client = self.topo.client();
        let tally = clients::tcp_names(
            &client.ns,
            client.ipv4.into(),
            self.ports.take(count),
            self.vip,
            count,
            DEADLINE,
        )
        .expect("entering the client namespace");
        let m = members(&self.topo);
        let want: Vec<(&str, u32)> = m
            .iter()
            .filter(|m| expected.contains(&m.name))
            .map(|m| (m.name, m.weight))
            .collect();
        println!("  {label}: {}", redundancy::spread(&tally));
        tally
            .check_shares(&want, SHARE_TOLERANCE)
            .unwrap_or_else(|e| {
                panic!("{label}: new connections should go to {expected:?} only:\n{e}")
            });
    }

    fn kill(&mut self, names: &[&'static str]) {
        for n in names {
            self.backends.kill(n).expect("stopping a testserver");
        }
    }

    fn restart(&mut self, names: &[&'static str]) {
        for n in names {
            self.backends.restart(n).expect("restarting a testserver");
        }
    }

    fn events(&self) -> Vec<EventView> {
        self.api.events().expect("GET /api/v1/events")
    }

    fn finish(mut self) {
        let agent = self.agent.take().expect("agent");
        let status = agent.stop(STOP_GRACE).expect("stopping lb-agent");
        assert!(
            status.success(),
            "lb-agent should exit 0 on SIGTERM, got {status}"
        );
    }
}

/// The last membership note whose text starts with `prefix`.
fn note<'e>(events: &'e [EventView], prefix: &str) -> Option<&'e EventView> {
    events
        .iter()
        .rev()
        .find(|e| e.server == "-" && e.cause.starts_with(prefix))
}

#[test]
fn backup_levels_default_switch_returns_at_once() {
    let mut s = Setup::new(142, None);
    let (v, _) = s.level(0, "the primary group active");
    println!("backup (default): at start\n{}", s.describe(&v));
    s.traffic("all up", CONNECTIONS, &["p1", "p2"]);

    s.kill(&["p1", "p2"]);
    let (v, took) = s.level(1, "backup level 1 active after both primaries failed");
    println!(
        "backup (default): p1, p2 killed; level 1 after {took:.2?}\n{}",
        s.describe(&v)
    );
    let b1 = v.server(s.member("b1").addr()).expect("b1");
    let b2 = v.server(s.member("b2").addr()).expect("b2");
    assert!(
        b1.active && !b2.active,
        "only b1 should be in the table:\n{}",
        s.describe(&v)
    );
    s.traffic("primaries down", CONNECTIONS, &["b1"]);

    s.kill(&["b1"]);
    let (v, took) = s.level(2, "backup level 2 active after b1 failed");
    println!(
        "backup (default): b1 killed; level 2 after {took:.2?}\n{}",
        s.describe(&v)
    );
    s.traffic("primaries and b1 down", CONNECTIONS, &["b2"]);

    s.restart(&["p1", "p2"]);
    let (_, took) = s.level(0, "the primary group active again");
    // Level 0 comes back with the first primary up; the second follows within a probe
    // interval.
    let (v, both) = s.wait("p1 and p2 up and in the table", |v| {
        v.servers
            .iter()
            .filter(|s| s.backup == 0)
            .all(|s| s.state == "up" && s.active)
    });
    println!(
        "backup (default): p1, p2 restarted; level 0 after {took:.2?}, both primaries in \
         the table {both:.2?} later (recovery bound {:?})\n{}",
        TcpProbe::fast().recovery_bound(),
        s.describe(&v)
    );
    assert_eq!(
        v.active_backup_level, 0,
        "default backup_switch: the primaries keep the traffic"
    );
    for n in ["p1", "p2"] {
        let p = v.server(s.member(n).addr()).expect("primary");
        assert!(
            p.state == "up" && p.active,
            "default backup_switch: {n} takes traffic as soon as it is up:\n{}",
            s.describe(&v)
        );
    }
    s.traffic("primaries back", CONNECTIONS, &["p1", "p2"]);
    s.finish();
}

#[test]
fn backup_levels_permanent_duration_waits_for_the_retry() {
    let mut s = Setup::new(143, Some("{ permanent = \"3s\" }"));
    s.traffic("all up", CONNECTIONS, &["p1", "p2"]);

    s.kill(&["p1", "p2"]);
    let (v, took) = s.level(1, "backup level 1 active after both primaries failed");
    let entered = Instant::now();
    println!(
        "backup (permanent 3s): p1, p2 killed; level 1 after {took:.2?}\n{}",
        s.describe(&v)
    );

    s.restart(&["p1", "p2"]);
    let (v, _) = s.up(&["p1", "p2"]);
    let up_at = Instant::now();
    let since_entry = up_at - entered;
    println!(
        "backup (permanent 3s): primaries up again {since_entry:.2?} after level 1 was seen\n{}",
        s.describe(&v)
    );
    // The agent entered level 1 before we saw it, so its retry is due at most 3 s after
    // `entered`; 500 ms of margin for the look and the connections below.
    let window = RETRY - Duration::from_millis(500);
    if since_entry < window {
        assert_eq!(
            v.active_backup_level,
            1,
            "permanent = 3s: the primaries are up but the retry is not due yet:\n{}",
            s.describe(&v)
        );
        let client = s.topo.client();
        let tally = clients::tcp_names(
            &client.ns,
            client.ipv4.into(),
            s.ports.take(50),
            s.vip,
            50,
            DEADLINE,
        )
        .expect("entering the client namespace");
        println!(
            "  primaries up, before the retry: {}",
            redundancy::spread(&tally)
        );
        if entered.elapsed() < window {
            tally.check_shares(&[("b1", 1)], 0.0).unwrap_or_else(|e| {
                panic!("permanent = 3s: before the retry new connections stay on b1:\n{e}")
            });
        } else {
            println!("  (the batch ended after the retry window; its spread is not checked)");
        }
    } else {
        println!(
            "  (primaries took {since_entry:.2?} to come back, past the retry window: \
             the stay on b1 is checked from the agent's event times only)"
        );
    }

    let (v, _) = s.level(0, "the primary group active after the retry");
    let back = up_at.elapsed();
    let events = s.events();
    let enter = note(&events, "backup level 1 active").expect("event: backup level 1 active");
    let leave =
        note(&events, "primary group active again").expect("event: primary group active again");
    let stayed = leave.unix_seconds().expect("event time") - enter.unix_seconds().expect("time");
    println!(
        "backup (permanent 3s): level 0 {back:.2?} after the primaries were up; the agent \
         stayed on level 1 for {stayed:.3} s ({} → {}: {})\n{}",
        enter.time,
        leave.time,
        leave.cause,
        s.describe(&v)
    );
    // Event times are wall-clock milliseconds: 2 ms of rounding.
    assert!(
        stayed >= RETRY.as_secs_f64() - 0.002,
        "permanent = 3s: the agent must not return to the primaries before 3 s on level 1 \
         (stayed {stayed:.3} s)"
    );
    // The retry comes at most 3 s after the primaries are up (they are up for the next
    // one); 5 s of margin for a busy machine.
    let bound = RETRY + Duration::from_secs(5);
    assert!(
        back <= bound,
        "permanent = 3s: traffic should return within 3 s (+5 s margin) of the primaries' \
         recovery, took {back:.2?}"
    );
    s.traffic("after the retry", CONNECTIONS, &["p1", "p2"]);
    s.finish();
}

#[test]
fn backup_levels_permanent_stays_and_cycles() {
    let mut s = Setup::new(144, Some("{ permanent = true }"));
    s.traffic("all up", CONNECTIONS, &["p1", "p2"]);

    s.kill(&["p1", "p2"]);
    let (_, took) = s.level(1, "backup level 1 active after both primaries failed");
    println!("backup (permanent): p1, p2 killed; level 1 after {took:.2?}");

    s.restart(&["p1", "p2"]);
    s.up(&["p1", "p2"]);
    // Several probe intervals with the primaries up: nothing may move.
    std::thread::sleep(Duration::from_secs(2));
    let v = s.api.service("web").expect("GET service");
    println!(
        "backup (permanent): primaries up again for 2 s\n{}",
        s.describe(&v)
    );
    assert_eq!(
        v.active_backup_level,
        1,
        "permanent = true: level 1 stays active after the primaries recover:\n{}",
        s.describe(&v)
    );
    s.traffic("primaries recovered", CONNECTIONS, &["b1"]);

    s.kill(&["b1"]);
    let (v, took) = s.wait("a level switch after b1 failed", |v| {
        v.active_backup_level != 1
    });
    println!(
        "backup (permanent): b1 killed; level {} after {took:.2?}\n{}",
        v.active_backup_level,
        s.describe(&v)
    );
    assert_eq!(
        v.active_backup_level, 2,
        "permanent = true: when b1 fails traffic moves to the next level (b2), not back to \
         the primaries"
    );
    s.traffic("b1 down", CONNECTIONS, &["b2"]);

    s.kill(&["b2"]);
    let (v, took) = s.wait("a level switch after b2 failed", |v| {
        v.active_backup_level != 2
    });
    println!(
        "backup (permanent): b2 killed; level {} after {took:.2?}\n{}",
        v.active_backup_level,
        s.describe(&v)
    );
    assert_eq!(
        v.active_backup_level, 0,
        "permanent = true: from the highest level traffic returns to the primary group"
    );
    s.traffic("b2 down", CONNECTIONS, &["p1", "p2"]);
    let events = s.events();
    for e in events.iter().filter(|e| e.server == "-") {
        println!("  event {} {}", e.time, e.cause);
    }
    s.finish();
}
