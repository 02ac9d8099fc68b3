//! Cluster mode, the agent's side of the data plane (root): the peer tables installed,
//! refreshed, read back and removed through `PeerTables` on the kernel's maps; a nat
//! connection published by the agent's publisher and driven through its handshake
//! (BPF_PROG_TEST_RUN) reports itself once through the connection-event stream, and the
//! nat scan finds its reverse entry among those seen since the handshake began; a
//! restart adopts the peer tables with their connections (maps pinned in a private
//! bpffs).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use aya::{
    maps::MapData,
    programs::{TestRun, TestRunOptions},
};
use lb_agent::{
    dataplane::{
        BpfDataplane, MapSizes,
        adopt::{ADOPTED_MAPS, AdoptedMaps, pin::PinDir},
        census::nat_clock,
        peers::PeerConnection,
    },
    publish::{DesiredBackend, DesiredService, NatSpec, Publisher, Role},
};
use lb_common::{
    IPPROTO_TCP,
    events::CONN_ESTABLISHED,
    maps::{FlowKey, NAT_S_ACKED, NAT_S_ESTABLISHED, NatValue, PeerFlow},
};
use lb_tests::{
    agent::bpffs::PrivateBpffs,
    bpf::object::flow_key,
    traffic::packet::{Frame, TCP_ACK, TCP_SYN},
};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const BACKEND_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x03];

fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn cluster_sizes() -> MapSizes {
    MapSizes::default()
        .with_flows(1 << 14)
        .expect("in range")
        .with_cluster()
}

fn cluster_dataplane() -> BpfDataplane {
    BpfDataplane::load_sized(None, None, cluster_sizes()).expect("loading (root?)")
}

fn connection(cport: u16, nat_port: u16) -> PeerConnection {
    let client = flow_key(ip(192, 0, 2, 7), cport, ip(10, 9, 0, 1), 80, IPPROTO_TCP);
    PeerConnection {
        client,
        flow: PeerFlow {
            backend_id: 1,
            nat_port: nat_port.to_be(),
            nat_addr: 0,
            _pad: 0,
        },
        reply: flow_key(
            ip(10, 9, 2, 1),
            8080,
            ip(10, 9, 1, 2),
            nat_port,
            IPPROTO_TCP,
        ),
        nat: NatValue {
            client_addr: client.src,
            vip_addr: client.dst,
            client_port: client.sport,
            vip_port: client.dport,
            backend_id: 1,
            client_mac: CLIENT_MAC,
            state: NAT_S_ESTABLISHED | NAT_S_ACKED,
            ..NatValue::default()
        },
    }
}

#[test]
fn peer_connections_are_installed_replaced_and_removed_in_both_tables() {
    let mut dp = cluster_dataplane();
    let mut peers = dp.take_peer_tables().expect("the peer tables");
    assert!(peers.is_empty());
    let a = connection(40_000, 20_001);
    let b = connection(40_001, 20_002);
    peers.install(&[a, b]).expect("install a and b");
    assert_eq!(peers.len(), 2);
    assert_eq!(peers.get(&a.client, &a.reply), Some((a.flow, a.nat)));

    let mut later = a;
    later.nat.state |= lb_common::maps::NAT_S_FIN_CLIENT;
    peers.install(&[later]).expect("replace a");
    assert_eq!(peers.get(&a.client, &a.reply), Some((a.flow, later.nat)));
    assert_eq!(peers.len(), 2);

    let absent = connection(40_002, 20_003);
    // One of them never installed, then the same again: nothing to do for those.
    peers.remove(&[(a.client, a.reply), (absent.client, absent.reply)]);
    peers.remove(&[(a.client, a.reply)]);
    assert_eq!(peers.get(&a.client, &a.reply), None);
    assert_eq!(peers.len(), 1, "b stays");
    assert_eq!(peers.get(&b.client, &b.reply), Some((b.flow, b.nat)));
}

#[test]
fn the_tables_hold_max_flows_connections_and_refuse_and_count_past_their_ways() {
    let mut dp = cluster_dataplane();
    let mut peers = dp.take_peer_tables().expect("the peer tables");
    let sizes = cluster_sizes();
    let held = sizes.max_flows() as usize;
    let ways = sizes.peer_buckets() as usize * lb_common::table::TABLE_WAYS as usize;
    let total = ways + 4_000;
    assert!(total < 64_000, "a port each");
    let conns: Vec<PeerConnection> = (0..total)
        .map(|i| connection(1024 + i as u16, 1024 + i as u16))
        .collect();
    // A quarter more than they are sized for still finds room: two choices and a move.
    let fits = held + held / 4;
    peers
        .install(&conns[..fits])
        .expect("1.25 times agent.max_flows connections: every one finds a way");
    assert_eq!(peers.len(), fits);
    let err = peers
        .install(&conns[fits..])
        .expect_err("more than the tables have ways");
    let text = format!("{err}");
    assert!(text.contains("found both their buckets full"), "{text}");
    assert!(peers.len() <= ways, "{} of {ways} ways", peers.len());
    let kept = conns
        .iter()
        .filter(|c| peers.get(&c.client, &c.reply) == Some((c.flow, c.nat)))
        .count();
    assert_eq!(
        kept,
        peers.len(),
        "each flow written is whole, with its reverse entry"
    );
    assert!(
        conns[..fits]
            .iter()
            .all(|c| peers.get(&c.client, &c.reply) == Some((c.flow, c.nat))),
        "the first ones stay, moved or not"
    );
    let keys: Vec<_> = conns.iter().map(|c| (c.client, c.reply)).collect();
    peers.remove(&keys);
    assert!(peers.is_empty());
}

