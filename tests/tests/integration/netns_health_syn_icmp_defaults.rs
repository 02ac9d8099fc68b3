//! The SYN check against servers whose hosts keep the kernel's default ICMP
//! rate limits, as real backends do (`netns_health_syn_families` lifts them to see every
//! error). A host that rejects the port with ICMP host or port unreachables answers only
//! part of the probes' SYNs once its per-destination bucket is empty (a burst, then about
//! one error a second toward the balancer, shared by the SYN check and a connect probe of
//! the same port): the probes it does not answer fail at their timeout instead of at
//! once. The verdict must be the same — unhealthy within the timeout-bound detection
//! time, never up again — and the open server next to them stays up. IPv4 and IPv6.

use std::{path::Path, time::Duration};

use lb_tests::{
    net::netns::NetNs,
    scenario::{
        balance::BACKEND_TCP_PORT,
        health::{MARGIN, event_time, find_event, secs, server_health, syn_packets, wait_event},
        syn_bed::{SynBed, nft_port},
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const INTERVAL: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_millis(1500);
/// How long the rejected servers are watched after their verdicts.
const WATCH: Duration = Duration::from_secs(6);
/// The kernel's defaults (Documentation/networking/ip-sysctl.rst): at most one error a
/// second (1,000 ms) per destination after a burst, for the rate-limited ICMP types.
const DEFAULT_LIMITS: [(&str, &str); 2] = [
    ("net.ipv4.icmp_ratelimit", "1000"),
    ("net.ipv6.icmp.ratelimit", "1000"),
];

/// Rejects tcp to `port` arriving in `ns` with an ICMP error of `kind`, under the
/// kernel's default ICMP rate limits.
fn reject_with_default_limits(ns: &NetNs, port: u16, kind: &str) {
    for (key, value) in DEFAULT_LIMITS {
        ns.sysctl(key, value).expect("the default ICMP rate limit");
    }
    nft_port(ns, port, &format!("reject with icmpx type {kind}"));
}

#[test]
fn syn_check_with_default_icmp_rate_limits_over_ipv4() {
    scenario_for(false, 235);
}

#[test]
fn syn_check_with_default_icmp_rate_limits_over_ipv6() {
    scenario_for(true, 236);
}

fn scenario_for(v6: bool, subnet: u8) {
    let family = if v6 { "IPv6" } else { "IPv4" };
    let bed = SynBed::start(Path::new(TESTSERVER), 3, v6, subnet, INTERVAL, TIMEOUT);
    let (topo, api, a, probe) = (&bed.topo, &bed.api, &bed.addrs, &bed.probe);
    let unreachable0 = syn_packets(api, "unreachable");

    // b1 stays open; b2 rejects with host unreachables, b3 with port unreachables.
    let t0 = lb_tests::traffic::pacer::wall_now();
    let ns = |i: usize| &topo.backends()[i].ns;
    reject_with_default_limits(ns(1), BACKEND_TCP_PORT, "host-unreachable");
    reject_with_default_limits(ns(2), BACKEND_TCP_PORT, "port-unreachable");
    let changed = lb_tests::traffic::pacer::wall_now();

    // Errors that never come make a probe fail at its timeout: the detection bound.
    let bound = probe.detection_bound() + MARGIN;
    let mut lines = Vec::new();
    for (i, what) in [(1, "ICMP host unreachable"), (2, "ICMP port unreachable")] {
        let ev = wait_event(api, a[i], "unhealthy", t0, bound + MARGIN)
            .unwrap_or_else(|e| panic!("{family} {what}: {} should turn unhealthy: {e}", a[i]));
        let took = event_time(&ev) - changed;
        assert!(
            took <= bound.as_secs_f64(),
            "{family} {what}: unhealthy within {bound:?}, took {}",
            secs(took)
        );
        lines.push(format!("{what}: unhealthy after {}", secs(took)));
    }

    // Rate-limited or not, every failure is the error's reason or the timeout, and no
    // rejected server comes back while its host keeps rejecting.
    std::thread::sleep(WATCH);
    let events = api.events().expect("events");
    for (i, what, reason) in [
        (1, "ICMP host unreachable", "connect: No route to host"),
        (2, "ICMP port unreachable", "connection refused"),
    ] {
        assert!(
            find_event(&events, a[i], "up", changed).is_none(),
            "{family} {what}: {} must not come back while it rejects",
            a[i]
        );
        let (state, probes) = server_health(api, "web", a[i]).expect("status");
        assert_eq!(state, "unhealthy", "{family} {what}: {probes:?}");
        for p in &probes {
            let last = p.last_result.strip_prefix("failed: ").unwrap_or_else(|| {
                panic!(
                    "{family} {what}: {} last {:?}\n  its probes: {:#?}\n  events since the \
                     change: {:#?}",
                    p.name,
                    p.last_result,
                    probes.iter().map(|p| &p.record).collect::<Vec<_>>(),
                    events
                        .iter()
                        .filter(|e| event_time(e) >= changed)
                        .collect::<Vec<_>>()
                )
            });
            assert!(
                last.starts_with(reason) || last.starts_with("timeout"),
                "{family} {what}: probe {} failed for {last:?}, want {reason:?} or a timeout",
                p.name
            );
            lines.push(format!("{what}, {}: last {last:?}", p.name));
        }
    }
    assert!(
        find_event(&events, a[0], "unhealthy", t0).is_none(),
        "{family}: the open server next to them stays up"
    );
    let (state, probes) = server_health(api, "web", a[0]).expect("b1's status");
    assert_eq!(state, "up", "{family}: b1 stays up: {probes:?}");
    let unreachable = syn_packets(api, "unreachable") - unreachable0;
    assert!(
        unreachable >= 1.0,
        "{family}: some ICMP errors got through the limits and failed SYN checks at once"
    );
    println!(
        "SYN check over {family} with the kernel's default ICMP rate limits (interval 1 s, \
         timeout {TIMEOUT:?}, fails 2; bound {}):\n  {}\n  {unreachable} SYN checks failed \
         on a verified ICMP error",
        secs(bound.as_secs_f64()),
        lines.join("\n  ")
    );
}
