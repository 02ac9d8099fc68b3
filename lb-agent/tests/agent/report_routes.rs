//! A probe report reaches its server through the key's route (`agent/report_routes.rs`),
//! not a search: reports of a removed or replaced incarnation are dropped, also when a
//! new server took the same address; routes follow reloads that reorder services and
//! runtime additions and removals.

use std::net::SocketAddr;
use std::time::Duration;

use crate::util::{Harness, sa};
use lb_agent::api::{AdminChange, NewServer};
use lb_agent::probe::{ProbeOutcome, ProbeReport, ServerKey};

fn service(name: &str, vip: &str, addrs: &[&str]) -> String {
    let mut text = format!(
        "[[service]]\nname = \"{name}\"\nvip = \"{vip}\"\nsnat_ip = \"10.0.0.2\"\n\
         [[service.probe]]\ntype = \"tcp\"\ninterval = \"1h\"\n"
    );
    for a in addrs {
        text.push_str(&format!("[[service.server]]\naddress = \"{a}\"\n"));
    }
    text
}

const A: [&str; 3] = ["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"];
const B: [&str; 2] = ["10.0.2.1:80", "10.0.2.2:80"];

fn config(order_ab: bool) -> String {
    let a = service("a", "10.0.200.1:80", &A);
    let b = service("b", "10.0.200.2:80", &B);
    if order_ab { a + &b } else { b + &a }
}

fn failing(key: ServerKey) -> ProbeReport {
    ProbeReport {
        server: key,
        probe: 0,
        outcome: ProbeOutcome::fail(Duration::from_millis(1), "test"),
        at: tokio::time::Instant::now(),
    }
}

/// Failed probes counted for every server of both services, by (service, address).
fn fails(h: &mut Harness) -> Vec<(String, SocketAddr, u64)> {
    h.agent_mut().publish_snapshot();
    let mut out = Vec::new();
    for (svc, addrs) in [("a", &A[..]), ("b", &B[..])] {
        for a in addrs {
            out.push((svc.into(), sa(a), h.server_status(svc, sa(a)).health.fails));
        }
    }
    out
}

/// Only `(service, addr)` counts one more failure than `before`.
fn one_more(
    before: &[(String, SocketAddr, u64)],
    service: &str,
    addr: SocketAddr,
) -> Vec<(String, SocketAddr, u64)> {
    before
        .iter()
        .map(|(s, a, n)| (s.clone(), *a, n + u64::from(s == service && *a == addr)))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_report_reaches_its_own_server_across_reorders_removals_and_additions() {
    let mut h = Harness::start(&config(true)).await;
    let a2 = sa(A[1]);
    let b1 = sa(B[0]);
    let key_a2 = h.agent().server_key("a", a2).expect("configured");
    let old_b1 = h.agent().server_key("b", b1).expect("configured");

    // A reload that swaps the services keeps both servers' incarnations (nothing about
    // their probes changed): the old key still reaches a2, and only a2.
    h.reload(&config(false)).await;
    assert_eq!(h.agent().server_key("a", a2), Some(key_a2));
    let before = fails(&mut h);
    h.agent_mut()
        .on_probe_report(failing(key_a2))
        .expect("memory publish");
    assert_eq!(fails(&mut h), one_more(&before, "a", a2));

    // b1 removed and added again at runtime: a new incarnation at the same address.
    h.admin("b", B[0], AdminChange::Remove)
        .await
        .expect("removed");
    let add = NewServer {
        address: b1,
        weight: 1,
        spare: false,
        backup: 0,
    };
    h.admin("b", B[0], AdminChange::Add(add))
        .await
        .expect("added");
    let new_b1 = h.agent().server_key("b", b1).expect("added again");
    assert_ne!(new_b1, old_b1, "a new incarnation gets a new key");

    let before = fails(&mut h);
    h.agent_mut()
        .on_probe_report(failing(old_b1))
        .expect("memory publish");
    assert_eq!(
        fails(&mut h),
        before,
        "a late report of the removed incarnation must not reach the new server"
    );
    h.agent_mut()
        .on_probe_report(failing(new_b1))
        .expect("memory publish");
    assert_eq!(fails(&mut h), one_more(&before, "b", b1));

    // A key with the right address but an incarnation never handed out reaches nothing.
    let forged = ServerKey {
        service: new_b1.service + 1,
        addr: b1,
    };
    let before = fails(&mut h);
    h.agent_mut()
        .on_probe_report(failing(forged))
        .expect("memory publish");
    assert_eq!(fails(&mut h), before);

    // Every other server still reaches its own, after all of that.
    for (svc, addrs) in [("a", &A[..]), ("b", &B[..])] {
        for a in addrs {
            let key = h.agent().server_key(svc, sa(a)).expect("configured");
            let before = fails(&mut h);
            h.agent_mut()
                .on_probe_report(failing(key))
                .expect("memory publish");
            assert_eq!(fails(&mut h), one_more(&before, svc, sa(a)), "{svc} {a}");
        }
    }
}
