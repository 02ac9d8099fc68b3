//! A spoofed SYN flood at real size through the real agent (dsr): `lb-agent run` with
//! `agent.max_flows = 1048576` on the lb host of a veth topology, 64 keep-alive
//! connections from the client, 1,000,000 established flows put in the flow table by
//! the client side's own frames (an ACK each, from distinct spoofed sources: a non-SYN
//! TCP packet pins its flow as established), a fourth backend added (so that a flow that
//! lost its entry would be sent to another backend by the new Maglev table), then
//! 2,000,000 SYNs from distinct spoofed sources while the client opens new connections.
//! Asserted: every established flow is still pinned to its backend (the whole table
//! read back), except flows that a real client's handshake took the way of, each
//! counted by `flow_evicted`; the keep-alive connections are answered by the same
//! server throughout; every new connection is answered. docs/capacity.md, "A flood at
//! real size".
//!
//! The backends' kernels would answer the injected ACKs and SYNs (resets, SYN-ACKs to
//! unrouted sources): an nftables rule on each backend's `eth0` ingress drops the
//! spoofed range before the IP stack, as a backend behind a balancer under attack is
//! not what this test measures. The spoofed frames (with the client's MAC) are put on
//! the switch's port toward the lb, which gets a packet queue: a full veth ring holds
//! that queue back, and a full queue refuses the sender, so nothing on the way drops
//! them and every one of the 3,000,000 reaches lb. (Sent from the client's side, they
//! would cross the bridge, which drops what the port's full queue cannot take.)

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use lb_common::{
    IPPROTO_TCP,
    maps::{FLOW_F_SYN_PENDING, FlowKey},
    table::{PENDING_WAYS_MAX, TABLE_WAYS},
};
use lb_tests::{
    agent::{
        api::Api,
        daemon::{Agent, AgentConfig, RELOAD_TIMEOUT, locate_binary},
        flow_snapshot::FlowTable,
    },
    bench::flood_watch::{self, FlowCounters},
    bpf::object::flow_key,
    net::topology::{Forwarding, Topology},
    scenario::balance,
    traffic::{
        clients::{self, EchoConn},
        frame_stream::{self, TcpTemplate},
        packet::{TCP_ACK, TCP_SYN},
    },
    util::process::STOP_GRACE,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const SUBNET: u8 = 226;
/// `agent.max_flows`: the tables of a host that holds a million flows.
const MAX_FLOWS: u32 = 1 << 20;
const ESTABLISHED: usize = 1_000_000;
const FLOOD: u64 = 2_000_000;
/// The switch's port toward the lb, where the spoofed frames are put on the wire.
const LB_PORT: &str = "p-lb";
/// Keep-alive connections opened before the table is filled.
const KEEPALIVE: usize = 64;
/// New connections opened in each round while the flood runs, and after it.
const NEW_PER_ROUND: usize = 8;
const NEW_AFTER: usize = 32;
/// Source ports of the new connections (below the client's ephemeral range).
const NEW_FIRST_PORT: u16 = 20_000;
/// Established flows come from 198.18.0.0/16, the flood from 198.19.0.0/16.
const FILL_NET: u8 = 18;
const FLOOD_NET: u8 = 19;
const SPOOFED: &str = "198.18.0.0/15";
/// Bounds of the sending and of the rounds during the flood.
const SEND_LIMIT: Duration = Duration::from_secs(90);
const MAX_ROUNDS: usize = 200;
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Candidate `n` of network 198.`net`.0.0/16: 32 ports of each address.
fn source(net: u8, n: u64) -> (Ipv4Addr, u16) {
    let a = (n >> 5) as u32;
    let ip = Ipv4Addr::new(198, net, (a >> 8) as u8, a as u8);
    (ip, 10_000 + (n & 31) as u16)
}

fn key_of(ip: Ipv4Addr, port: u16, vip: SocketAddr) -> FlowKey {
    flow_key(IpAddr::V4(ip), port, vip.ip(), vip.port(), IPPROTO_TCP)
}

/// Echoes once on every keep-alive connection; each must be answered by its backend.
fn echo_all(conns: &mut [EchoConn], round: &str) -> usize {
    let mut answered = 0;
    for (i, c) in conns.iter_mut().enumerate() {
        c.check_echo(&format!("{round} {i}"))
            .unwrap_or_else(|e| panic!("keep-alive connection {i} ({round}): {e}"));
        answered += 1;
    }
    answered
}

#[test]
fn a_million_established_flows_keep_their_backends_under_two_million_spoofed_syns() {
    let started = Instant::now();
    let topo = Topology::builder()
        .backends(4)
        .forwarding(Forwarding::Dsr)
        .subnet(SUBNET)
        .build()
        .expect("building the topology");
    let _servers = balance::start_testservers(&topo, Path::new(TESTSERVER))
        .expect("starting lb-testserver on every backend");
    flood_watch::drop_on_backends(&topo, SPOOFED).expect("nftables on the backends");
    let client = topo.client();
    // The spoofed frames enter at the switch's port toward the lb. A burst the lb's ring
    // cannot take at once waits in this queue, and a full queue refuses the sender
    // (which pauses and sends again) instead of dropping: every frame reaches lb.
    let wire = topo.switch().clone();
    wire.hold_bursts(LB_PORT, 10_000)
        .expect("a packet queue on the switch's port to the lb");

    let three = balance::weighted(&topo, &[1, 1, 1]);
    let service = balance::tcp_service(&topo, &three);
    let vip = service.vip;
    let mut config = AgentConfig::new(vec![service]);
    config.agent_extra.push(format!("max_flows = {MAX_FLOWS}"));
    let binary = locate_binary("lb-agent").expect("the lb-agent binary");
    let agent = Agent::start_as_operator(&topo, &binary, &config, START_TIMEOUT)
        .expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let setup = started.elapsed();

    // Real clients first, so that the fill below leaves their buckets room.
    let mut conns: Vec<EchoConn> = (0..KEEPALIVE)
        .map(|i| {
            EchoConn::connect(&client.ns, client.ipv4.into(), vip)
                .expect("entering the client namespace")
                .unwrap_or_else(|e| panic!("keep-alive connection {i}: {e}"))
        })
        .collect();
    let mut echoes = echo_all(&mut conns, "before");
    let backend_of: Vec<String> = conns.iter().map(|c| c.backend().to_owned()).collect();

    // 1,000,000 spoofed sources whose flows fit: a bucket of four established flows
    // would make the fill itself evict (the table is read with the agent's seed).
    let table = FlowTable::open(&topo.lb().ns).expect("the agent's LB_FLOWS");
    assert_eq!(
        table.layout.flow_buckets, MAX_FLOWS,
        "max_flows was applied"
    );
    let mask = table.layout.flow_buckets - 1;
    let mut used = vec![0u8; table.layout.flow_buckets as usize];
    table
        .for_each(|k, _| used[(table.layout.flow_hash(k) & mask) as usize] += 1)
        .expect("reading LB_FLOWS");
    let mut chosen: Vec<u64> = Vec::with_capacity(ESTABLISHED);
    let mut n = 0u64;
    while chosen.len() < ESTABLISHED {
        let (ip, port) = source(FILL_NET, n);
        let b = (table.layout.flow_hash(&key_of(ip, port, vip)) & mask) as usize;
        if u32::from(used[b]) < TABLE_WAYS {
            used[b] += 1;
            chosen.push(n);
        }
        n += 1;
    }
    drop(used);

    let before_fill = FlowCounters::settled(&api).expect("GET /metrics");
    let ack = TcpTemplate::new(
        client.mac.0,
        topo.lb().mac.0,
        topo.vip4(),
        vip.port(),
        TCP_ACK,
    );
    let mut fill_sent = frame_stream::Sent::default();
    let mut pinned: HashMap<FlowKey, u32> = HashMap::new();
    let mut missing: Vec<u64> = chosen.clone();
    // A frame that did not become a pinned flow is sent again (at most two more passes).
    let mut passes = 0;
    while !missing.is_empty() && passes < 3 {
        passes += 1;
        let sent = frame_stream::send(
            &wire,
            LB_PORT,
            &ack,
            missing.len() as u64,
            |i| source(FILL_NET, missing[i as usize]),
            SEND_LIMIT,
        )
        .expect("sending the established flows' ACKs");
        fill_sent.frames += sent.frames;
        fill_sent.refusals += sent.refusals;
        fill_sent.elapsed += sent.elapsed;
        thread::sleep(Duration::from_millis(500));
        pinned.clear();
        table
            .for_each(|k, v| {
                if k.src[0].to_ne_bytes()[..2] == [198, FILL_NET] {
                    pinned.insert(*k, v.backend_id);
                }
            })
            .expect("reading LB_FLOWS");
        missing.retain(|&n| {
            let (ip, port) = source(FILL_NET, n);
            !pinned.contains_key(&key_of(ip, port, vip))
        });
    }
    let filled = FlowCounters::settled(&api).expect("GET /metrics");
    let entries =
        flood_watch::table_entries_at_least(&api, ESTABLISHED as u64, Duration::from_secs(15))
            .expect("GET /metrics");
    println!(
        "fill: {} ACK frames in {passes} passes, {:.1?} ({:.0}/s, {} full-queue pauses); {} \
         established flows pinned, lb_flow_table_entries {entries}, flow_evicted {}",
        fill_sent.frames,
        fill_sent.elapsed,
        fill_sent.per_second(),
        fill_sent.refusals,
        pinned.len(),
        filled.evicted - before_fill.evicted,
    );
    assert_eq!(pinned.len(), ESTABLISHED, "every injected flow pinned");
    assert_eq!(
        filled.evicted, before_fill.evicted,
        "the fill evicted nothing"
    );
    assert!(
        entries >= ESTABLISHED as u64,
        "lb_flow_table_entries {entries} holds the million"
    );

    // A fourth backend: a flow that lost its entry would now be re-pinned by a table in
    // which a quarter of the slots name b4.
    let four = balance::weighted(&topo, &[1, 1, 1, 1]);
    let mut config4 = config.clone();
    config4.services = vec![balance::tcp_service(&topo, &four)];
    agent
        .reload(&config4, RELOAD_TIMEOUT)
        .expect("reloading with b4");
    echoes += echo_all(&mut conns, "after the reload");

    let before_flood = FlowCounters::settled(&api).expect("GET /metrics");
    let syn = TcpTemplate::new(
        client.mac.0,
        topo.lb().mac.0,
        topo.vip4(),
        vip.port(),
        TCP_SYN,
    );
    let flood_wire = wire.clone();
    let flood = thread::spawn(move || {
        frame_stream::send(
            &flood_wire,
            LB_PORT,
            &syn,
            FLOOD,
            |n| source(FLOOD_NET, n),
            SEND_LIMIT,
        )
    });
    let mut new_answered = 0usize;
    let mut new_failures: Vec<String> = Vec::new();
    let mut new_ports = NEW_FIRST_PORT;
    let mut rounds = 0;
    while !flood.is_finished() && rounds < MAX_ROUNDS {
        echoes += echo_all(&mut conns, &format!("flood round {rounds}"));
        let t = clients::tcp_names(
            &client.ns,
            client.ipv4.into(),
            new_ports,
            vip,
            NEW_PER_ROUND,
            Duration::from_secs(30),
        )
        .expect("entering the client namespace");
        new_ports += NEW_PER_ROUND as u16;
        new_answered += t.answered();
        new_failures.extend(t.failures);
        rounds += 1;
    }
    let flood_sent = flood
        .join()
        .expect("the flood thread")
        .expect("sending the flood");
    let during = new_answered;
    let after = clients::tcp_names(
        &client.ns,
        client.ipv4.into(),
        new_ports,
        vip,
        NEW_AFTER,
        Duration::from_secs(30),
    )
    .expect("entering the client namespace");
    new_ports += NEW_AFTER as u16;
    let after_answered = after.answered();
    new_failures.extend(after.failures);
    echoes += echo_all(&mut conns, "after the flood");
    let flooded = FlowCounters::settled(&api).expect("GET /metrics");

    // The whole table again: every established flow where it was.
    let layout = table.layout;
    let bucket = |k: &FlowKey| layout.flow_hash(k) & mask;
    let (mut kept, mut moved) = (0usize, 0usize);
    let mut waiting_per_bucket: HashMap<u32, u32> = HashMap::new();
    // The buckets of every new connection's flow (whether its way is still live or not).
    let real_buckets: std::collections::HashSet<u32> = (NEW_FIRST_PORT..new_ports)
        .map(|port| bucket(&key_of(client.ipv4, port, vip)))
        .collect();
    let mut seen: HashMap<FlowKey, u32> = HashMap::with_capacity(ESTABLISHED);
    table
        .for_each(|k, v| {
            let net = k.src[0].to_ne_bytes();
            if net[..2] == [198, FILL_NET] {
                seen.insert(*k, v.backend_id);
            } else if net[..2] == [198, FLOOD_NET] && v.flags & FLOW_F_SYN_PENDING != 0 {
                *waiting_per_bucket.entry(bucket(k)).or_default() += 1;
            }
        })
        .expect("reading LB_FLOWS");
    let mut lost_unexplained = Vec::new();
    let mut lost = 0usize;
    for (k, b) in &pinned {
        match seen.get(k) {
            Some(now) if now == b => kept += 1,
            Some(_) => moved += 1,
            None => {
                lost += 1;
                if !real_buckets.contains(&bucket(k)) {
                    lost_unexplained.push(*k);
                }
            }
        }
    }
    let waiting: u32 = waiting_per_bucket.values().sum();
    // The agent's census (every 5 s) once it has counted the flood's waiting flows.
    let entries_after = flood_watch::table_entries_at_least(
        &api,
        ESTABLISHED as u64 + u64::from(waiting),
        Duration::from_secs(12),
    )
    .expect("GET /metrics");
    let most_waiting = waiting_per_bucket.values().copied().max().unwrap_or(0);
    let evicted = flooded.evicted - before_flood.evicted;
    println!(
        "flood: {} SYN frames in {:.1?} ({:.0}/s, {} full-queue pauses), flow_new {}, \
         drop_flows_full {}; {kept} of {ESTABLISHED} established flows kept their backend, \
         {moved} moved, {lost} gone (flow_evicted {evicted}: real clients' handshakes in \
         full buckets); {waiting} flood flows waiting (at most {most_waiting} in a \
         bucket); lb_flow_table_entries {entries_after}",
        flood_sent.frames,
        flood_sent.elapsed,
        flood_sent.per_second(),
        flood_sent.refusals,
        flooded.new - before_flood.new,
        flooded.flows_full - before_flood.flows_full,
    );
    println!(
        "clients: {KEEPALIVE} keep-alive connections answered by their server {echoes} \
         times ({rounds} rounds during the flood); new connections: {during} answered \
         during the flood, {} after, {} failed; whole scenario {:.1?} (setup {setup:.1?})",
        after_answered,
        new_failures.len(),
        started.elapsed(),
    );
    for (i, c) in conns.iter().enumerate() {
        assert_eq!(c.backend(), backend_of[i], "keep-alive connection {i}");
    }
    drop(conns);
    agent.stop(STOP_GRACE).expect("stopping lb-agent");

    // Every spoofed SYN reached lb (the port's queue holds bursts back): each opened a
    // new flow, as did each real connection.
    let arrived = flooded.new - before_flood.new;
    assert!(
        arrived >= FLOOD,
        "the spoofed SYNs reached the balancer as new flows ({arrived} new flows for {FLOOD})"
    );
    assert_eq!(moved, 0, "no established flow changed backend");
    assert!(
        lost_unexplained.is_empty(),
        "{} established flows gone from buckets no real client entered: {:?}",
        lost_unexplained.len(),
        &lost_unexplained[..lost_unexplained.len().min(5)]
    );
    assert!(
        lost as u64 <= evicted,
        "every flow gone was evicted, and counted ({lost} gone, flow_evicted {evicted})"
    );
    assert!(
        evicted <= (new_ports - NEW_FIRST_PORT) as u64,
        "at most one eviction per real connection (flow_evicted {evicted})"
    );
    assert!(
        most_waiting <= PENDING_WAYS_MAX,
        "at most {PENDING_WAYS_MAX} waiting flows in a bucket ({most_waiting})"
    );
    assert!(
        new_failures.is_empty(),
        "every new connection answered: {new_failures:?}"
    );
    assert!(during > 0, "connections were opened during the flood");
}
