//! Spoofed floods of every kind at real size through the real agent (dsr): `lb-agent run`
//! with `agent.max_flows = 1048576` on the lb host of a veth topology, 64 keep-alive
//! connections from the client, 1,000,000 established flows put in the flow table by
//! the client side's own frames (ACKs from distinct spoofed sources: an ACK opens an
//! unproven flow, which its source's next ACK more than a second later confirms), a
//! fourth backend added (so that a flow that lost its entry would be sent to another
//! backend by the new Maglev table), then 2,000,000 SYNs, 2,000,000 ACKs and 2,000,000
//! UDP datagrams, each flood from its own distinct spoofed sources, while the client
//! opens new connections. Asserted after each flood: every established flow is still
//! pinned to its backend (the whole table read back), nothing evicted, at most two
//! unconfirmed flows in a bucket; the keep-alive connections are answered by the same
//! server throughout; every new connection is answered. docs/capacity.md, "A flood at
//! real size".
//!
//! The backends' kernels would answer the injected frames (resets, SYN-ACKs to
//! unrouted sources): an nftables rule on each backend's `eth0` ingress drops the
//! spoofed range before the IP stack, as a backend behind a balancer under attack is
//! not what this test measures. The spoofed frames (with the client's MAC) are put on
//! the switch's port toward the lb, which gets a packet queue: a full veth ring holds
//! that queue back, and a full queue refuses the sender, so nothing on the way drops
//! them and every one reaches lb. (Sent from the client's side, they would cross the
//! bridge, which drops what the port's full queue cannot take.)

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use lb_common::{
    IPPROTO_TCP,
    maps::{FLOW_F_UNCONFIRMED, FlowKey},
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
        frame_stream::{self, FrameTemplate},
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
/// New connections opened in each round while a flood runs, and after it.
const NEW_PER_ROUND: usize = 8;
const NEW_AFTER: usize = 32;
/// Source ports of the new connections (below the client's ephemeral range).
const NEW_FIRST_PORT: u16 = 20_000;
/// Established flows come from 198.18.0.0/16, the floods from 198.19.0.0/16 (each its
/// own ports: [`FLOODS`]).
const FILL_NET: u8 = 18;
const FLOOD_NET: u8 = 19;
const SPOOFED: &str = "198.18.0.0/15";
/// The first source port of the established flows.
const FILL_PORTS: u16 = 10_000;
/// Bounds of the sending and of the rounds during a flood.
const SEND_LIMIT: Duration = Duration::from_secs(90);
const MAX_ROUNDS: usize = 200;
/// Passes of the fill: an ACK's flow is confirmed by the next pass's.
const MAX_FILL_PASSES: usize = 6;
/// More than the second after which a packet of an unproven flow confirms it.
const PROOF_WAIT: Duration = Duration::from_millis(1_100);
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The floods: what each spoofed frame is, and the first source port of its sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flood {
    Syn,
    Ack,
    Udp,
}

const FLOODS: [Flood; 3] = [Flood::Syn, Flood::Ack, Flood::Udp];

impl Flood {
    fn ports(self) -> u16 {
        match self {
            Flood::Syn => 20_000,
            Flood::Ack => 30_000,
            Flood::Udp => 40_000,
        }
    }
}

/// Candidate `n` of network 198.`net`.0.0/16: 32 ports of each address from `ports`.
fn source(net: u8, ports: u16, n: u64) -> (Ipv4Addr, u16) {
    let a = (n >> 5) as u32;
    let ip = Ipv4Addr::new(198, net, (a >> 8) as u8, a as u8);
    (ip, ports + (n & 31) as u16)
}

fn key_of(ip: Ipv4Addr, port: u16, vip: SocketAddr) -> FlowKey {
    flow_key(IpAddr::V4(ip), port, vip.ip(), vip.port(), IPPROTO_TCP)
}

/// The source of a flow's key, as `frame_stream` writes it.
fn source_of(k: &FlowKey) -> (Ipv4Addr, u16) {
    (
        Ipv4Addr::from(k.src[0].to_ne_bytes()),
        u16::from_be(k.sport),
    )
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
fn a_million_established_flows_keep_their_backends_under_spoofed_syns_acks_and_datagrams() {
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
    let datagrams = balance::udp_service(&topo, &three);
    let vip = service.vip;
    let udp_vip = datagrams.vip;
    let mut config = AgentConfig::new(vec![service, datagrams]);
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
    // would refuse the fill's own flows (the table is read with the agent's seed).
    let table = FlowTable::open(&topo.lb().ns).expect("the agent's LB_FLOWS");
    assert_eq!(
        table.layout.flow_buckets, MAX_FLOWS,
        "max_flows was applied"
    );
    let mask = table.layout.flow_buckets - 1;
    let layout = table.layout;
    let bucket = |k: &FlowKey| layout.flow_hash(k) & mask;
    let mut used = vec![0u8; table.layout.flow_buckets as usize];
    table
        .for_each(|k, _| used[bucket(k) as usize] += 1)
        .expect("reading LB_FLOWS");
    let mut chosen: Vec<FlowKey> = Vec::with_capacity(ESTABLISHED);
    let mut n = 0u64;
    while chosen.len() < ESTABLISHED {
        let (ip, port) = source(FILL_NET, FILL_PORTS, n);
        let key = key_of(ip, port, vip);
        let b = bucket(&key) as usize;
        if u32::from(used[b]) < TABLE_WAYS {
            used[b] += 1;
            chosen.push(key);
        }
        n += 1;
    }
    drop(used);

    // Each pass sends the flows pinned unproven their proof (an ACK more than a second
    // after their first), then the flows not pinned yet, at most two per bucket (an
    // unproven flow takes a free way only while fewer than two of its bucket wait),
    // until every flow is pinned and confirmed.
    let before_fill = FlowCounters::settled(&api).expect("GET /metrics");
    let ack = FrameTemplate::tcp(
        client.mac.0,
        topo.lb().mac.0,
        topo.vip4(),
        vip.port(),
        TCP_ACK,
    );
    let mut fill_sent = frame_stream::Sent::default();
    let mut pinned: HashMap<FlowKey, u32> = HashMap::new();
    let mut passes = 0;
    loop {
        let mut unproven: Vec<(Ipv4Addr, u16)> = Vec::new();
        pinned.clear();
        table
            .for_each(|k, v| {
                if k.src[0].to_ne_bytes()[..2] == [198, FILL_NET] {
                    if v.flags & FLOW_F_UNCONFIRMED != 0 {
                        unproven.push(source_of(k));
                    } else {
                        pinned.insert(*k, v.backend_id);
                    }
                }
            })
            .expect("reading LB_FLOWS");
        let mut waiting: HashMap<u32, u8> = HashMap::new();
        let mut frames = unproven.clone();
        let pinned_any: HashSet<(Ipv4Addr, u16)> = unproven.iter().copied().collect();
        for k in &chosen {
            let s = source_of(k);
            if pinned.contains_key(k) || pinned_any.contains(&s) {
                continue;
            }
            let w = waiting.entry(bucket(k)).or_default();
            if u32::from(*w) < PENDING_WAYS_MAX {
                *w += 1;
                frames.push(s);
            }
        }
        if frames.is_empty() || passes == MAX_FILL_PASSES {
            break;
        }
        passes += 1;
        let sent = frame_stream::send(
            &wire,
            LB_PORT,
            &ack,
            frames.len() as u64,
            |i| frames[i as usize],
            SEND_LIMIT,
        )
        .expect("sending the established flows' ACKs");
        fill_sent.frames += sent.frames;
        fill_sent.refusals += sent.refusals;
        fill_sent.elapsed += sent.elapsed;
        thread::sleep(PROOF_WAIT);
    }
    let filled = FlowCounters::settled(&api).expect("GET /metrics");
    let entries =
        flood_watch::table_entries_at_least(&api, ESTABLISHED as u64, Duration::from_secs(15))
            .expect("GET /metrics");
    println!(
        "fill: {} ACK frames in {passes} passes, {:.1?} ({:.0}/s, {} full-queue pauses); {} \
         established flows pinned and confirmed, lb_flow_table_entries {entries}, \
         flow_evicted {}",
        fill_sent.frames,
        fill_sent.elapsed,
        fill_sent.per_second(),
        fill_sent.refusals,
        pinned.len(),
        filled.evicted - before_fill.evicted,
    );
    assert_eq!(
        pinned.len(),
        ESTABLISHED,
        "every injected flow pinned and confirmed"
    );
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
    config4.services = vec![
        balance::tcp_service(&topo, &four),
        balance::udp_service(&topo, &four),
    ];
    agent
        .reload(&config4, RELOAD_TIMEOUT)
        .expect("reloading with b4");
    echoes += echo_all(&mut conns, "after the reload");

    // `count` new connections from the client's next source ports.
    let open_new = |ports: &mut u16, count: usize| {
        let t = clients::tcp_names(
            &client.ns,
            client.ipv4.into(),
            *ports,
            vip,
            count,
            Duration::from_secs(30),
        )
        .expect("entering the client namespace");
        *ports += count as u16;
        t
    };
    let mut new_ports = NEW_FIRST_PORT;
    let mut new_failures: Vec<String> = Vec::new();
    let (mut during_all, mut after_all, mut rounds_all) = (0usize, 0usize, 0usize);
    for flood in FLOODS {
        let before_flood = FlowCounters::settled(&api).expect("GET /metrics");
        let (macs, vip4) = ((client.mac.0, topo.lb().mac.0), topo.vip4());
        let template = match flood {
            Flood::Syn => FrameTemplate::tcp(macs.0, macs.1, vip4, vip.port(), TCP_SYN),
            Flood::Ack => FrameTemplate::tcp(macs.0, macs.1, vip4, vip.port(), TCP_ACK),
            Flood::Udp => FrameTemplate::udp(macs.0, macs.1, vip4, udp_vip.port()),
        };
        let flood_wire = wire.clone();
        let sending = thread::spawn(move || {
            frame_stream::send(
                &flood_wire,
                LB_PORT,
                &template,
                FLOOD,
                |n| source(FLOOD_NET, flood.ports(), n),
                SEND_LIMIT,
            )
        });
        let mut during = 0usize;
        let mut rounds = 0;
        while !sending.is_finished() && rounds < MAX_ROUNDS {
            echoes += echo_all(&mut conns, &format!("{flood:?} flood round {rounds}"));
            let t = open_new(&mut new_ports, NEW_PER_ROUND);
            during += t.answered();
            new_failures.extend(t.failures);
            rounds += 1;
        }
        let flood_sent = sending
            .join()
            .expect("the flood thread")
            .expect("sending the flood");
        let after = open_new(&mut new_ports, NEW_AFTER);
        new_failures.extend(after.failures.iter().cloned());
        echoes += echo_all(&mut conns, &format!("after the {flood:?} flood"));
        let flooded = FlowCounters::settled(&api).expect("GET /metrics");

        // The whole table again: every established flow where it was.
        let (mut kept, mut moved) = (0usize, 0usize);
        let mut waiting_per_bucket: HashMap<u32, u32> = HashMap::new();
        let mut seen: HashMap<FlowKey, u32> = HashMap::with_capacity(ESTABLISHED);
        table
            .for_each(|k, v| {
                let net = k.src[0].to_ne_bytes();
                if net[..2] == [198, FILL_NET] {
                    seen.insert(*k, v.backend_id);
                } else if v.flags & FLOW_F_UNCONFIRMED != 0 {
                    *waiting_per_bucket.entry(bucket(k)).or_default() += 1;
                }
            })
            .expect("reading LB_FLOWS");
        for (k, b) in &pinned {
            match seen.get(k) {
                Some(now) if now == b => kept += 1,
                Some(_) => moved += 1,
                None => {}
            }
        }
        let waiting: u32 = waiting_per_bucket.values().sum();
        let most_waiting = waiting_per_bucket.values().copied().max().unwrap_or(0);
        let delta = |f: fn(&FlowCounters) -> u64| f(&flooded) - f(&before_flood);
        println!(
            "{flood:?} flood: {} frames in {:.1?} ({:.0}/s, {} full-queue pauses), flow_new \
             {}, flow_unpinned {}, drop_flows_full {}; {kept} of {ESTABLISHED} established \
             flows kept their backend, {moved} moved, flow_evicted {}; {waiting} unconfirmed \
             flows (at most {most_waiting} in a bucket); new connections: {during} answered \
             during the flood ({rounds} rounds), {} after",
            flood_sent.frames,
            flood_sent.elapsed,
            flood_sent.per_second(),
            flood_sent.refusals,
            delta(|c| c.new),
            delta(|c| c.unpinned),
            delta(|c| c.flows_full),
            delta(|c| c.evicted),
            after.answered(),
        );
        // Every spoofed frame reached lb (the port's queue holds bursts back): each opened
        // a new flow, pinned or not, as did each real connection.
        let arrived = delta(|c| c.new);
        assert!(
            arrived >= FLOOD,
            "{flood:?}: the spoofed frames reached the balancer as new flows ({arrived} new \
             flows for {FLOOD})"
        );
        assert_eq!(
            (kept, moved, delta(|c| c.evicted)),
            (ESTABLISHED, 0, 0),
            "{flood:?}: every established flow kept, none moved or evicted"
        );
        assert!(
            most_waiting <= PENDING_WAYS_MAX,
            "{flood:?}: at most {PENDING_WAYS_MAX} unconfirmed flows in a bucket \
             ({most_waiting})"
        );
        assert!(
            during > 0,
            "{flood:?}: connections were opened during the flood"
        );
        during_all += during;
        after_all += after.answered();
        rounds_all += rounds;
    }
    let entries_after =
        flood_watch::table_entries_at_least(&api, ESTABLISHED as u64, Duration::from_secs(12))
            .expect("GET /metrics");
    println!(
        "clients: {KEEPALIVE} keep-alive connections answered by their server {echoes} \
         times ({rounds_all} rounds during the floods); new connections: {during_all} \
         answered during the floods, {after_all} after, {} failed; lb_flow_table_entries \
         {entries_after}; whole scenario {:.1?} (setup {setup:.1?})",
        new_failures.len(),
        started.elapsed(),
    );
    for (i, c) in conns.iter().enumerate() {
        assert_eq!(c.backend(), backend_of[i], "keep-alive connection {i}");
    }
    drop(conns);
    agent.stop(STOP_GRACE).expect("stopping lb-agent");
    assert!(
        new_failures.is_empty(),
        "every new connection answered: {new_failures:?}"
    );
}
