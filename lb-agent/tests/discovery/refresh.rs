//! Re-resolution against a real DNS server (hickory-server on 127.0.0.1): an answer is
//! used for its TTL (clamped), then asked again in the background and a changed answer
//! replaces it; NXDOMAIN, SERVFAIL and silence keep the last answer and retry with a
//! growing backoff; an entry that never had an answer fills in once DNS answers.
//!
//! Real time with short timings ([`crate::util::quick`]): DNS replies cross real
//! sockets, which paused tokio time would race.

use std::time::Duration;

use crate::util::{Mode, TestDns, addr, config, quick, srv};
use lb_agent::{
    config::Config,
    discovery::{Discovery, Options},
};
use tokio::time::Instant;

const SRV_NAME: &str = "_http._tcp.backends.example.";

fn records(ttl: u32, ips: &[&str]) -> Vec<hickory_proto::rr::Record> {
    let mut r = vec![srv(SRV_NAME, ttl, 1, 1, 8080, "t.example.")];
    r.extend(ips.iter().map(|ip| addr("t.example.", ttl, ip)));
    r
}

fn setup(dns: &TestDns) -> Config {
    config(
        dns.addr,
        "10.0.0.100:80",
        false,
        "[[service.server]]\naddress = \"backends.example\"\nservice = \"_http._tcp\"\nresolve = true\n",
    )
}

async fn start(dns: &TestDns, opts: Options) -> (Discovery, Config) {
    let cfg = setup(dns);
    let mut d = Discovery::new(opts);
    d.with_resolver(cfg.agent.resolver);
    d.expand(&cfg.services[0]).await;
    (d, cfg)
}

fn held(d: &Discovery, cfg: &Config) -> Vec<String> {
    let mut v: Vec<String> = d
        .expand_cached(&cfg.services[0])
        .iter()
        .map(|e| e.addr.to_string())
        .collect();
    v.sort();
    v
}

/// Waits for the next deadline, lets the lookups it starts come back, and applies them;
/// whether the answer changed, and when the lookups started.
async fn round(d: &mut Discovery) -> (bool, Instant) {
    d.ready().await;
    let started = Instant::now();
    let mut changed = d.poll(started);
    assert!(d.running() > 0, "a due deadline must start a lookup");
    while d.running() > 0 {
        tokio::time::timeout(Duration::from_secs(5), d.ready())
            .await
            .expect("a lookup must come back within its timeout");
        changed |= d.poll(Instant::now());
    }
    (changed, started)
}

fn until_next(d: &Discovery) -> Duration {
    d.next_deadline()
        .expect("a resolved entry always has a next lookup")
        .saturating_duration_since(Instant::now())
}

#[tokio::test]
async fn a_changed_answer_replaces_the_old_one_when_its_ttl_expires() {
    let dns = TestDns::start(records(1, &["10.0.1.1", "10.0.1.2"])).await;
    let (mut d, cfg) = start(&dns, quick()).await;
    assert_eq!(held(&d, &cfg), ["10.0.1.1:8080", "10.0.1.2:8080"]);
    let wait = until_next(&d);
    assert!(
        wait > Duration::from_millis(800) && wait <= Duration::from_secs(1),
        "TTL 1 s (min TTL 200 ms): the next lookup must be 1 s away, is {wait:?}"
    );

    dns.set(records(1, &["10.0.1.2", "10.0.1.3"]));
    let asked = dns.queries();
    let loaded = Instant::now();
    let (changed, started) = round(&mut d).await;
    assert!(changed, "the new answer must count as a change");
    assert!(
        started.duration_since(loaded) >= wait.saturating_sub(Duration::from_millis(20)),
        "asked again only once the TTL ran out"
    );
    assert_eq!(dns.queries(), asked + 2, "one SRV and one A question");
    assert_eq!(held(&d, &cfg), ["10.0.1.2:8080", "10.0.1.3:8080"]);

    let (changed, _) = round(&mut d).await;
    assert!(!changed, "the same answer again is no change");
}

