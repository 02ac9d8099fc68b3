//! The harness itself, without the balancer: the topology builds, hosts reach each
//! other, lb-testserver answers, and everything is gone after drop, also after a panic.

use std::{
    net::{IpAddr, SocketAddr},
    panic::{self, AssertUnwindSafe},
    path::Path,
    time::Duration,
};

use lb_tests::{
    net::topology::{Forwarding, Topology},
    traffic::clients,
    util::process::NsProcess,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");

fn namespaces_of(tag_of: &Topology) -> Vec<String> {
    tag_of
        .hosts()
        .map(|h| h.ns.name().to_owned())
        .chain([tag_of.switch().name().to_owned()])
        .collect()
}

fn start_servers(topo: &Topology) -> Vec<NsProcess> {
    topo.backends()
        .iter()
        .map(|b| {
            let p = b
                .spawn(
                    &b.role,
                    Path::new(TESTSERVER),
                    &["--name", &b.role, "--tcp", "8080", "--udp", "8081"],
                )
                .expect("start lb-testserver");
            p.wait_for_line(0, "ready", Duration::from_secs(10))
                .expect("lb-testserver ready");
            p
        })
        .collect()
}

#[test]
fn hosts_reach_backends_directly_and_everything_is_removed_on_drop() {
    let topo = Topology::builder()
        .backends(2)
        .subnet(201)
        .ipv6(true)
        .build()
        .expect("build topology");
    let names = namespaces_of(&topo);
    for ns in &names {
        assert!(
            Path::new("/run/netns").join(ns).exists(),
            "namespace {ns} should exist"
        );
    }
    let port_info = topo
        .switch()
        .ip(&["-d", "link", "show", "p-lb"])
        .expect("ip link show p-lb");
    assert!(
        port_info.contains("xdp"),
        "lb_pass should be attached to p-lb in native mode: {port_info}"
    );

    let servers = start_servers(&topo);
    let client = topo.client();
    for (i, b) in topo.backends().iter().enumerate() {
        for v6 in [false, true] {
            let dst = SocketAddr::new(b.addr(v6).unwrap(), 8080);
            let src = client.addr(v6).unwrap();
            let tcp = clients::tcp_names(
                &client.ns,
                src,
                11000 + 100 * i as u16 + 50 * v6 as u16,
                dst,
                5,
                Duration::from_secs(10),
            )
            .expect("enter client namespace");
            assert_eq!(
                tcp.counts.get(&b.role),
                Some(&5),
                "5 TCP greetings from {dst} expected: {tcp:?}"
            );
            let dst = SocketAddr::new(b.addr(v6).unwrap(), 8081);
            let udp = clients::udp_names(
                &client.ns,
                src,
                12000 + 100 * i as u16 + 50 * v6 as u16,
                dst,
                5,
                Duration::from_secs(10),
            )
            .expect("enter client namespace");
            assert_eq!(
                udp.counts.get(&b.role),
                Some(&5),
                "5 UDP answers from {dst} expected: {udp:?}"
            );
        }
    }
    let mut echo = clients::EchoConn::connect(
        &client.ns,
        IpAddr::V4(client.ipv4),
        SocketAddr::new(topo.backends()[0].ipv4.into(), 8080),
    )
    .expect("enter client namespace")
    .expect("connect to b1");
    for i in 0..3 {
        echo.check_echo(&format!("line {i}")).unwrap();
    }
    drop(echo);
    let pids: Vec<u32> = servers.iter().map(NsProcess::pid).collect();
    drop(servers);
    drop(topo);
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "lb-testserver pid {pid} should be gone"
        );
    }
    for ns in &names {
        assert!(
            !Path::new("/run/netns").join(ns).exists(),
            "namespace {ns} should be gone after drop"
        );
    }
}

#[test]
fn a_panicking_test_leaves_no_namespace_or_process() {
    let mut seen = Vec::new();
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        let topo = Topology::builder()
            .backends(1)
            .forwarding(Forwarding::Dsr)
            .subnet(202)
            .build()
            .expect("build topology");
        let servers = start_servers(&topo);
        seen = namespaces_of(&topo);
        seen.push(format!("/proc/{}", servers[0].pid()));
        panic!("deliberate panic with the topology alive");
    }));
    assert!(result.is_err());
    assert!(!seen.is_empty());
    for name in &seen {
        let path = if name.starts_with('/') {
            Path::new(name).to_owned()
        } else {
            Path::new("/run/netns").join(name)
        };
        assert!(
            !path.exists(),
            "{} should be gone after the panic",
            path.display()
        );
    }
}

#[test]
fn dsr_backends_hold_the_vip_and_ignore_arp_for_it() {
    let root_ignore = || std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/arp_ignore").unwrap();
    let before = root_ignore();
    let topo = Topology::builder()
        .backends(1)
        .forwarding(Forwarding::Dsr)
        .subnet(203)
        .build()
        .expect("build topology");
    let b1 = &topo.backends()[0];
    let lo = b1
        .ns
        .ip(&["-4", "addr", "show", "dev", "lo"])
        .expect("ip addr");
    assert!(
        lo.contains(&format!("{}/32", topo.vip4())),
        "VIP on b1's lo expected: {lo}"
    );
    let ignore = b1
        .ns
        .run(|| std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/arp_ignore"))
        .unwrap()
        .unwrap();
    assert_eq!(ignore.trim(), "1", "arp_ignore in b1's namespace");
    assert_eq!(
        root_ignore(),
        before,
        "the root namespace's arp_ignore must not change"
    );
    let client_routes = topo
        .client()
        .ns
        .ip(&["route", "get", &topo.vip4().to_string()])
        .unwrap();
    assert!(
        client_routes.contains(&format!("via {}", topo.lb().ipv4)),
        "client routes the VIP via lb: {client_routes}"
    );
}
