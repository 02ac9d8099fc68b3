//! Transfers through the balancer between hosts that keep a real host's offloads
//! (`lb_tests::net::link::Offloads`): TSO, GSO and TX checksum offload on the client,
//! the lb and the backends, GRO on the lb's interface. Each bed holds every service of
//! its kind: nat and dsr (`topology`), ipip and gue over IPv4 and IPv6 (`tunnel_bed`,
//! backends behind a router); through each a 4 MiB upload and a 4 MiB download, each complete and
//! byte-exact within [`TRANSFER_LIMIT`]:
//!
//! - hosts with NICs (`HostDefaults`: the switch is a wire, which carries wire-sized
//!   frames with complete checksums), in native and in generic mode;
//! - an lb behind a veth whose peer hands over what senders on the same host built
//!   (`VethPeers`): in generic mode TSO packets of up to 64 KiB, whole, where the
//!   tunnel services' merged packets go out through `lb_tunnel_gso` on the tc ingress
//!   (docs/tunnel.md, "Offloads"); in native mode wire-sized frames (the peer loses its
//!   segmentation offloads while the lb's end runs a native program) whose checksums
//!   may be partial, which the program completes (`csum_completed` moves in this bed
//!   only; docs/internals/fast-path.md, "Partial checksums");
//! - the same in native mode with the peer's TX checksum offload off (`ethtool -K p-lb
//!   tx off`), so the host completes checksums and segments before the peer hands
//!   frames over.
//!
//! Generic mode on a NIC sees no merged segments: the kernel skips GRO on an interface
//! with a generic XDP program.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{
        api::{self, Api},
        daemon::{AgentConfig, Proto, START_TIMEOUT, Service, locate_binary},
    },
    net::{
        link::{self, Offloads},
        netns::NetNs,
        pmtu::{self, TransferServer},
        topology::{Forwarding, HOST_IF, Topology},
        tunnel_bed::{TunnelBed, VIP, VIP6},
    },
    scenario::balance,
};

const TRANSFER: usize = 4 << 20;
/// A 4 MiB transfer over veth takes well under a second; a stalled one never ends.
const TRANSFER_LIMIT: Duration = Duration::from_secs(20);
const NAT_PORT: u16 = 8080;
const DSR_PORT: u16 = 8081;
const IPIP_PORT: u16 = 8082;
const GUE_PORT: u16 = 8083;

fn counter(api: &Api, name: &str) -> f64 {
    let text = api.metrics().expect("GET /metrics");
    api::counter(&text, name).unwrap_or_else(|| panic!("{name} in the metrics"))
}

/// Uploads and downloads [`TRANSFER`] bytes through `vip` from `client`; panics naming
/// `what` unless both arrive complete and intact.
fn transfers(client: &NetNs, vip: SocketAddr, api: &Api, what: &str) {
    let before = counter(api, "tx_icmp_too_big");
    let started = Instant::now();
    let answer = pmtu::upload(client, vip, TRANSFER, TRANSFER_LIMIT)
        .unwrap_or_else(|e| panic!("{what}: uploading: {e}"));
    let up = started.elapsed();
    let too_big = counter(api, "tx_icmp_too_big") - before;
    assert_eq!(
        answer,
        format!("OK {TRANSFER}"),
        "{what}: the 4 MiB upload arrives intact within {TRANSFER_LIMIT:?} \
         ({too_big} too-big answers)"
    );
    let down = download(client, vip, what);
    println!("{what}: 4 MiB up in {up:.2?} ({too_big} too-big answers), down in {down:.2?}");
}

/// Downloads [`TRANSFER`] bytes through `vip`; panics unless they arrive intact in time.
fn download(client: &NetNs, vip: SocketAddr, what: &str) -> Duration {
    let started = Instant::now();
    let got = pmtu::download(client, vip, TRANSFER, TRANSFER_LIMIT)
        .unwrap_or_else(|e| panic!("{what}: downloading: {e}"));
    assert_eq!(
        got, TRANSFER,
        "{what}: the 4 MiB download arrives intact within {TRANSFER_LIMIT:?}"
    );
    started.elapsed()
}

