//! SRV and A/AAAA expansion of `resolve = true` servers against a real DNS server
//! (hickory-server on 127.0.0.1): levels from SRV priorities (`backup = "prio"` and a base
//! level), weights, targets' A records, AAAA for an IPv6 VIP, and what is left out.

use crate::util::{TestDns, addr, config, quick, srv};
use lb_agent::discovery::{Discovery, Expanded};

const SRV_NAME: &str = "_http._tcp.backends.example.";

/// Two priorities: 10 → t1 (two addresses, weight 0), 20 → t2 (one address, weight 5).
fn two_priorities() -> Vec<hickory_proto::rr::Record> {
    vec![
        srv(SRV_NAME, 60, 10, 0, 8080, "t1.example."),
        srv(SRV_NAME, 60, 20, 5, 8081, "t2.example."),
        addr("t1.example.", 60, "10.0.1.1"),
        addr("t1.example.", 60, "10.0.1.2"),
        addr("t2.example.", 60, "10.0.2.1"),
        addr("t2.example.", 60, "fd00::21"),
    ]
}

fn srv_entry(extra: &str) -> String {
    format!(
        "[[service.server]]\naddress = \"backends.example\"\nservice = \"_http._tcp\"\nresolve = true\n{extra}\n"
    )
}

/// (address, backup level, weight) of each backend, sorted by address.
fn summary(found: &[Expanded]) -> Vec<(String, u32, u32)> {
    let mut out: Vec<(String, u32, u32)> = found
        .iter()
        .map(|e| (e.addr.to_string(), e.backup, e.weight))
        .collect();
    out.sort();
    out
}

async fn expand(dns: &TestDns, vip: &str, dsr: bool, servers: &str) -> Vec<Expanded> {
    let cfg = config(dns.addr, vip, dsr, servers);
    let mut d = Discovery::new(quick());
    d.with_resolver(cfg.agent.resolver);
    d.expand(&cfg.services[0]).await
}

fn row(a: &str, level: u32, weight: u32) -> (String, u32, u32) {
    (a.to_string(), level, weight)
}

#[tokio::test]
async fn prio_makes_each_srv_priority_the_backup_level() {
    let dns = TestDns::start(two_priorities()).await;
    let found = expand(
        &dns,
        "10.0.0.100:80",
        false,
        &srv_entry("backup = \"prio\""),
    )
    .await;
    assert_eq!(
        summary(&found),
        [
            row("10.0.1.1:8080", 10, 1),
            row("10.0.1.2:8080", 10, 1),
            row("10.0.2.1:8081", 20, 5),
        ],
        "backup = \"prio\": priority 10 → level 10, 20 → 20; ports from SRV; A records only"
    );
}

#[tokio::test]
async fn a_base_level_is_the_lowest_priority_and_the_next_one_is_one_above() {
    let dns = TestDns::start(two_priorities()).await;
    let found = expand(&dns, "10.0.0.100:80", false, &srv_entry("backup = 2")).await;
    assert_eq!(
        summary(&found),
        [
            row("10.0.1.1:8080", 2, 1),
            row("10.0.1.2:8080", 2, 1),
            row("10.0.2.1:8081", 3, 5),
        ],
        "backup = 2: lowest priority → 2, next → 3"
    );
    let found = expand(&dns, "10.0.0.100:80", false, &srv_entry("")).await;
    let levels: Vec<u32> = summary(&found).iter().map(|r| r.1).collect();
    assert_eq!(
        levels,
        [0, 0, 1],
        "no backup: the lowest priority is the primary group, the next backup level 1"
    );
}

#[tokio::test]
async fn weights_are_the_entry_weight_times_the_srv_weight() {
    let dns = TestDns::start(two_priorities()).await;
    let found = expand(&dns, "10.0.0.100:80", false, &srv_entry("weight = 3")).await;
    let weights: Vec<(String, u32)> = summary(&found).into_iter().map(|r| (r.0, r.2)).collect();
    assert_eq!(
        weights,
        [
            ("10.0.1.1:8080".to_string(), 3),
            ("10.0.1.2:8080".to_string(), 3),
            ("10.0.2.1:8081".to_string(), 15)
        ],
        "SRV weight 0 counts as 1 (3 × 1); weight 5 gives 3 × 5"
    );
}

