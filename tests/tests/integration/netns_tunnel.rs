//! Tunnel forwarding end to end (docs/tunnel.md): three backends on subnets of their own
//! behind a router (`lb_tests::net::tunnel_bed`), each decapsulating with `lb-agent decap
//! attach`. One ipip service (weights 1, 2, 1) and one gue service on the same VIP, and
//! the same pair on the IPv6 VIP (IPv6-in-IPv6, GUE over IPv6):
//!
//! - new connections spread by weight, every one answered, in both families;
//! - the backend sees the client's own address (not the balancer's);
//! - a 4 MiB download through the gue service arrives intact (replies go straight
//!   from the backend to the client), and a 2 MiB upload too: its full-size segments no
//!   longer fit once encapsulated, so the balancer answers "fragmentation needed"
//!   (`tx_icmp_too_big`) and the client's path MTU discovery shrinks them; the same over
//!   IPv6 (ICMPv6 packet-too-big);
//! - a backend whose server is killed is taken out by its probe within the probe's
//!   bound, and new connections all go to the others;
//! - a server whose tunnel breaks (`lb_decap` detached) is taken out by the icmp probe,
//!   which travels through the tunnel to the VIP, though its server still answers;
//!   back in once it decapsulates again;
//! - `lb-agent decap attach` replaces its own program, refuses the balancer's;
//!   `lb-agent decap detach` removes it.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{
        api::{self, Api},
        bpffs::PrivateBpffs,
        daemon::{AgentConfig, Proto, Service, locate_binary},
    },
    net::{
        pmtu::{self, TransferServer},
        topology::{Forwarding, HOST_IF},
        tunnel_bed::{BACKENDS, CLIENT, CLIENT6, TunnelBed, VIP, VIP6},
    },
    scenario::health::{
        HealthServers, MARGIN, Probe, ProbeKind, wait_all_probed_up, wait_event, with_health,
    },
    traffic::{
        clients::{EchoConn, tcp_names},
        pacer::wall_now,
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const WEB_PORT: u16 = 80;
const BULK_PORT: u16 = 8080;
const WEIGHTS: [u32; 3] = [1, 2, 1];
/// Connections for the weight check: enough for ±25 % (relative) on a quarter share.
const CONNECTIONS: usize = 400;
const TRAFFIC_LIMIT: Duration = Duration::from_secs(20);
const DOWNLOAD: usize = 4 << 20;
const UPLOAD: usize = 2 << 20;
const TRANSFER_LIMIT: Duration = Duration::from_secs(30);
const FIRST_VERDICTS: Duration = Duration::from_secs(20);
const PROBE_INTERVAL: Duration = Duration::from_millis(500);
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// How long the agent may take to show a counter that moved.
const METRICS_WAIT: Duration = Duration::from_secs(10);

fn metric(api: &Api, counter: &str) -> f64 {
    let text = api.metrics().expect("GET /metrics");
    api::counter(&text, counter).unwrap_or_else(|| panic!("{counter} in the metrics"))
}

/// Waits until `counter` reaches `at_least`; returns its last value.
fn metric_reaching(api: &Api, counter: &str, at_least: f64) -> f64 {
    let deadline = Instant::now() + METRICS_WAIT;
    loop {
        let v = metric(api, counter);
        if v >= at_least || Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `lb-agent decap ARGS --interface eth0` in `ns`: its exit status and output.
fn decap(ns: &lb_tests::net::netns::NetNs, binary: &Path, action: &str) -> (bool, String) {
    let out = ns
        .run(|| {
            std::process::Command::new(binary)
                .args(["decap", action, "--interface", HOST_IF])
                .output()
        })
        .expect("entering the namespace")
        .expect("running lb-agent decap");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs `lb-agent decap attach --interface eth0` in `ns` and checks it succeeded.
fn decap_attach(ns: &lb_tests::net::netns::NetNs, binary: &Path) {
    let (ok, text) = decap(ns, binary, "attach");
    assert!(ok, "lb-agent decap attach failed: {text}");
}

/// The peers of the established TCP connections to `port` in `ns` (`ss`).
fn peers(ns: &lb_tests::net::netns::NetNs, port: u16) -> String {
    lb_tests::util::cmd::run(
        "ip",
        &[
            "netns",
            "exec",
            ns.name(),
            "ss",
            "-Htn",
            "state",
            "established",
            &format!("( sport = :{port} )"),
        ],
    )
    .unwrap_or_else(|e| format!("ss failed: {e}"))
}

#[test]
fn backends_behind_a_router_serve_through_ipip_and_gue() {
    let bed = TunnelBed::build().expect("building the tunnel network");
    let binary = locate_binary("lb-agent").expect("finding lb-agent");
    for b in &bed.backends {
        decap_attach(b, &binary);
    }
    // Attaching again replaces the program (after an address change, say).
    decap_attach(&bed.backends[0], &binary);
    let hosts: BTreeMap<String, _> = BACKENDS
        .iter()
        .zip(&bed.backends)
        .map(|(n, ns)| ((*n).to_owned(), ns.clone()))
        .collect();
    let mut servers = HealthServers::start_on(
        bed.dir(),
        Path::new(TESTSERVER),
        hosts,
        vec!["--tcp".into(), WEB_PORT.to_string()],
        &BACKENDS,
    )
    .expect("starting lb-testserver on t1..t3");
    let _bulk: Vec<TransferServer> = bed
        .backends
        .iter()
        .flat_map(|ns| [IpAddr::V4(VIP), IpAddr::V6(VIP6)].map(|vip| (ns, vip)))
        .map(|(ns, vip)| {
            TransferServer::start(ns, SocketAddr::new(vip, BULK_PORT))
                .expect("starting a transfer server")
        })
        .collect();

    let probe = Probe::new("tcp", ProbeKind::Tcp, PROBE_INTERVAL, PROBE_TIMEOUT, 1, 1);
    let web = Service {
        name: "web".into(),
        vip: SocketAddr::new(IpAddr::V4(VIP), WEB_PORT),
        protocol: Proto::Tcp,
        forwarding: Forwarding::Ipip,
        snat_ip: None,
        snat_ports: None,
        servers: (0..3)
            .map(|i| (bed.backend_addr(i, WEB_PORT), WEIGHTS[i]))
            .collect(),
        extra: Vec::new(),
    };
    let web6 = Service {
        name: "web6".into(),
        vip: SocketAddr::new(IpAddr::V6(VIP6), WEB_PORT),
        servers: (0..3)
            .map(|i| (SocketAddr::new(bed.backend_ip6(i), WEB_PORT), WEIGHTS[i]))
            .collect(),
        ..web.clone()
    };
    // The icmp probe of a tunnel service travels through the tunnel to the VIP.
    let echo = Probe::new(
        "tunnel",
        ProbeKind::Icmp,
        PROBE_INTERVAL,
        PROBE_TIMEOUT,
        1,
        1,
    );
    let probes = [probe.clone(), echo.clone()];
    let web = with_health(web, &["max_fails = 0"], &probes);
    let web6 = with_health(web6, &["max_fails = 0"], &probes);
    let bulk = Service {
        name: "bulk".into(),
        vip: SocketAddr::new(IpAddr::V4(VIP), BULK_PORT),
        protocol: Proto::Tcp,
        forwarding: Forwarding::Gue,
        snat_ip: None,
        snat_ports: None,
        servers: (0..2)
            .map(|i| (bed.backend_addr(i, BULK_PORT), 1))
            .collect(),
        extra: Vec::new(),
    };
    // GUE's echo probe travels inside UDP to port 6080.
    let bulk = with_health(bulk, &["max_fails = 0"], std::slice::from_ref(&echo));
    // A bpffs that outlives the agent: `lb_xdp` is attached with its tail call into
    // `lb_xdp_full`, so both programs' encapsulation is on the path.
    let bpffs = PrivateBpffs::mount("tunnel").expect("mounting a bpffs");
    let bulk6 = Service {
        name: "bulk6".into(),
        vip: SocketAddr::new(IpAddr::V6(VIP6), BULK_PORT),
        servers: (0..2)
            .map(|i| (SocketAddr::new(bed.backend_ip6(i), BULK_PORT), 1))
            .collect(),
        ..bulk.clone()
    };
    let mut config = AgentConfig::new(vec![web, bulk, web6, bulk6]);
    config.pin_path = bpffs.pins().display().to_string();
    let agent = bed
        .start_agent(&binary, &config, &[])
        .expect("starting lb-agent");
    // The balancer's own interface runs lb_xdp: decap refuses to take its place.
    let (ok, text) = decap(&bed.lb, &binary, "attach");
    assert!(
        !ok && text.contains("lb_xdp"),
        "decap attach over the balancer's program must be refused, naming it: {text}"
    );
    let api = Api::new(&bed.lb);
    let web_addrs: Vec<SocketAddr> = (0..3).map(|i| bed.backend_addr(i, WEB_PORT)).collect();
    wait_all_probed_up(&api, "web", &web_addrs, FIRST_VERDICTS)
        .expect("t1..t3 up after their first probes");
    let web6_addrs: Vec<SocketAddr> = (0..3)
        .map(|i| SocketAddr::new(bed.backend_ip6(i), WEB_PORT))
        .collect();
    wait_all_probed_up(&api, "web6", &web6_addrs, FIRST_VERDICTS)
        .expect("t1..t3 up over IPv6 after their first probes");
    for (service, addrs) in [
        (
            "bulk",
            [
                bed.backend_addr(0, BULK_PORT),
                bed.backend_addr(1, BULK_PORT),
            ],
        ),
        (
            "bulk6",
            [0, 1].map(|i| SocketAddr::new(bed.backend_ip6(i), BULK_PORT)),
        ),
    ] {
        wait_all_probed_up(&api, service, &addrs, FIRST_VERDICTS)
            .unwrap_or_else(|e| panic!("{service}: echo through gue: {e}"));
    }

    // Weights, through ipip.
    let vip = SocketAddr::new(IpAddr::V4(VIP), WEB_PORT);
    let tally = tcp_names(
        &bed.client,
        IpAddr::V4(CLIENT),
        40_000,
        vip,
        CONNECTIONS,
        TRAFFIC_LIMIT,
    )
    .expect("client traffic");
    let expected: Vec<(&str, u32)> = BACKENDS.iter().copied().zip(WEIGHTS).collect();
    if let Err(e) = tally.check_shares(&expected, 0.25) {
        panic!("ipip: shares by weight\n{e}\n{}", agent.tail(20));
    }
    println!("ipip weights:\n{}", tally.table(&expected));
    // The same through IPv6-in-IPv6.
    let vip6 = SocketAddr::new(IpAddr::V6(VIP6), WEB_PORT);
    let tally6 = tcp_names(
        &bed.client,
        IpAddr::V6(CLIENT6),
        40_000,
        vip6,
        CONNECTIONS,
        TRAFFIC_LIMIT,
    )
    .expect("client traffic over IPv6");
    if let Err(e) = tally6.check_shares(&expected, 0.25) {
        panic!("ip6ip6: shares by weight\n{e}\n{}", agent.tail(20));
    }
    println!("ip6ip6 weights:\n{}", tally6.table(&expected));
    let tunnelled = metric_reaching(&api, "tx_tunnel", CONNECTIONS as f64 * 3.0);
    assert!(
        tunnelled >= CONNECTIONS as f64 * 3.0,
        "tx_tunnel {tunnelled}: every client packet is encapsulated"
    );

    // The backend sees the client's address.
    let conn = EchoConn::connect(&bed.client, IpAddr::V4(CLIENT), vip)
        .expect("entering the client's namespace")
        .expect("connecting to the VIP");
    let local = conn.local_addr().expect("the client's address");
    let at = BACKENDS
        .iter()
        .position(|b| *b == conn.backend())
        .expect("a known backend answered");
    let seen = peers(&bed.backends[at], WEB_PORT);
    // `ss` writes a dual-stack socket's peer as `[::ffff:10.93.0.10]:PORT`.
    let ip = local.ip().to_string();
    let port = format!(":{}", local.port());
    assert!(
        seen.lines()
            .filter_map(|l| l.split_whitespace().last())
            .any(|peer| peer.trim_start_matches("[::ffff:").starts_with(&ip)
                && peer.ends_with(&port)),
        "{} should see the client {local} as the peer of its connection; ss says:\n{seen}",
        conn.backend()
    );
    drop(conn);

    // A download through gue (the data returns directly), then an upload whose
    // full-size segments need the balancer's "fragmentation needed".
    let bulk_vip = SocketAddr::new(IpAddr::V4(VIP), BULK_PORT);
    let started = Instant::now();
    let got = pmtu::download(&bed.client, bulk_vip, DOWNLOAD, TRANSFER_LIMIT)
        .expect("downloading through gue");
    assert_eq!(
        got, DOWNLOAD,
        "the 4 MiB download through gue arrives intact"
    );
    let took = started.elapsed();
    let bulk6_vip = SocketAddr::new(IpAddr::V6(VIP6), BULK_PORT);
    let got = pmtu::download(&bed.client, bulk6_vip, DOWNLOAD, TRANSFER_LIMIT)
        .expect("downloading through gue over IPv6");
    assert_eq!(
        got, DOWNLOAD,
        "the 4 MiB download through gue over IPv6 arrives intact"
    );
    let too_big = metric(&api, "tx_icmp_too_big");
    let answer =
        pmtu::upload(&bed.client, bulk_vip, UPLOAD, TRANSFER_LIMIT).expect("uploading through gue");
    assert_eq!(
        answer,
        format!("OK {UPLOAD}"),
        "the 2 MiB upload arrives intact"
    );
    let too_big_after = metric_reaching(&api, "tx_icmp_too_big", too_big + 1.0);
    assert!(
        too_big_after > too_big,
        "the upload's full-size segments were answered with fragmentation needed \
         (tx_icmp_too_big {too_big} -> {too_big_after})"
    );
    println!(
        "gue: 4 MiB download in {took:.2?}; upload needed {} ICMP answers",
        too_big_after - too_big
    );
    // Over IPv6 the answer is ICMPv6 packet-too-big (its checksum covers a
    // pseudo-header: a wrong one and the client's kernel ignores it, the upload stalls).
    let answer = pmtu::upload(&bed.client, bulk6_vip, UPLOAD, TRANSFER_LIMIT)
        .expect("uploading through gue over IPv6");
    assert_eq!(
        answer,
        format!("OK {UPLOAD}"),
        "the 2 MiB upload over IPv6 arrives intact"
    );
    let too_big6 = metric_reaching(&api, "tx_icmp_too_big", too_big_after + 1.0);
    assert!(
        too_big6 > too_big_after,
        "the IPv6 upload's full-size segments were answered with packet-too-big \
         (tx_icmp_too_big {too_big_after} -> {too_big6})"
    );
    println!(
        "gue over IPv6: upload needed {} ICMPv6 answers",
        too_big6 - too_big_after
    );

    // A backend dies: its probe takes it out, the others serve every new connection.
    let dead = bed.backend_addr(2, WEB_PORT);
    let killed = servers.kill("t3").expect("killing t3's server");
    let bound = probe.detection_bound() + MARGIN;
    let down = wait_event(&api, dead, "unhealthy", killed, bound + PROBE_INTERVAL)
        .unwrap_or_else(|e| panic!("t3 never left after its server died: {e}"));
    println!(
        "t3 out {:.2} s after its server died (bound {bound:?})",
        lb_tests::scenario::health::event_time(&down) - killed
    );
    let after = tcp_names(
        &bed.client,
        IpAddr::V4(CLIENT),
        41_000,
        vip,
        CONNECTIONS / 2,
        TRAFFIC_LIMIT,
    )
    .expect("client traffic after the kill");
    let expected: Vec<(&str, u32)> = vec![("t1", 1), ("t2", 2)];
    if let Err(e) = after.check_shares(&expected, 0.25) {
        panic!("after t3 left\n{e}");
    }
    assert!(wall_now() > killed);

    // A broken tunnel: t2 stops decapsulating. Its server still answers direct probes,
    // but the echo through the tunnel fails and takes it out; decapsulating again
    // brings it back.
    let t2 = bed.backend_addr(1, WEB_PORT);
    let broken = wall_now();
    let (ok, text) = decap(&bed.backends[1], &binary, "detach");
    assert!(ok, "decap detach on t2: {text}");
    assert!(
        !text.contains("WARN"),
        "decap detach has nothing to warn about (lb_decap pins nothing): {text}"
    );
    let bound = echo.detection_bound() + MARGIN;
    let out = wait_event(&api, t2, "unhealthy", broken, bound + PROBE_INTERVAL)
        .unwrap_or_else(|e| panic!("t2 stayed in with its tunnel broken: {e}"));
    let (_, probes) =
        lb_tests::scenario::health::server_health(&api, "web", t2).expect("t2's health");
    println!(
        "t2 out {:.2} s after its tunnel broke (bound {bound:?}); probes: {probes:?}",
        lb_tests::scenario::health::event_time(&out) - broken
    );
    let mended = wall_now();
    decap_attach(&bed.backends[1], &binary);
    wait_event(
        &api,
        t2,
        "up",
        mended,
        echo.recovery_bound() + MARGIN + PROBE_INTERVAL,
    )
    .unwrap_or_else(|e| panic!("t2 did not return once decapsulating again: {e}"));
    let counters = ["drop_tunnel", "drop_no_backend"].map(|c| (c, metric(&api, c)));
    assert_eq!(
        counters,
        [("drop_tunnel", 0.0), ("drop_no_backend", 0.0)],
        "no packet was dropped"
    );
    assert!(
        !agent
            .lines()
            .iter()
            .any(|l| l.contains("lb_xdp_full, without the hot-path split")),
        "the agent attached lb_xdp with its tail call (a bpffs outlives it)"
    );
    agent
        .stop(Duration::from_secs(5))
        .expect("stopping lb-agent");

    // The decapsulator comes off with `decap detach`, and only it.
    let (ok, text) = decap(&bed.backends[0], &binary, "detach");
    assert!(ok, "decap detach: {text}");
    let link = bed.backends[0]
        .ip(&["link", "show", HOST_IF])
        .expect("ip link show");
    assert!(!link.contains("xdp"), "t1's eth0 still runs XDP:\n{link}");
}
