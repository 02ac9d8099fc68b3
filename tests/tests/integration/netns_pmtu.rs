//! Path-MTU discovery through a nat service: the client and the
//! backend each sit behind a router whose route toward them allows 1280 bytes, while
//! both announce a 1460-byte MSS (see `lb_tests::net::pmtu`).
//!
//! - download: the backend's full-size segments, translated by lb toward the client,
//!   hit the router's small route; its "fragmentation needed" / "packet too big" goes
//!   to the VIP and only lb's translation brings it to the backend;
//! - upload: the client's segments, translated toward the backend, hit the other small
//!   route; the error goes to lb's snat address and only lb's translation brings it to
//!   the client.
//!
//! Each transfer must complete intact within its limit, the router must have sent the
//! errors (so the full-size segments really were dropped: without the translation the
//! sender keeps retransmitting them and the transfer stalls), and lb's `tx_icmp_nat`
//! must have moved. IPv4 and IPv6.

use std::{
    net::SocketAddr,
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{
        api::{self, Api},
        daemon::locate_binary,
    },
    net::pmtu::{self, PORT, Plan, PmtuNet, TransferServer},
};

const DOWNLOAD: usize = 4 << 20;
const UPLOAD: usize = 2 << 20;
/// A transfer of a few MiB over veths takes well under a second; a stalled one never
/// ends. Generous for a loaded machine.
const LIMIT: Duration = Duration::from_secs(30);
/// How long the agent may take to show a counter that moved.
const METRICS_WAIT: Duration = Duration::from_secs(10);

fn tx_icmp_nat(api: &Api) -> f64 {
    let text = api.metrics().expect("GET /metrics");
    api::counter(&text, "tx_icmp_nat").expect("tx_icmp_nat in the metrics")
}

/// Waits until `tx_icmp_nat` exceeds `before`; returns its value.
fn wait_tx_icmp_nat_above(api: &Api, before: f64, what: &str) -> f64 {
    let deadline = Instant::now() + METRICS_WAIT;
    loop {
        let now = tx_icmp_nat(api);
        if now > before {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: lb's tx_icmp_nat stayed at {now} (no ICMP error translated)"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Which way the bulk data flows.
#[derive(Clone, Copy, Debug)]
enum Direction {
    Download,
    Upload,
}

/// One transfer over a fresh network: a sender that already learnt the small MTU (the
/// other direction's transfer would teach it, and its MSS then stays small) would not
/// need the translation at all.
fn pmtu(ipv6: bool, direction: Direction) {
    let what = format!("{} {direction:?}", if ipv6 { "IPv6" } else { "IPv4" });
    let net = PmtuNet::build(Plan { ipv6 }).expect("building the PMTU network");
    let _server = TransferServer::start(&net.backend, SocketAddr::new(net.plan.backend(), PORT))
        .expect("starting the transfer server");
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let _agent = net.start_agent(&binary).expect("starting lb-agent");
    let api = Api::new(&net.lb);
    let vip = SocketAddr::new(net.plan.vip(), PORT);

    let router_before = pmtu::too_big_sent(&net.router, ipv6).expect("router ICMP counters");
    let tx_before = tx_icmp_nat(&api);
    let started = Instant::now();
    let (bytes, outcome) = match direction {
        Direction::Download => {
            let got = pmtu::download(&net.client, vip, DOWNLOAD, LIMIT).expect("download");
            (DOWNLOAD, format!("{got} of {DOWNLOAD} bytes received"))
        }
        Direction::Upload => {
            let answer = pmtu::upload(&net.client, vip, UPLOAD, LIMIT).expect("upload");
            (UPLOAD, answer)
        }
    };
    let took = started.elapsed();
    let complete = match direction {
        Direction::Download => format!("{DOWNLOAD} of {DOWNLOAD} bytes received"),
        Direction::Upload => format!("OK {UPLOAD}"),
    };
    assert_eq!(outcome, complete, "{what} through nat (after {took:?})");
    let router_after = pmtu::too_big_sent(&net.router, ipv6).expect("router ICMP counters");
    assert!(
        router_after > router_before,
        "{what}: the router reported no small MTU ({router_before} -> {router_after}): \
         the transfer did not cross the small route"
    );
    let tx_after = wait_tx_icmp_nat_above(&api, tx_before, &what);
    eprintln!(
        "{what}: {bytes} bytes in {took:?}; router errors {router_before} -> {router_after}, \
         lb tx_icmp_nat {tx_before} -> {tx_after}"
    );
}

#[test]
fn pmtu_ipv4_download_through_nat() {
    pmtu(false, Direction::Download);
}

#[test]
fn pmtu_ipv4_upload_through_nat() {
    pmtu(false, Direction::Upload);
}

#[test]
fn pmtu_ipv6_download_through_nat() {
    pmtu(true, Direction::Download);
}

#[test]
fn pmtu_ipv6_upload_through_nat() {
    pmtu(true, Direction::Upload);
}
