//! icmp echo probes to the loopback addresses (needs a ping socket allowed by
//! `net.ipv4.ping_group_range`, or root for a raw socket).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lb_agent::config::{ProbeConfig, ProbeKind};
use lb_agent::probe::execute;
use tokio::task::JoinSet;

fn icmp() -> ProbeConfig {
    let mut p = ProbeConfig::new("ping", ProbeKind::Icmp);
    p.timeout = Duration::from_secs(1);
    p
}

#[tokio::test]
async fn icmp_echo_to_ipv4_loopback_passes_and_ignores_ports() {
    let target: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut p = icmp();
    p.port = Some(1);
    let o = execute(&p, target).await;
    assert!(o.ok, "expected an echo reply from 127.0.0.1, got {o:?}");
    assert!(o.duration < Duration::from_millis(500), "{o:?}");
}

#[tokio::test]
async fn icmp_echo_to_ipv6_loopback_passes() {
    let o = execute(&icmp(), "[::1]:80".parse().unwrap()).await;
    assert!(o.ok, "expected an echo reply from ::1, got {o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_icmp_probes_each_get_their_reply() {
    let p = Arc::new(icmp());
    let mut set = JoinSet::new();
    for _ in 0..8 {
        let p = p.clone();
        set.spawn(async move { execute(&p, "127.0.0.1:0".parse().unwrap()).await });
    }
    while let Some(o) = set.join_next().await {
        let o = o.unwrap();
        assert!(o.ok, "expected every probe to pass, got {o:?}");
    }
}
