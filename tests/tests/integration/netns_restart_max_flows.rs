//! A restart that changes `agent.max_flows` (root, netns, nat): the flow and nat tables
//! of the new size cannot take over the old ones, so they are created fresh and the old
//! tables' live entries are copied into them before the new program is swapped in. A
//! nat connection opened before the restart keeps working after it — which it cannot
//! without the copy (its flow entry names its nat source port, and the backend knows the
//! connection by that port) — and its entries are found in the new, smaller tables. A
//! restart at the same size adopts both tables again, with the install's seeds.

use std::{net::IpAddr, path::Path, time::Duration};

use aya::maps::{Array, Map, MapData};
use lb_common::{
    map_names,
    maps::{DataplaneConfig, FlowValue, NatValue},
    table::{Bucket, SLOT_LIVE, Slot, TableLayout},
};
use lb_tests::{
    agent::{
        api::{self, Api},
        daemon::{Agent, AgentConfig, locate_binary},
        operator,
    },
    bpf::object::flow_key,
    net::topology::{Forwarding, HOST_IF, Topology},
    scenario::{
        balance::{self, WEIGHTS},
        restart::echoes,
    },
    traffic::clients::EchoConn,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const START: Duration = Duration::from_secs(30);
const MODE: &str = "nat";

/// Lines of `agent`'s log containing `needle`.
fn lines_with(agent: &Agent, needle: &str) -> Vec<String> {
    let lines = agent.process().lines();
    lines.into_iter().filter(|l| l.contains(needle)).collect()
}

fn stop(agent: Agent, what: &str) {
    agent
        .process()
        .signal(libc::SIGTERM)
        .expect("signalling the agent");
    let status = agent.stop(Duration::from_secs(10)).expect("stopping");
    assert!(status.success(), "{what}: SIGTERM should exit 0: {status}");
}

/// The maps of the program attached to the lb host's interface (the agent's), by id.
fn attached_map(topo: &Topology, name: &str) -> MapData {
    let ids = topo
        .lb()
        .ns
        .run(|| {
            let ifindex = lb_agent::dataplane::if_index(HOST_IF).expect("eth0");
            lb_agent::dataplane::adopt::attached_program(ifindex, HOST_IF)
                .expect("reading the attached program")
                .expect("a program attached")
                .map_ids()
                .to_vec()
        })
        .expect("entering the lb namespace");
    let short = &name[..name.len().min(15)];
    ids.into_iter()
        .filter_map(|id| MapData::from_id(id).ok())
        .find(|m| m.info().is_ok_and(|i| i.name_as_str() == Some(short)))
        .unwrap_or_else(|| panic!("the attached program has no map {name}"))
}

/// The tables' layout the running program recorded in its `LB_CONFIG`.
fn attached_layout(topo: &Topology) -> TableLayout {
    let config: Array<MapData, DataplaneConfig> =
        Array::try_from(Map::Array(attached_map(topo, map_names::CONFIG))).expect("its type");
    config.get(&0, 0).expect("LB_CONFIG's entry").tables
}

/// The map named `name` of the program attached to the lb host's interface (the
/// agent's): its size and whether one of its live slots is one `matches` accepts (every
/// bucket read). Found through the interface, not by name among all loaded maps: other
/// tests on the machine load maps of the same name.
fn attached_table_holds<V>(
    topo: &Topology,
    name: &str,
    matches: impl Fn(&Slot<V>) -> bool,
) -> (u32, bool)
where
    Bucket<V>: aya::Pod,
{
    let data = attached_map(topo, name);
    let map: Array<MapData, Bucket<V>> = Array::try_from(Map::Array(data)).expect("its type");
    let len = map.len();
    let found = (0..len).any(|i| {
        let b = map.get(&i, 0).expect("reading a bucket");
        b.ways.iter().any(|s| s.word & SLOT_LIVE != 0 && matches(s))
    });
    (len, found)
}

#[test]
fn a_new_flow_capacity_copies_the_live_flows_into_the_new_tables() {
    let bed = balance::Testbed::start(Forwarding::Nat, 94, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let start = |extra: &[&str], what: &str| {
        let mut config = AgentConfig::new(vec![service.clone()]);
        config.agent_extra = extra.iter().map(|s| s.to_string()).collect();
        Agent::start(topo, &binary, &config, Some("native"), START)
            .unwrap_or_else(|e| panic!("{what}: starting lb-agent: {e}"))
    };

    let agent = start(&[], "default size");
    let client = topo.client();
    let mut conn = EchoConn::connect(&client.ns, client.ipv4.into(), vip)
        .expect("entering the client namespace")
        .unwrap_or_else(|e| panic!("a connection to {vip} should be answered: {e}"));
    echoes(&mut conn, "before the restart", MODE, "at the default size");
    let local = conn.local_addr().expect("the connection's address");
    let key = flow_key(
        IpAddr::from(client.ipv4),
        local.port(),
        vip.ip(),
        vip.port(),
        lb_common::IPPROTO_TCP,
    );
    // The install's own seeds, recorded with the program and never in the log.
    let first = attached_layout(topo);
    assert_ne!(
        (first.flow_seed, first.nat_seed),
        (
            TableLayout::BUILT_IN.flow_seed,
            TableLayout::BUILT_IN.nat_seed
        ),
        "seeds drawn for this install"
    );
    stop(agent, "default size");

    let agent = start(&["max_flows = 4096"], "smaller tables");
    let line = operator::line_with(agent.process(), operator::ADOPTED, "smaller tables");
    assert!(
        line.contains("maps_kept=13") && line.contains("maps_fresh=2"),
        "the two tables fresh, the other thirteen kept: {line}"
    );
    let copied = lines_with(&agent, "live entries were copied");
    for map in [map_names::FLOWS, map_names::NAT] {
        assert!(
            copied
                .iter()
                .any(|l| l.contains(map) && !l.contains("kept=0") && l.contains("dropped=0")),
            "{map}: its live entries copied, none dropped: {copied:?}"
        );
    }
    let (flows_len, flow_found) =
        attached_table_holds::<FlowValue>(topo, map_names::FLOWS, |s| s.key == key);
    assert_eq!(flows_len, 4096, "LB_FLOWS sized for 4,096 flows");
    assert!(flow_found, "the connection's flow is in the new LB_FLOWS");
    // The reverse entry is keyed by the backend's side; its value names the client.
    let (nat_len, nat_found) = attached_table_holds::<NatValue>(topo, map_names::NAT, |s| {
        s.value.client_addr == key.src && s.value.client_port == key.sport
    });
    assert_eq!(nat_len, 2048, "LB_NAT: half a bucket per flow");
    assert!(
        nat_found,
        "the connection's reverse entry is in the new LB_NAT"
    );
    echoes(&mut conn, "after the resize", MODE, "after the resize");
    // The operator sees the sizes.
    let api = Api::new(&topo.lb().ns);
    let status = api::cli(
        &topo.lb().ns,
        &binary,
        &["status", "--api", &api.url()],
        Duration::from_secs(10),
    )
    .expect("lb-agent status");
    assert!(
        status.contains(
            "flow tables: 4096 live flows: LB_FLOWS 4096 buckets, LB_NAT 2048 buckets (4 ways \
             each), LB_SOURCES 1024 entries; 2.0 MiB"
        ),
        "status shows the tables:\n{status}"
    );
    let resized_log = agent.process().lines().join("\n");
    stop(agent, "smaller tables");

    let agent = start(&["max_flows = 4096"], "same size again");
    let line = operator::line_with(agent.process(), operator::ADOPTED, "same size again");
    assert!(
        line.contains("maps_kept=15") && line.contains("maps_fresh=0"),
        "both tables adopted as they are (same size, the install's seeds): {line}"
    );
    echoes(
        &mut conn,
        "after the second restart",
        MODE,
        "same size again",
    );
    let now = attached_layout(topo);
    assert_eq!(
        (now.flow_seed, now.nat_seed, now.flow_buckets),
        (first.flow_seed, first.nat_seed, 4096),
        "the restarts kept the install's seeds"
    );
    let text = agent.process().lines().join("\n") + &resized_log;
    for seed in [first.flow_seed, first.nat_seed] {
        assert!(
            !text.contains(&seed.to_string()) && !text.contains(&format!("{seed:x}")),
            "a seed is in the log"
        );
    }
    stop(agent, "same size again");
}