#[tokio::test]
async fn a_ttl_below_the_minimum_waits_the_minimum_and_a_long_one_the_maximum() {
    let dns = TestDns::start(records(0, &["10.0.1.1"])).await;
    let (d, _) = start(&dns, quick()).await;
    let wait = until_next(&d);
    assert!(
        wait > Duration::from_millis(150) && wait <= Duration::from_millis(200),
        "TTL 0: min TTL 200 ms, got {wait:?}"
    );

    dns.set(records(86400, &["10.0.1.1"]));
    let opts = Options {
        max_ttl: Duration::from_secs(60),
        ..quick()
    };
    let (d, _) = start(&dns, opts).await;
    let wait = until_next(&d);
    assert!(
        wait > Duration::from_secs(59) && wait <= Duration::from_secs(60),
        "TTL 1 day: max TTL 60 s, got {wait:?}"
    );
}

/// Each failure keeps the answer and doubles the wait (200, 400, 800, 800 ms); success
/// afterwards is picked up and resets the backoff.
async fn failures_keep_the_last_answer(mode: Mode) {
    let dns = TestDns::start(records(0, &["10.0.1.1"])).await;
    let (mut d, cfg) = start(&dns, quick()).await;
    dns.mode(mode);
    let mut waits = Vec::new();
    for _ in 0..4 {
        let (changed, _) = round(&mut d).await;
        assert!(!changed, "{mode:?}: a failed lookup changes nothing");
        assert_eq!(
            held(&d, &cfg),
            ["10.0.1.1:8080"],
            "{mode:?}: the last answer is kept"
        );
        waits.push(until_next(&d).as_millis().div_ceil(100) * 100);
    }
    assert_eq!(
        waits,
        [200, 400, 800, 800],
        "{mode:?}: backoff from 200 ms doubling to 800 ms"
    );

    dns.set(records(0, &["10.0.1.7"]));
    dns.mode(Mode::Answer);
    let (changed, _) = round(&mut d).await;
    assert!(changed, "{mode:?}: DNS back with a new answer");
    assert_eq!(held(&d, &cfg), ["10.0.1.7:8080"]);
    assert!(
        until_next(&d) <= Duration::from_millis(200),
        "success resets the backoff: next lookup at the TTL again"
    );
}

#[tokio::test]
async fn nxdomain_keeps_the_last_answer() {
    failures_keep_the_last_answer(Mode::NxDomain).await;
}

#[tokio::test]
async fn servfail_keeps_the_last_answer() {
    failures_keep_the_last_answer(Mode::ServFail).await;
}

#[tokio::test]
async fn a_timeout_keeps_the_last_answer() {
    failures_keep_the_last_answer(Mode::Silent).await;
}

#[tokio::test]
async fn an_entry_without_any_answer_yet_fills_in_once_dns_answers() {
    let dns = TestDns::start(Vec::new()).await;
    dns.mode(Mode::Silent);
    let (mut d, cfg) = start(&dns, quick()).await;
    assert!(
        held(&d, &cfg).is_empty(),
        "no answer at load: the entry stands for nothing"
    );
    assert!(
        until_next(&d) <= Duration::from_millis(200),
        "retried after the first backoff"
    );
    dns.set(records(30, &["10.0.1.1"]));
    dns.mode(Mode::Answer);
    let (changed, _) = round(&mut d).await;
    assert!(changed);
    assert_eq!(held(&d, &cfg), ["10.0.1.1:8080"]);
}

#[tokio::test]
async fn an_entry_gone_from_the_config_is_forgotten() {
    let dns = TestDns::start(records(30, &["10.0.1.1"])).await;
    let (mut d, _) = start(&dns, quick()).await;
    assert!(d.next_deadline().is_some());
    let other = config(
        dns.addr,
        "10.0.0.100:80",
        false,
        "[[service.server]]\naddress = \"10.0.9.9:80\"\n",
    );
    d.retain(&other.services);
    assert_eq!(
        d.next_deadline(),
        None,
        "nothing left to re-resolve after the entry was removed"
    );
}
