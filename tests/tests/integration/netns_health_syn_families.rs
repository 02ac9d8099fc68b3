//! The SYN check (`tcp_check = "syn"`) through the real agent, once over IPv4
//! and once over IPv6 (addresses on veth, `nodad`), with ICMP errors. An open port passes;
//! a closed port is refused at once; a port nftables drops times out; a dropped port
//! whose host forges SYN-ACKs and RSTs (wrong acks) times out and its replies count as
//! rejected; a port nftables rejects with an ICMP host unreachable fails at once with
//! the connect probe's reason ("No route to host"), well before its timeout; a port
//! rejected with an ICMP port unreachable is refused as a connect would be; a host that
//! answers every SYN with an ICMP host unreachable quoting a wrong sequence number fails
//! no one: the open server it forges for stays up, the dropped one it forges for times
//! out, and the forgeries are counted. A connect probe (`tcp_check = "connect"`) of the
//! same servers reports the same results. Last, the balancer's own queue drops every
//! SYN: local faults, and the SYN check gives the open server no verdict.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::api,
    net::netns::NetNs,
    scenario::{
        balance::BACKEND_TCP_PORT,
        health::{
            MARGIN, event_time, find_event, local_faults_while_the_queue_drops, secs,
            server_health, syn_packets, wait_event,
        },
        syn_bed::{SynBed, nft_port},
    },
    traffic::syn_forge::{Forgery, SynForger},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const INTERVAL: Duration = Duration::from_secs(1);
/// Long enough that a failure at once and one at the timeout are far apart.
const TIMEOUT: Duration = Duration::from_millis(1500);
/// How long a forger runs at most (the test needs well under this).
const FORGE_LIMIT: Duration = Duration::from_secs(40);

/// The last result of probe `name`.
fn last_of(probes: &[lb_tests::scenario::health::ProbeView], name: &str) -> String {
    probes
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("probe {name} in {probes:?}"))
        .last_result
        .clone()
}

/// Lets `ns` send every ICMP error: by default a host sends about one a second to each
/// destination after a burst of six (`icmp_ratelimit`), so with two probes of one host
/// the SYN check or the connect would miss some and fail at the timeout.
fn unlimited_icmp(ns: &NetNs) {
    for key in ["net.ipv4.icmp_ratelimit", "net.ipv6.icmp.ratelimit"] {
        ns.sysctl(key, "0").expect("lifting the ICMP rate limit");
    }
}

#[test]
fn health_syn_check_over_ipv4_with_icmp_errors() {
    scenario_for(false, 232);
}

#[test]
fn health_syn_check_over_ipv6_with_icmp_errors() {
    scenario_for(true, 233);
}