/// Runs `lb_xdp` once on `frame`; its XDP action.
fn run(dp: &mut BpfDataplane, frame: &[u8]) -> u32 {
    let mut out = vec![0u8; frame.len() + 256];
    dp.program_mut()
        .expect("lb_xdp")
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        })
        .expect("BPF_PROG_TEST_RUN")
        .return_value
}

#[tokio::test]
async fn a_connection_reports_itself_once_and_the_nat_scan_finds_it() {
    let mut dp = cluster_dataplane();
    dp.set_interface_mac(LB_MAC).expect("LB_CONFIG");
    let vip = SocketAddr::new(ip(10, 9, 0, 1), 80);
    let backend = SocketAddr::new(ip(10, 9, 2, 1), 8080);
    let snat = ip(10, 9, 1, 2);
    let service = DesiredService {
        name: "nat".into(),
        vip,
        proto: IPPROTO_TCP,
        tunnel: None,
        nat: Some(NatSpec {
            snat_ips: vec![snat],
            ports: 20_000..=29_999,
            source_rate: 0,
            source_burst: 1,
        }),
        backends: vec![DesiredBackend {
            addr: backend,
            weight: 1,
            mac: Some(BACKEND_MAC),
            role: Role::Active,
        }],
        maglev_size: None,
    };
    let mut publisher = Publisher::default();
    publisher.apply(&[service], &mut dp).expect("publishing");
    let mut events = dp.take_conn_events().expect("the connection events");
    let reader = dp.table_reader().expect("a table reader");
    let since = nat_clock();

    let client = ip(192, 0, 2, 7);
    let to_vip = |flags| {
        Frame::tcp(client, 40_000, vip.ip(), 80, flags)
            .macs(CLIENT_MAC, LB_MAC)
            .bytes()
    };
    assert_eq!(run(&mut dp, &to_vip(TCP_SYN)), 3, "SYN: XDP_TX");
    let seen = reader.nat_seen_since(since).expect("scanning LB_NAT");
    assert_eq!(seen.len(), 1, "the SYN's reverse entry: {seen:?}");
    let (reply, _) = seen[0];
    let nat_port = u16::from_be(reply.dport);
    assert!((20_000..=29_999).contains(&nat_port));
    assert!(
        events.try_batch().is_empty(),
        "no event before the handshake"
    );

    let from_backend = |flags| {
        Frame::tcp(backend.ip(), 8080, snat, nat_port, flags)
            .macs(BACKEND_MAC, LB_MAC)
            .bytes()
    };
    assert_eq!(run(&mut dp, &from_backend(TCP_SYN | TCP_ACK)), 3);
    assert_eq!(run(&mut dp, &to_vip(TCP_ACK)), 3, "the ACK establishes");
    assert_eq!(run(&mut dp, &to_vip(TCP_ACK)), 3, "data: no event");
    let got = events.try_batch();
    assert_eq!(got.len(), 1, "{got:?}");
    let e = got[0];
    assert_eq!(e.kind, CONN_ESTABLISHED);
    let want_client: FlowKey = flow_key(client, 40_000, vip.ip(), 80, IPPROTO_TCP);
    assert_eq!(e.client, want_client);
    assert_eq!(e.reply, reply);
    assert_eq!(e.nat.state & NAT_S_ACKED, NAT_S_ACKED);

    let later = nat_clock().wrapping_add(2);
    assert!(
        reader.nat_seen_since(later).expect("scanning").is_empty(),
        "nothing seen after now"
    );
}

#[test]
fn a_restart_adopts_the_peer_tables() {
    let fs = PrivateBpffs::mount("peers").expect("a private bpffs");
    let pins = PinDir::prepare(&fs.pins().join("lb")).expect("a pin directory");
    let dir = pins.path().to_path_buf();
    let mut first =
        BpfDataplane::load_sized(None, Some(pins), cluster_sizes()).expect("loading (root?)");
    let a = connection(40_000, 20_001);
    first
        .take_peer_tables()
        .expect("the peer tables")
        .install(&[a])
        .expect("install");

    let maps = ADOPTED_MAPS
        .iter()
        .map(|&name| {
            let map = MapData::from_pin(dir.join(name))
                .unwrap_or_else(|e| panic!("opening pinned {name}: {e}"));
            (name, map)
        })
        .collect();
    let adopted = AdoptedMaps {
        maps,
        ..AdoptedMaps::default()
    };
    let mut second =
        BpfDataplane::load_sized(Some(&adopted), None, cluster_sizes()).expect("adopting");
    drop(first);
    let peers = second.take_peer_tables().expect("the peer tables");
    assert_eq!(
        peers.get(&a.client, &a.reply),
        Some((a.flow, a.nat)),
        "the connection another node made is still installed"
    );
}