#[tokio::test]
async fn an_ipv6_vip_takes_the_targets_aaaa_records() {
    let dns = TestDns::start(two_priorities()).await;
    dns.set({
        let mut r = two_priorities();
        r.push(addr("t1.example.", 60, "fd00::11"));
        r
    });
    let found = expand(
        &dns,
        "[fd00::100]:80",
        false,
        &srv_entry("backup = \"prio\""),
    )
    .await;
    assert_eq!(
        summary(&found),
        [row("[fd00::11]:8080", 10, 1), row("[fd00::21]:8081", 20, 5)],
        "IPv6 VIP: AAAA records only"
    );
}

#[tokio::test]
async fn a_plain_resolved_name_gives_its_addresses_with_the_entry_port_and_level() {
    let dns = TestDns::start(vec![
        addr("web.example.", 60, "10.0.3.1"),
        addr("web.example.", 60, "10.0.3.2"),
        addr("web.example.", 60, "fd00::31"),
    ])
    .await;
    let servers = "[[service.server]]\naddress = \"web.example:8443\"\nresolve = true\nbackup = 1\nweight = 2\n\
                   [[service.server]]\naddress = \"10.0.9.9:8443\"\n";
    let found = expand(&dns, "10.0.0.100:80", false, servers).await;
    assert_eq!(
        summary(&found),
        [
            row("10.0.3.1:8443", 1, 2),
            row("10.0.3.2:8443", 1, 2),
            row("10.0.9.9:8443", 0, 1)
        ]
    );
    let servers = "[[service.server]]\naddress = \"web.example\"\nresolve = true\n";
    let found = expand(&dns, "[fd00::100]:80", false, servers).await;
    assert_eq!(
        summary(&found),
        [row("[fd00::31]:80", 0, 1)],
        "no port: the VIP's; IPv6 VIP: AAAA"
    );
}

#[tokio::test]
async fn dsr_leaves_out_srv_records_whose_port_is_not_the_vips() {
    let dns = TestDns::start(vec![
        srv(SRV_NAME, 60, 1, 1, 80, "t1.example."),
        srv(SRV_NAME, 60, 1, 1, 8080, "t2.example."),
        addr("t1.example.", 60, "10.0.1.1"),
        addr("t2.example.", 60, "10.0.2.1"),
    ])
    .await;
    let found = expand(&dns, "10.0.0.100:80", true, &srv_entry("")).await;
    assert_eq!(summary(&found), [row("10.0.1.1:80", 0, 1)]);
}

#[tokio::test]
async fn a_target_without_addresses_is_left_out_and_the_rest_kept() {
    let dns = TestDns::start(vec![
        srv(SRV_NAME, 60, 1, 1, 8080, "t1.example."),
        srv(SRV_NAME, 60, 1, 1, 8080, "gone.example."),
        addr("t1.example.", 60, "10.0.1.1"),
    ])
    .await;
    let found = expand(&dns, "10.0.0.100:80", false, &srv_entry("")).await;
    assert_eq!(summary(&found), [row("10.0.1.1:8080", 0, 1)]);
}

#[tokio::test]
async fn an_address_given_by_two_entries_keeps_the_first_entrys_settings() {
    let dns = TestDns::start(two_priorities()).await;
    let servers = format!(
        "[[service.server]]\naddress = \"10.0.1.1:8080\"\nweight = 7\n{}",
        srv_entry("")
    );
    let found = expand(&dns, "10.0.0.100:80", false, &servers).await;
    assert_eq!(
        summary(&found),
        [
            row("10.0.1.1:8080", 0, 7),
            row("10.0.1.2:8080", 0, 1),
            row("10.0.2.1:8081", 1, 5),
        ]
    );
}