fn scenario_for(v6: bool, subnet: u8) {
    let family = if v6 { "IPv6" } else { "IPv4" };
    let mut bed = SynBed::start(Path::new(TESTSERVER), 7, v6, subnet, INTERVAL, TIMEOUT);
    let (topo, api, a, probe) = (&bed.topo, &bed.api, &bed.addrs, &bed.probe);
    let text = api.metrics().expect("GET /metrics");
    assert_eq!(
        api::metric(&text, "lb_probe_tcp_syn_check", &[]),
        Some(1.0),
        "the agent runs SYN checks"
    );
    assert!(
        syn_packets(api, "accepted") >= 7.0,
        "{family}: every open port passed on a SYN-ACK"
    );

    let before = |kind| syn_packets(api, kind);
    let (rejected0, icmp_rejected0, icmp_unmatched0, unreachable0) = (
        before("rejected"),
        before("icmp_rejected"),
        before("icmp_unmatched"),
        before("unreachable"),
    );
    let ns = |i: usize| &topo.backends()[i].ns;

    // b1: open, but its host answers every SYN with an ICMP host unreachable quoting a
    // wrong sequence number as well. b2: closed. b3: dropped. b4: dropped, forging
    // SYN-ACKs and RSTs. b5: rejected with ICMP host unreachable. b6: rejected with ICMP
    // port unreachable. b7: dropped, forging ICMP host unreachables with wrong sequence
    // numbers.
    let forge_b1 =
        SynForger::start_with(ns(0), BACKEND_TCP_PORT, FORGE_LIMIT, Forgery::IcmpWrongSeq)
            .expect("ICMP forger in b1");
    let t0 = lb_tests::traffic::pacer::wall_now();
    bed.servers.kill("b2").expect("killing b2's server");
    nft_port(ns(2), BACKEND_TCP_PORT, "drop");
    nft_port(ns(3), BACKEND_TCP_PORT, "drop");
    let forge_b4 =
        SynForger::start_with(ns(3), BACKEND_TCP_PORT, FORGE_LIMIT, Forgery::TcpWrongAck)
            .expect("TCP forger in b4");
    unlimited_icmp(ns(4));
    unlimited_icmp(ns(5));
    nft_port(
        ns(4),
        BACKEND_TCP_PORT,
        "reject with icmpx type host-unreachable",
    );
    nft_port(
        ns(5),
        BACKEND_TCP_PORT,
        "reject with icmpx type port-unreachable",
    );
    nft_port(ns(6), BACKEND_TCP_PORT, "drop");
    let forge_b7 =
        SynForger::start_with(ns(6), BACKEND_TCP_PORT, FORGE_LIMIT, Forgery::IcmpWrongSeq)
            .expect("ICMP forger in b7");
    let changed = lb_tests::traffic::pacer::wall_now();

    let slow = probe.detection_bound() + MARGIN;
    let fast = probe.immediate_bound() + MARGIN;
    let mut lines = Vec::new();
    for (i, what, want, bound) in [
        (1, "closed port", "connection refused", fast),
        (2, "dropped port", "timeout", slow),
        (3, "dropped port, forged SYN-ACK/RST", "timeout", slow),
        (
            4,
            "ICMP host unreachable",
            "connect: No route to host",
            fast,
        ),
        (5, "ICMP port unreachable", "connection refused", fast),
        (6, "dropped port, forged ICMP (wrong seq)", "timeout", slow),
    ] {
        let ev = wait_event(api, a[i], "unhealthy", t0, slow + MARGIN)
            .unwrap_or_else(|e| panic!("{family} {what}: {} should turn unhealthy: {e}", a[i]));
        let took = event_time(&ev) - changed;
        let (state, probes) = server_health(api, "web", a[i]).expect("status");
        assert_eq!(state, "unhealthy", "{family} {what}: {probes:?}");
        let last = last_of(&probes, "port");
        assert!(
            last.strip_prefix("failed: ")
                .is_some_and(|l| l.starts_with(want)),
            "{family} {what}: last result {last:?}, want {want:?}"
        );
        assert!(
            took <= bound.as_secs_f64(),
            "{family} {what}: unhealthy within {bound:?}, took {}",
            secs(took)
        );
        lines.push(format!(
            "{what}: unhealthy after {}, last {last:?}",
            secs(took)
        ));
    }

    // The forgers keep going for a few more rounds: no one comes back, b1 stays up.
    let watch = Instant::now();
    while watch.elapsed() < 3 * INTERVAL {
        std::thread::sleep(Duration::from_millis(200));
    }
    let events = api.events().expect("events");
    for i in [3, 6] {
        assert!(
            find_event(&events, a[i], "up", changed).is_none(),
            "{family}: a forgery must never bring {} back",
            a[i]
        );
    }
    assert!(
        find_event(&events, a[0], "unhealthy", t0).is_none(),
        "{family}: forged ICMP errors must not fail b1"
    );
    let (state, probes) = server_health(api, "web", a[0]).expect("b1's status");
    assert_eq!(state, "up", "{family}: b1 stays up: {probes:?}");
    // Both checks have run since the changes: the same verdicts, the same reasons.
    for (i, target) in a.iter().enumerate() {
        let (_, probes) = server_health(api, "web", *target).expect("status");
        assert_eq!(
            last_of(&probes, "port"),
            last_of(&probes, "connect"),
            "{family} b{}: the SYN check and connect agree",
            i + 1
        );
    }
    let (f1, f4, f7) = (forge_b1.forged(), forge_b4.forged(), forge_b7.forged());
    drop((forge_b1, forge_b4, forge_b7));
    let after = |kind, base| syn_packets(api, kind) - base;
    let rejected = after("rejected", rejected0);
    let icmp_rejected = after("icmp_rejected", icmp_rejected0);
    let icmp_unmatched = after("icmp_unmatched", icmp_unmatched0);
    let unreachable = after("unreachable", unreachable0);
    assert!(
        f1 >= 4 && f4 >= 8 && f7 >= 4,
        "the forgers answered SYNs ({f1}, {f4}, {f7})"
    );
    assert!(
        rejected >= 4.0,
        "{family}: forged SYN-ACK/RSTs rejected: {rejected} of {f4}"
    );
    // b7's forgeries arrive while its probe waits (its port is dropped): rejected. b1's
    // usually arrive after the SYN-ACK settled the probe: unmatched.
    assert!(
        icmp_rejected >= 4.0,
        "{family}: forged ICMP errors for a probe in flight rejected: {icmp_rejected} of {f7}"
    );
    assert!(
        icmp_rejected + icmp_unmatched >= (f1 + f7) as f64 * 0.9,
        "{family}: every forged ICMP error counted ({icmp_rejected} rejected, \
         {icmp_unmatched} unmatched, {} forged)",
        f1 + f7
    );
    assert!(
        unreachable >= 4.0,
        "{family}: the reject rules' ICMP errors failed probes ({unreachable})"
    );

    // The balancer's own queue drops every packet (a pfifo of length 0): each SYN the
    // check sends fails locally (ENOBUFS), a local fault, never a verdict against b1.
    // The connect probe cannot tell: the kernel hides the drop from a connecting socket
    // and resends its SYN into the same queue, so connect times out against b1 — after
    // two of its timeouts inside the window, b1 goes unhealthy by connect (whether the
    // second lands inside depends on where the window falls in connect's interval). So
    // the SYN check is judged by its own results and causes.
    let dropping_from = lb_tests::traffic::pacer::wall_now();
    let local = local_faults_while_the_queue_drops(topo, api, 3 * INTERVAL);
    let (_, probes) = server_health(api, "web", a[0]).expect("b1's status");
    assert!(
        local >= 2.0,
        "{family}: SYNs dropped by the balancer's own queue are local faults ({local}); \
         b1: {probes:?}"
    );
    assert_eq!(
        last_of(&probes, "port"),
        "passed",
        "{family}: a local drop gives the SYN check no verdict about b1: {probes:?}"
    );
    let events = api.events().expect("events");
    let by_syn_check: Vec<&api::EventView> = events
        .iter()
        .filter(|e| e.server == a[0].to_string() && event_time(e) >= dropping_from - 0.005)
        .filter(|e| e.cause.contains("probe port"))
        .collect();
    assert!(
        by_syn_check.is_empty(),
        "{family}: a local drop says nothing about b1, yet the SYN check moved it: \
         {by_syn_check:?}"
    );
    println!(
        "SYN check over {family} (interval 1 s, timeout {TIMEOUT:?}, fails 2; bounds: at once \
         {}, at the timeout {}):\n  {}\n  forged: {f1} ICMP to b1, {f4} TCP to b4, {f7} ICMP to \
         b7; counted: {rejected} rejected, {icmp_rejected} icmp_rejected, {icmp_unmatched} \
         icmp_unmatched; {unreachable} verified unreachables; {local} local faults",
        secs(fast.as_secs_f64()),
        secs(slow.as_secs_f64()),
        lines.join("\n  ")
    );
}