/// What the lb's veth peer keeps of its TX checksum offload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerTx {
    /// As the bed's offloads leave it.
    AsBuilt,
    /// Off on the switch's port `p-lb`: the host completes every checksum.
    Off,
}

/// Turns the TX checksum offload of the lb's peer, `p-lb` in `switch`, off for `PeerTx::Off`.
fn set_peer_tx(switch: &NetNs, peer_tx: PeerTx) {
    if peer_tx == PeerTx::Off {
        link::set_tx_checksum(switch, "p-lb", false).expect("ethtool -K p-lb tx off");
    }
}

/// Checks the packets the program completed a partial checksum of (`csum_completed`):
/// some exactly in native mode behind a veth peer that keeps its TX checksum offload,
/// the only bed whose frames reach the program with partial checksums and leave it
/// without the kernel's help.
fn check_completions(api: &Api, offloads: Offloads, xdp_mode: &str, peer_tx: PeerTx) {
    let completed = counter(api, "csum_completed");
    let partial = offloads == Offloads::VethPeers && peer_tx == PeerTx::AsBuilt;
    if xdp_mode == "native" && partial {
        assert!(
            completed > 0.0,
            "native mode behind veth peers completes partial checksums"
        );
    } else {
        assert_eq!(
            completed, 0.0,
            "{xdp_mode} ({offloads:?}, peer TX {peer_tx:?}): no checksum to complete"
        );
    }
}

/// nat to `b1` and dsr to `b2` on the topology's VIP.
fn nat_and_dsr(offloads: Offloads, xdp_mode: &str, peer_tx: PeerTx) {
    let topo = Topology::builder()
        .backends(2)
        .forwarding(Forwarding::Dsr)
        .offloads(offloads)
        .build()
        .expect("building the topology");
    set_peer_tx(topo.switch(), peer_tx);
    let (b1, b2) = (&topo.backends()[0], &topo.backends()[1]);
    let vip = IpAddr::V4(topo.vip4());
    let _servers = [
        TransferServer::start(&b1.ns, SocketAddr::new(IpAddr::V4(b1.ipv4), NAT_PORT)),
        TransferServer::start(&b2.ns, SocketAddr::new(vip, DSR_PORT)),
    ]
    .map(|s| s.expect("starting a transfer server"));
    let dsr = Service::on(
        &topo,
        "dsr",
        Proto::Tcp,
        false,
        DSR_PORT,
        &[(b2, 1)],
        DSR_PORT,
    );
    let nat = Service {
        name: "nat".into(),
        forwarding: Forwarding::Nat,
        snat_ip: Some(IpAddr::V4(topo.lb().ipv4)),
        snat_ports: Some("20000-29999".into()),
        servers: vec![(SocketAddr::new(IpAddr::V4(b1.ipv4), NAT_PORT), 1)],
        vip: SocketAddr::new(vip, NAT_PORT),
        ..dsr.clone()
    };
    let _agent =
        balance::start_agent(&topo, vec![nat, dsr], Some(xdp_mode)).expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    for (name, port) in [("nat", NAT_PORT), ("dsr", DSR_PORT)] {
        transfers(
            &topo.client().ns,
            SocketAddr::new(vip, port),
            &api,
            &format!("{name} {xdp_mode} ({offloads:?}, peer TX {peer_tx:?})"),
        );
    }
    check_completions(&api, offloads, xdp_mode, peer_tx);
}

