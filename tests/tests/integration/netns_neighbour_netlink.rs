//! The agent's netlink side against the real kernel, in the lb's namespace: MAC
//! resolution reads the route and neighbour tables (IPv4 and IPv6, a routed address's
//! gateway, an address routed through another interface refused, an unanswered one
//! failing without holding the caller on its retry), the watch resyncs after its
//! receive buffer overflowed (the event it lost is found by the dump), and a neighbour
//! no backend uses that announces another MAC (a router toward the clients) is reported
//! as moved.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use lb_agent::neighbour::{
    NeighbourError,
    nexthops::{MacUpdate, Moved, NeighbourChanges},
    resolve_mac,
    rtnl::Rtnl,
    watch,
};
use lb_tests::{
    net::topology::{Forwarding, HOST_IF, Topology},
    util::cmd,
};

const RESOLVE: Duration = Duration::from_millis(500);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a tokio runtime")
}

#[test]
fn resolution_reads_the_kernels_route_and_neighbour_tables() {
    let topo = Topology::builder()
        .backends(2)
        .forwarding(Forwarding::Nat)
        .subnet(250)
        .ipv6(true)
        .static_neighbours(false)
        .build()
        .expect("building the topology");
    let lb = &topo.lb().ns;
    let b1 = &topo.backends()[0];
    let b2 = &topo.backends()[1];
    // 10.99.0.0/24 through b2 as a gateway; 10.98.0.0/24 on another interface (a veth
    // pair inside the namespace, gone with it).
    lb.ip_batch(&[
        format!("route add 10.99.0.0/24 via {} dev {HOST_IF}", b2.ipv4),
        "link add lbtest0 type veth peer name lbtest1".to_owned(),
        "link set lbtest0 up".to_owned(),
        "addr add 10.98.0.1/24 dev lbtest0".to_owned(),
    ])
    .expect("adding the routes");
    let unanswered = IpAddr::V4(Ipv4Addr::new(10, 77, topo.subnet(), 99));
    lb.run(|| {
        runtime().block_on(async {
            let rtnl = Rtnl::new().expect("netlink connection");
            let mac = resolve_mac(&rtnl, HOST_IF, b1.ipv4.into(), RESOLVE).await;
            assert_eq!(mac.expect("b1 over IPv4"), b1.mac.0);
            let v6 = b1.ipv6.expect("b1 has IPv6");
            let mac = resolve_mac(&rtnl, HOST_IF, v6.into(), RESOLVE).await;
            assert_eq!(mac.expect("b1 over IPv6"), b1.mac.0);
            let routed = "10.99.0.7".parse().unwrap();
            let mac = resolve_mac(&rtnl, HOST_IF, routed, RESOLVE).await;
            assert_eq!(
                mac.expect("a routed address resolves to its gateway"),
                b2.mac.0
            );
            let elsewhere = "10.98.0.7".parse().unwrap();
            match resolve_mac(&rtnl, HOST_IF, elsewhere, RESOLVE).await {
                Err(NeighbourError::WrongInterface { .. }) => {}
                other => panic!("10.98.0.7 is routed through lbtest0, got {other:?}"),
            }
            let first = resolve_mac(&rtnl, HOST_IF, unanswered, RESOLVE).await;
            assert!(
                matches!(first, Err(NeighbourError::Timeout { .. })),
                "nobody has {unanswered}: {first:?}"
            );
            // The kernel is resolving it (INCOMPLETE) or gave up (FAILED): a retry
            // returns at once instead of waiting again.
            let started = Instant::now();
            let retry = resolve_mac(&rtnl, HOST_IF, unanswered, RESOLVE).await;
            let took = started.elapsed();
            assert!(
                matches!(retry, Err(NeighbourError::Unresolved { .. })),
                "a retry of {unanswered}: {retry:?}"
            );
            assert!(
                took < RESOLVE / 2,
                "a retry of an unresolved neighbour took {took:?} (the wait is {RESOLVE:?})"
            );
        })
    })
    .expect("entering the lb namespace");
}

/// Waits for an update of `backend` to `mac`; every update seen, in order.
async fn wait_update(
    rx: &mut tokio::sync::mpsc::Receiver<NeighbourChanges>,
    backend: IpAddr,
    mac: [u8; 6],
    timeout: Duration,
) -> (bool, Vec<MacUpdate>) {
    let mut seen = Vec::new();
    let end = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(end, rx.recv()).await {
            Ok(Some(batch)) => {
                seen.extend(batch.backends);
                if seen
                    .iter()
                    .any(|u| u.backend == backend && u.mac == Some(mac))
                {
                    return (true, seen);
                }
            }
            _ => return (false, seen),
        }
    }
}

/// A client, the lb and one backend on subnet `k`, neighbours left to ARP.
fn one_backend(k: u8) -> Topology {
    Topology::builder()
        .backends(1)
        .forwarding(Forwarding::Nat)
        .subnet(k)
        .static_neighbours(false)
        .build()
        .expect("building the topology")
}

