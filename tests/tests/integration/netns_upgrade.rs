//! Upgrade from the previous release to this build and roll back, under traffic, the
//! way an operator does (docs/upgrades.md): stop the running agent (its XDP program stays
//! attached and forwarding), start the other build, which adopts the program's maps and
//! swaps its own program in. The previous release is the commit in
//! `tests/previous-release`, a build from before schema versions (`LB_SCHEMA`), built by
//! `cargo xtask prev-release`.
//!
//! Steps: previous release → this build (adopts a program that recorded no versions:
//! baseline, every map kept) → this build restarted (adopts its own record) → the
//! previous release again (rollback; it judges by layout). Throughout, keep-alive
//! connections send requests and new connections are opened back to back: no request
//! may fail and every keep-alive connection keeps its backend. In nat (with
//! `agent.pin_path`: this build pins `LB_SCHEMA` there too) and in dsr.
//!
//! And schema changes on real maps: a previous program whose `LB_SCHEMA` records another
//! version of `LB_FLOWS` or `LB_NAT` (same layout) gets that one map created fresh, said
//! in the log with its consequence, which the traffic then shows (dsr and nat).

use std::{path::Path, process::Command, thread, time::Duration};

use aya::maps::{HashMap, Map, MapData};
use lb_agent::dataplane::adopt;
use lb_common::{map_names, schema};
use lb_tests::{
    agent::{
        bpffs::PrivateBpffs,
        daemon::{Agent, AgentConfig, locate_binary},
        upgrade::{KeepAlive, PREVIOUS_RELEASE, line_with, previous_agent},
    },
    net::topology::{Forwarding, HOST_IF, Topology},
    scenario::{
        balance::{self, WEIGHTS},
        restart::{Stream, assert_stream_clean},
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const START: Duration = Duration::from_secs(30);
/// Keep-alive connections held through the upgrade and the rollback.
const KEEPALIVE: usize = 8;
/// Traffic between two steps, and while no agent runs.
const SETTLE: Duration = Duration::from_secs(1);
const ADOPTED: &str = "adopted the previous state";

fn stop(agent: Agent, mode: &str, which: &str) {
    let status = agent
        .stop(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{mode}: stopping the {which} agent: {e}"));
    assert!(
        status.success(),
        "{mode}: SIGTERM should stop the {which} agent with 0, got {status}"
    );
    // Traffic with no agent at all: the program forwards on its own.
    thread::sleep(SETTLE);
}

fn all_maps_kept(agent: &Agent, mode: &str, step: &str) -> String {
    maps_kept(agent, mode, step, adopt::ADOPTED_MAPS.len())
}

/// The adoption line, asserting `kept` of this build's adopted maps adopted.
fn maps_kept(agent: &Agent, mode: &str, step: &str, kept: usize) -> String {
    let all = adopt::ADOPTED_MAPS.len();
    let line = line_with(agent, ADOPTED, step);
    assert!(
        line.contains(&format!("maps_kept={kept}"))
            && line.contains(&format!("maps_fresh={}", all - kept)),
        "{mode}: {step}: {kept} of {all} maps should be adopted: {line}"
    );
    line
}

/// The version `LB_SCHEMA` pinned in `pins` records for `map`.
fn pinned_version(pins: &Path, map: &str) -> u32 {
    let data = MapData::from_pin(pins.join(schema::META_MAP))
        .unwrap_or_else(|e| panic!("LB_SCHEMA pinned in {}: {e}", pins.display()));
    let recorded: HashMap<MapData, [u8; schema::NAME_LEN], u32> =
        HashMap::try_from(Map::HashMap(data)).expect("LB_SCHEMA is a hash map");
    recorded
        .get(&schema::key(map), 0)
        .unwrap_or_else(|e| panic!("{map} in the pinned LB_SCHEMA: {e}"))
}

/// With `pinned`, both builds also pin their maps in `agent.pin_path` (this build adds
/// `LB_SCHEMA` there).
fn upgrade_and_rollback(forwarding: Forwarding, subnet: u8, pinned: bool) {
    let mode = forwarding.as_str();
    let previous = previous_agent();
    let current = locate_binary("lb-agent").expect("this build's lb-agent");
    let version = Command::new(&previous)
        .arg("--version")
        .output()
        .expect("running the previous release's --version");
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(
        version.contains(&PREVIOUS_RELEASE.trim()[..12]),
        "the previous release's binary should name its commit: {version}"
    );

    let bed = balance::Testbed::start(forwarding, subnet, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let pins = pinned.then(|| PrivateBpffs::mount(mode).expect("mounting a bpffs for the pins"));
    let mut config = AgentConfig::new(vec![service]);
    if let Some(p) = &pins {
        config.pin_path = p.pins().display().to_string();
    }
    let start = |binary: &Path, which: &str| {
        Agent::start(topo, binary, &config, Some("native"), START)
            .unwrap_or_else(|e| panic!("{mode}: starting the {which} agent: {e}"))
    };

    // The previous release serves.
    let agent = start(&previous, "previous");
    line_with(
        &agent,
        "starting fresh",
        "the previous release on a bare interface",
    );
    let keepalive = KeepAlive::start(topo, vip, KEEPALIVE);
    let stream = Stream::start(topo, vip);
    thread::sleep(SETTLE);

    // Upgrade: stop the previous release, start this build.
    stop(agent, mode, "previous");
    let agent = start(&current, "upgraded");
    // Every map but LB_COUNTERS, which this build made longer (its counters restart),
    // and cluster mode's three, which the previous release does not have; the tables
    // keep the previous release's public seeds, so that a rollback finds every flow.
    let adopted = maps_kept(&agent, mode, "upgrade", 11);
    println!("{mode}: upgrade: {adopted}");
    let summary = line_with(&agent, "maps adopted:", "upgrade summary");
    assert!(
        summary.contains(
            "11 of 15 maps kept, 4 created fresh (LB_COUNTERS, LB_PEER_FLOWS, LB_PEER_NAT, \
             LB_CONN_EVENTS)"
        ) && summary.contains("established flows keep their backends")
            && summary.contains("none recorded"),
        "{mode}: upgrading from a build without versions: the baseline, all but the \
         counters kept: {summary}"
    );
    line_with(&agent, "keep the public hash seeds", "the inherited seeds");
    println!("{mode}: upgrade: {summary}");
    if let Some(p) = &pins {
        assert_eq!(
            pinned_version(p.pins(), map_names::FLOWS),
            schema::BASELINE,
            "{mode}: this build pins its versions in pin_path"
        );
    }
    thread::sleep(SETTLE);

    // A restart of this build finds the versions it recorded, through the program.
    stop(agent, mode, "upgraded");
    let agent = start(&current, "restarted");
    all_maps_kept(&agent, mode, "restart of this build");
    let summary = line_with(&agent, "maps adopted:", "restart summary");
    assert!(
        summary.contains("all 15 maps kept") && summary.contains("recorded for 15 maps"),
        "{mode}: a restart reads this build's own versions: {summary}"
    );
    println!("{mode}: restart: {summary}");
    thread::sleep(SETTLE);

    // Rollback: stop this build, start the previous release again.
    stop(agent, mode, "restarted");
    let agent = start(&previous, "rolled-back");
    // The previous release judges its own 12 maps by layout: the longer LB_COUNTERS
    // is made fresh (it has no cluster maps to adopt).
    let line = line_with(&agent, ADOPTED, "rollback");
    assert!(
        line.contains("maps_kept=11") && line.contains("maps_fresh=1"),
        "{mode}: rollback: 11 of the previous release's 12 maps should be adopted: {line}"
    );
    thread::sleep(SETTLE);

    let tally = stream.finish();
    let kept = keepalive.finish();
    stop(agent, mode, "rolled-back");
    println!(
        "{mode}: upgrade {} -> this build -> restart -> rollback: {} new connections in \
         {:?}, {} failed; {} keep-alive connections ({:?}), {} requests, {} failed, {} kept \
         their backend",
        &PREVIOUS_RELEASE.trim()[..12],
        tally.attempted,
        tally.elapsed,
        tally.failures.len(),
        kept.connections,
        kept.backends,
        kept.requests,
        kept.failures.len(),
        kept.kept_backend
    );
    assert_stream_clean(&tally, mode);
    assert!(
        kept.failures.is_empty(),
        "{mode}: no request over a keep-alive connection may fail or reach another backend: \
         {:?}",
        kept.failures
    );
    assert_eq!(
        kept.kept_backend, KEEPALIVE,
        "{mode}: every connection kept its backend"
    );
    assert!(
        kept.requests >= KEEPALIVE * 20,
        "{mode}: the keep-alive requests should have run all along (got {})",
        kept.requests
    );
}

#[test]
fn upgrade_and_rollback_under_traffic_nat() {
    upgrade_and_rollback(Forwarding::Nat, 214, true);
}

#[test]
fn upgrade_and_rollback_under_traffic_dsr() {
    upgrade_and_rollback(Forwarding::Dsr, 215, false);
}

/// Rewrites the version of `map` in the `LB_SCHEMA` of the program attached to the lb
/// namespace's interface, as a build that changed that map's meaning would have recorded.
fn record_version(topo: &Topology, map: &str, version: u32) {
    let map = map.to_owned();
    topo.lb()
        .ns
        .run(move || {
            let ifindex = lb_agent::dataplane::if_index(HOST_IF).expect("eth0");
            let program = adopt::attached_program(ifindex, HOST_IF)
                .expect("reading the interface's program")
                .expect("a program on the interface");
            let data = program
                .map_ids()
                .iter()
                .filter_map(|&id| MapData::from_id(id).ok())
                .find(|m| {
                    m.info()
                        .is_ok_and(|i| i.name() == schema::META_MAP.as_bytes())
                })
                .expect("the running program lists LB_SCHEMA among its maps");
            let mut recorded: HashMap<MapData, [u8; schema::NAME_LEN], u32> =
                HashMap::try_from(Map::HashMap(data)).expect("LB_SCHEMA is a hash map");
            recorded
                .insert(&schema::key(&map), &version, 0)
                .expect("rewriting a version in LB_SCHEMA");
        })
        .expect("entering the lb namespace");
}

/// A build whose `LB_FLOWS` means something else (its recorded version differs, its
/// layout does not): the new agent keeps the eleven other maps, creates the flow table
/// fresh and says so, and what it says happens: established dsr connections are
/// re-hashed by the same Maglev tables, so they keep their backend; established nat
/// connections break; new connections are all served.
fn schema_change(forwarding: Forwarding, subnet: u8, map: &'static str, survive: bool) {
    let mode = forwarding.as_str();
    let current = locate_binary("lb-agent").expect("this build's lb-agent");
    let bed = balance::Testbed::start(forwarding, subnet, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let config = AgentConfig::new(vec![service]);
    let start = |which: &str| {
        Agent::start(topo, &current, &config, Some("native"), START)
            .unwrap_or_else(|e| panic!("{mode}: starting the {which} agent: {e}"))
    };

    let agent = start("first");
    let keepalive = KeepAlive::start(topo, vip, KEEPALIVE);
    let stream = Stream::start(topo, vip);
    thread::sleep(SETTLE);
    stop(agent, mode, "first");
    let theirs = schema::BASELINE + 1;
    record_version(topo, map, theirs);

    let agent = start("next");
    let line = line_with(&agent, ADOPTED, "across a schema change");
    assert!(
        line.contains("maps_kept=14") && line.contains("maps_fresh=1"),
        "{mode}: fourteen maps kept, the flow table fresh: {line}"
    );
    let warning = line_with(&agent, "map not adopted, created fresh", "the fresh map");
    assert!(
        warning.contains(&format!("map=\"{map}\""))
            && warning.contains(&format!("schema v{theirs} -> v{}", schema::BASELINE))
            && warning.contains("same layout")
            && warning.contains(schema_consequence(map)),
        "{mode}: the warning names the map, both versions and the consequence: {warning}"
    );
    let summary = line_with(&agent, "maps adopted:", "the summary");
    assert!(
        summary.contains(&format!("14 of 15 maps kept, 1 created fresh ({map}):")),
        "{mode}: {summary}"
    );
    println!("{mode}: {warning}\n{mode}: {summary}");
    thread::sleep(SETTLE);

    let tally = stream.finish();
    let kept = keepalive.finish();
    stop(agent, mode, "next");
    println!(
        "{mode}: across a schema change of {map}: {} new connections, {} failed; {} \
         keep-alive connections, {} requests, {} failed, {} kept their backend",
        tally.attempted,
        tally.failures.len(),
        kept.connections,
        kept.requests,
        kept.failures.len(),
        kept.kept_backend
    );
    // A connection whose handshake spans the swap can be caught by it, in two ways:
    // - a fresh LB_NAT: as the warning says, a reverse entry is made again from the
    //   flow's next client packet; a connection whose handshake went through the previous
    //   program and whose greeting (the backend speaks first) arrives after the swap waits
    //   for a client packet that this client does not send before the greeting;
    // - a fresh LB_FLOWS in nat: the SYN's flow entry (its source port) is gone, so the
    //   client's ACK, a segment of a connection the new table does not know, is dropped
    //   (packet rule: no flow for a nat TCP segment but a SYN), as for an established
    //   connection, and the greeting never comes.
    // Only a connection opened in the instant of the swap can be caught so.
    let caught_at_the_swap =
        map == map_names::NAT || (map == map_names::FLOWS && forwarding == Forwarding::Nat);
    if caught_at_the_swap {
        assert!(
            tally.attempted > 100
                && tally.failures.len() <= 2
                && tally.failures.iter().all(|f| f.contains("greeting")),
            "{mode}: at most the connections opened at the swap may wait for their greeting: \
             {} of {}: {:?}",
            tally.failures.len(),
            tally.attempted,
            tally.failures
        );
    } else {
        assert_stream_clean(&tally, mode);
    }
    if survive && map == map_names::NAT {
        // A reply in flight at the swap finds no reverse entry yet: it reaches the lb's
        // kernel, which answers it with a reset (docs/upgrades.md). With a request every
        // 20 ms and a sub-millisecond round trip that is rare; the others keep their
        // backend, and none moves to another.
        let reset = kept.failures.iter().filter(|f| f.contains("reset")).count();
        assert!(
            reset == kept.failures.len() && reset <= 2 && kept.kept_backend + reset == KEEPALIVE,
            "{mode}: established connections keep their backend across a fresh {map}, but for \
             a reply in flight at the swap (at most 2 of {KEEPALIVE}): {:?}",
            kept.failures
        );
    } else if survive {
        assert!(
            kept.failures.is_empty() && kept.kept_backend == KEEPALIVE,
            "{mode}: every established connection keeps its backend across a fresh {map}: \
             {:?}",
            kept.failures
        );
    } else {
        // As the warning says: the connection breaks (the backend resets it), it does not
        // move to another backend.
        assert!(
            kept.kept_backend == 0
                && kept.failures.len() == KEEPALIVE
                && kept.failures.iter().all(|f| f.contains("got error")),
            "{mode}: every established connection should break across a fresh {map}, none \
             answer from elsewhere: {:?}",
            kept.failures
        );
    }
}

/// The part of the warning the scenario checks.
fn schema_consequence(map: &str) -> &'static str {
    match map {
        map_names::FLOWS => "re-hashed by Maglev",
        map_names::NAT => "reverse entry is made again from its next client packet",
        _ => unreachable!("only these maps are changed here"),
    }
}

/// dsr: the flows re-hashed by unchanged tables keep their backend.
#[test]
fn a_flow_schema_change_keeps_dsr_connections() {
    schema_change(Forwarding::Dsr, 216, map_names::FLOWS, true);
}

/// nat: a flow's entry held its source port; without it the connection breaks.
#[test]
fn a_flow_schema_change_breaks_nat_connections() {
    schema_change(Forwarding::Nat, 217, map_names::FLOWS, false);
}

/// nat: the kept flows make their reverse entries again from the next client packet.
#[test]
fn a_nat_schema_change_keeps_nat_connections() {
    schema_change(Forwarding::Nat, 218, map_names::NAT, true);
}