/// Runs `lb-agent decap attach` on a backend of the tunnel bed.
fn decap_attach(ns: &NetNs, binary: &Path) {
    let out = ns
        .run(|| {
            std::process::Command::new(binary)
                .args(["decap", "attach", "--interface", HOST_IF])
                .output()
        })
        .expect("entering the namespace")
        .expect("running lb-agent decap attach");
    assert!(
        out.status.success(),
        "lb-agent decap attach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// ipip to `t1` and gue to `t2`, behind the router.
fn ipip_and_gue(offloads: Offloads, xdp_mode: &str, peer_tx: PeerTx) {
    let bed = TunnelBed::build_with(offloads).expect("building the tunnel bed");
    set_peer_tx(bed.switch(), peer_tx);
    let binary = locate_binary("lb-agent").expect("finding lb-agent");
    let mut services = Vec::new();
    let mut servers = Vec::new();
    // Over both families: ipip and ip6ip6 to t1, gue over IPv4 and over IPv6 to t2.
    let tunnels = [
        (0, "ipip", Forwarding::Ipip, IPIP_PORT),
        (1, "gue", Forwarding::Gue, GUE_PORT),
    ];
    for (i, _, _, _) in tunnels {
        decap_attach(&bed.backends[i], &binary);
    }
    for ((i, name, forwarding, port), v6) in
        tunnels.into_iter().flat_map(|t| [(t, false), (t, true)])
    {
        let (vip, backend, name) = if v6 {
            (IpAddr::V6(VIP6), bed.backend_ip6(i), format!("{name}6"))
        } else {
            (IpAddr::V4(VIP), bed.backend_ip(i), name.to_owned())
        };
        servers.push(
            TransferServer::start(&bed.backends[i], SocketAddr::new(vip, port))
                .expect("starting a transfer server"),
        );
        services.push(Service {
            name,
            vip: SocketAddr::new(vip, port),
            protocol: Proto::Tcp,
            forwarding,
            snat_ip: None,
            snat_ports: None,
            servers: vec![(SocketAddr::new(backend, port), 1)],
            extra: Vec::new(),
        });
    }
    let agent = bed
        .start_agent(
            &binary,
            &AgentConfig::new(services.clone()),
            &["--xdp-mode", xdp_mode],
        )
        .expect("starting lb-agent");
    let api = Api::new(&bed.lb);
    if xdp_mode == "generic" {
        agent
            .wait_for_line(0, "lb_tunnel_gso attached", START_TIMEOUT)
            .expect("lb-agent puts lb_tunnel_gso on the tc ingress in generic mode");
    }
    for service in &services {
        let what = format!(
            "{} {xdp_mode} ({offloads:?}, peer TX {peer_tx:?})",
            service.name
        );
        let dropped = counter(&api, "drop_tunnel");
        transfers(&bed.client, service.vip, &api, &what);
        assert_eq!(
            counter(&api, "drop_tunnel"),
            dropped,
            "{what}: no packet left unencapsulated"
        );
    }
    check_completions(&api, offloads, xdp_mode, peer_tx);
}

#[test]
fn nat_and_dsr_native() {
    nat_and_dsr(Offloads::HostDefaults, "native", PeerTx::AsBuilt);
}

#[test]
fn nat_and_dsr_generic() {
    nat_and_dsr(Offloads::HostDefaults, "generic", PeerTx::AsBuilt);
}

#[test]
fn ipip_and_gue_native() {
    ipip_and_gue(Offloads::HostDefaults, "native", PeerTx::AsBuilt);
}

#[test]
fn ipip_and_gue_generic() {
    ipip_and_gue(Offloads::HostDefaults, "generic", PeerTx::AsBuilt);
}

#[test]
fn nat_and_dsr_generic_behind_veth_peers() {
    nat_and_dsr(Offloads::VethPeers, "generic", PeerTx::AsBuilt);
}

#[test]
fn ipip_and_gue_generic_behind_veth_peers() {
    ipip_and_gue(Offloads::VethPeers, "generic", PeerTx::AsBuilt);
}

#[test]
fn nat_and_dsr_native_behind_veth_peers() {
    nat_and_dsr(Offloads::VethPeers, "native", PeerTx::AsBuilt);
}

#[test]
fn ipip_and_gue_native_behind_veth_peers() {
    ipip_and_gue(Offloads::VethPeers, "native", PeerTx::AsBuilt);
}

#[test]
fn nat_and_dsr_native_behind_veth_peers_without_their_tx_offload() {
    nat_and_dsr(Offloads::VethPeers, "native", PeerTx::Off);
}

#[test]
fn ipip_and_gue_native_behind_veth_peers_without_their_tx_offload() {
    ipip_and_gue(Offloads::VethPeers, "native", PeerTx::Off);
}