#[test]
fn the_watch_resyncs_after_its_buffer_overflowed() {
    let topo = one_backend(251);
    let lb = topo.lb().ns.clone();
    let b1 = &topo.backends()[0];
    let b1_ip: IpAddr = b1.ipv4.into();
    let moved = [0x02, 0x55, 0, 0, 0, 0x01];
    // Neighbour events by the thousand: permanent entries for addresses nobody has.
    let flood = |first: u16| -> Vec<String> {
        (0..2000u16)
            .map(|i| {
                let n = first + i;
                format!(
                    "neigh replace 10.200.{}.{} lladdr 02:66:00:00:{:02x}:{:02x} dev {HOST_IF} nud permanent",
                    n / 250,
                    n % 250 + 1,
                    n >> 8,
                    n & 0xff
                )
            })
            .collect()
    };
    lb.run(|| {
        runtime().block_on(async {
            let rtnl = Rtnl::new().expect("netlink connection");
            resolve_mac(&rtnl, HOST_IF, b1_ip, RESOLVE)
                .await
                .expect("b1 resolves");
            // The smallest buffer the kernel allows.
            let (follow, mut rx) =
                watch::spawn_with_buffer(HOST_IF, rtnl.clone(), 0).expect("starting the watch");
            follow.set(vec![b1_ip]);
            let (got, seen) = wait_update(&mut rx, b1_ip, b1.mac.0, Duration::from_secs(5)).await;
            assert!(got, "the watch must report b1's MAC first; saw {seen:?}");
            // This thread runs the watch: while it is busy here, nothing reads the
            // socket. Fill its buffer, change b1's entry (that event is dropped), fill
            // it again.
            cmd::ip_batch(Some(lb.name()), &flood(0)).expect("first flood");
            cmd::ip_batch(
                Some(lb.name()),
                &[format!(
                    "neigh replace {b1_ip} lladdr 02:55:00:00:00:01 dev {HOST_IF} nud permanent"
                )],
            )
            .expect("changing b1's entry");
            cmd::ip_batch(Some(lb.name()), &flood(2000)).expect("second flood");
            let (got, seen) = wait_update(&mut rx, b1_ip, moved, Duration::from_secs(10)).await;
            assert!(
                got,
                "after the overflow the watch must read the table again and find b1's new \
                 MAC; saw {seen:?}"
            );
        })
    })
    .expect("entering the lb namespace");
}

#[test]
fn a_neighbour_that_announces_another_mac_is_reported_moved() {
    let topo = one_backend(248);
    let lb = topo.lb().ns.clone();
    let client = topo.client();
    let client_ip: IpAddr = client.ipv4.into();
    // b1 stands for a router toward the clients: a neighbour no backend goes through.
    let router = &topo.backends()[0];
    let router_ip: IpAddr = router.ipv4.into();
    let new = lb_tests::net::link::Mac([0x02, 0x56, 0, 0, 0, 0x01]);
    lb.run(|| {
        runtime().block_on(async {
            let rtnl = Rtnl::new().expect("netlink connection");
            resolve_mac(&rtnl, HOST_IF, router_ip, RESOLVE)
                .await
                .expect("the router resolves");
            resolve_mac(&rtnl, HOST_IF, client_ip, RESOLVE)
                .await
                .expect("the client resolves");
            let (follow, mut rx) = watch::spawn(HOST_IF, rtnl.clone()).expect("starting the watch");
            // The client followed as a backend: its MAC reported means the watch has
            // read the table (and the router's entry) before the router moves.
            follow.set(vec![client_ip]);
            let (got, seen) = wait_update(&mut rx, client_ip, client.mac.0, RESOLVE).await;
            assert!(
                got,
                "the watch reports the followed client first; saw {seen:?}"
            );
            // The router's NIC is swapped: the kernel announces the new MAC (gratuitous
            // ARP), which updates the entry the lb's kernel already has.
            router
                .ns
                .sysctl("net.ipv4.conf.eth0.arp_notify", "1")
                .expect("arp_notify");
            lb_tests::net::link::set_mac(&router.ns, HOST_IF, new).expect("the new MAC");
            let want = Moved {
                addr: router_ip,
                old: router.mac.0,
                new: new.0,
            };
            let end = tokio::time::Instant::now() + Duration::from_secs(5);
            let mut seen = Vec::new();
            while !seen.contains(&want) {
                match tokio::time::timeout_at(end, rx.recv()).await {
                    Ok(Some(batch)) => {
                        assert!(batch.backends.is_empty(), "the client did not move");
                        seen.extend(batch.moved);
                    }
                    _ => panic!("the move {want:?} was not reported; saw {seen:?}"),
                }
            }
        })
    })
    .expect("entering the lb namespace");
}
