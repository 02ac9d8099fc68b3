//! Runtime changes through `Agent::on_admin` (the API's PATCH / POST / DELETE): drain,
//! down, weight, add, remove, and the refusals.

use std::net::SocketAddr;

use crate::util::{Harness, LearnedNeighbours, MAC, sa, secs, servers, web};
use lb_agent::api::{AdminChange, AdminError, NewServer, ServerPatch};
use lb_common::maps::BackendStats;

fn config() -> String {
    web(
        "",
        &(servers(&[
            ("10.0.1.1:80", ""),
            ("10.0.1.2:80", ""),
            ("10.0.1.3:80", ""),
        ]) + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n"),
    )
}

fn three() -> [SocketAddr; 3] {
    [sa("10.0.1.1:80"), sa("10.0.1.2:80"), sa("10.0.1.3:80")]
}

async fn running() -> Harness {
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(2)).await;
    h
}

async fn patch(h: &mut Harness, addr: SocketAddr, p: ServerPatch) {
    h.admin("web", &addr.to_string(), AdminChange::Patch(p.clone()))
        .await
        .unwrap_or_else(|e| panic!("{p:?} on {addr} must be accepted: {e}"));
}

fn drain(on: bool) -> ServerPatch {
    ServerPatch {
        drain: Some(on),
        ..Default::default()
    }
}

fn down(on: bool) -> ServerPatch {
    ServerPatch {
        down: Some(on),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn drained_server_leaves_the_table_but_stays_live() {
    let mut h = running().await;
    let [a, b, c] = three();
    patch(&mut h, a, drain(true)).await;
    assert_eq!(h.slots("web", a), 0, "a draining server takes no new flow");
    assert!(
        h.live("web", a),
        "a draining server keeps its pinned flows (LIVE)"
    );
    assert_eq!(h.state("web", a), "draining");
    assert!(h.slots("web", b) > 0 && h.slots("web", c) > 0);
    assert_eq!(h.empty_slots("web"), 0);
    assert!(
        h.server_status("web", a)
            .differs_from_config
            .iter()
            .any(|d| d.contains("drain")),
        "status says the server is drained at runtime"
    );
    // Health keeps running underneath, and probes do not undo the drain.
    h.run_for(secs(3)).await;
    assert_eq!(h.state("web", a), "draining");
    assert_eq!(h.slots("web", a), 0);

    patch(&mut h, a, drain(false)).await;
    assert!(h.slots("web", a) > 0, "undrain puts the server back");
    assert_eq!(h.state("web", a), "up");
}

#[tokio::test(start_paused = true)]
async fn downed_server_is_not_live() {
    let mut h = running().await;
    let [a, ..] = three();
    patch(&mut h, a, down(true)).await;
    assert_eq!(h.slots("web", a), 0);
    assert!(!h.live("web", a), "a downed server's pinned flows re-hash");
    assert_eq!(h.state("web", a), "down");
    patch(&mut h, a, down(false)).await;
    assert!(h.slots("web", a) > 0, "up again after `down = false`");
    assert!(h.live("web", a));
    assert_eq!(h.state("web", a), "up");
}

#[tokio::test(start_paused = true)]
async fn weight_change_changes_the_slot_share() {
    let mut h = running().await;
    let [a, b, c] = three();
    for x in three() {
        let s = h.share("web", x);
        assert!(
            (s - 1.0 / 3.0).abs() < 0.01,
            "setup: equal shares, {x} has {s:.4}"
        );
    }
    patch(
        &mut h,
        a,
        ServerPatch {
            weight: Some(3),
            ..Default::default()
        },
    )
    .await;
    let (sa_, sb, sc) = (h.share("web", a), h.share("web", b), h.share("web", c));
    assert!(
        (sa_ - 0.6).abs() < 0.01,
        "weight 3 of 5 must hold 60% of the slots within 1%, got {sa_:.4}"
    );
    for (x, s) in [(b, sb), (c, sc)] {
        assert!(
            (s - 0.2).abs() < 0.01,
            "weight 1 of 5 must hold 20% within 1%, {x} has {s:.4}"
        );
    }
    assert_eq!(h.server_status("web", a).weight, 3);
}

#[tokio::test(start_paused = true)]
async fn added_server_gets_slots_once_its_mac_resolves() {
    let neighbours = LearnedNeighbours::default();
    for a in three() {
        neighbours.learn(a.ip(), MAC);
    }
    let mut h = Harness::with_neighbours(&config(), neighbours).await;
    h.run_for(secs(2)).await;
    let d = sa("10.0.1.4:80");
    h.add_server("web", d)
        .await
        .expect("adding a server must be accepted");
    assert_eq!(
        h.state("web", d),
        "checking",
        "added at runtime: held back until its probe passes (docs/probes.md)"
    );
    h.run_until(secs(2), |h| h.state("web", d) == "up")
        .await
        .expect("its first probe passes within the 1s interval");
    assert_eq!(h.slots("web", d), 0, "no MAC yet: not selectable");
    assert!(!h.live("web", d));
    let st = h.server_status("web", d);
    assert!(
        st.mac.is_none() && !st.active,
        "status says the MAC is unknown"
    );

    h.run_for(secs(5)).await;
    assert_eq!(h.slots("web", d), 0, "still no MAC: still no slot");
    h.neighbours.learn(d.ip(), MAC);
    let took = h
        .run_until(secs(10), |h| h.slots("web", d) > 0)
        .await
        .expect("the MAC retry must publish the server once its MAC is known");
    assert!(took <= secs(2), "MACs are retried every 2s, took {took:?}");
    assert!(h.live("web", d));
    h.run_for(secs(1)).await;
    let st = h.server_status("web", d);
    let mac = MAC.map(|b| format!("{b:02x}")).join(":");
    assert_eq!(
        st.mac.as_deref(),
        Some(mac.as_str()),
        "status shows the MAC"
    );
    assert!(st.active, "status shows the server in the table");
    assert!((h.share("web", d) - 0.25).abs() < 0.01);
    assert!(
        h.server_status("web", d)
            .differs_from_config
            .iter()
            .any(|x| x.contains("added at runtime"))
    );
}

#[tokio::test(start_paused = true)]
async fn added_server_is_probed_and_held_back_while_it_fails() {
    let mut h = running().await;
    let d = sa("10.0.1.4:80");
    h.set(d, crate::util::Verdict::Refuse);
    h.add_server("web", d)
        .await
        .expect("adding a server must be accepted");
    assert_eq!(
        h.slots("web", d),
        0,
        "held back although the probe is not essential"
    );
    let added = tokio::time::Instant::now();
    let ever = h.run_until(secs(5), |h| h.slots("web", d) > 0).await;
    assert_eq!(ever, None, "a failing added server never gets a slot");
    assert!(
        h.prober.calls_to(d, added).len() >= 3,
        "an added server is probed like the others"
    );
    assert_eq!(h.state("web", d), "checking");
}

#[tokio::test(start_paused = true)]
async fn removed_server_takes_no_new_flow_but_keeps_its_established_ones() {
    let mut h = running().await;
    let [a, b, c] = three();
    h.admin("web", "10.0.1.2:80", AdminChange::Remove)
        .await
        .expect("removing a server must be accepted");
    assert_eq!(h.slots("web", b), 0);
    assert!(
        h.live("web", b) && !h.serving("web", b),
        "a removed server's established flows stay (LIVE without SERVING)"
    );
    assert!(
        !h.service_status("web")
            .servers
            .iter()
            .any(|s| s.address == "10.0.1.2:80"),
        "a removed server leaves the status"
    );
    assert!((h.share("web", a) - 0.5).abs() < 0.01);
    assert!((h.share("web", c) - 0.5).abs() < 0.01);
    let since = tokio::time::Instant::now();
    h.run_for(secs(5)).await;
    assert!(
        h.prober.calls_to(b, since).is_empty(),
        "a removed server is no longer probed"
    );
}

#[tokio::test(start_paused = true)]
async fn removed_server_id_is_freed_once_its_flows_are_idle() {
    let mut h = running().await;
    let b = three()[1];
    let id = h.backend_ids("web", b)[0];
    h.admin("web", "10.0.1.2:80", AdminChange::Remove)
        .await
        .expect("remove");
    // Its pinned flows keep forwarding packets for 20 minutes.
    for minute in 1..=20u64 {
        h.agent_mut().dataplane_mut().backend_stats.insert(
            id,
            BackendStats {
                packets: minute * 100,
                ..Default::default()
            },
        );
        h.run_for(secs(60)).await;
    }
    assert!(
        h.live("web", b),
        "still forwarding after 20 minutes: established flows stay"
    );
    // Then silence (the last new packets were seen about 60 s ago): freed after 900 s
    // without a packet.
    h.run_for(secs(800)).await;
    assert!(h.live("web", b), "idle for about 860 s: not yet");
    h.run_for(secs(100)).await;
    assert!(
        !h.live("web", b),
        "idle for 900 s: the id is freed, flows re-hash"
    );
}

#[tokio::test(start_paused = true)]
async fn a_server_added_back_while_its_flows_run_keeps_its_id() {
    let mut h = running().await;
    let b = three()[1];
    let id = h.backend_ids("web", b)[0];
    h.admin("web", "10.0.1.2:80", AdminChange::Remove)
        .await
        .expect("remove");
    h.run_for(secs(30)).await;
    h.add_server("web", b).await.expect("add back");
    assert_eq!(
        h.backend_ids("web", b),
        vec![id],
        "the same id: flows pinned to it continue"
    );
    h.run_until(secs(5), |h| h.serving("web", b))
        .await
        .expect("back in traffic");
    h.run_for(secs(1000)).await;
    assert!(h.live("web", b), "no longer departing: never freed");
}

#[tokio::test(start_paused = true)]
async fn admin_refuses_unknown_service_unknown_server_and_zero_weight() {
    let mut h = running().await;
    let before = h.agent().dataplane().log.len();
    let err = h
        .admin("nope", "10.0.1.1:80", AdminChange::Patch(drain(true)))
        .await;
    assert_eq!(err, Err(AdminError::NoService("nope".into())));
    let err = h
        .admin("web", "10.0.9.9:80", AdminChange::Patch(drain(true)))
        .await;
    assert!(
        matches!(err, Err(AdminError::NoServer { .. })),
        "unknown server: {err:?}"
    );
    let err = h.admin("web", "10.0.9.9:80", AdminChange::Remove).await;
    assert!(matches!(err, Err(AdminError::NoServer { .. })), "{err:?}");
    let err = h
        .admin(
            "web",
            "10.0.1.1:80",
            AdminChange::Patch(ServerPatch {
                weight: Some(0),
                ..Default::default()
            }),
        )
        .await;
    assert!(
        matches!(err, Err(AdminError::Invalid(_))),
        "weight 0: {err:?}"
    );
    let err = h.add_server("web", sa("10.0.1.1:80")).await;
    assert!(
        matches!(err, Err(AdminError::Invalid(_))),
        "duplicate: {err:?}"
    );
    assert_eq!(
        h.agent().dataplane().log.len(),
        before,
        "a refused change writes nothing"
    );
    assert_eq!(h.state("web", sa("10.0.1.1:80")), "up");
}

#[tokio::test(start_paused = true)]
async fn admin_refuses_weight_above_max_weight() {
    // The config file allows weight 1..=MAX_WEIGHT; the API must not get around it.
    let mut h = running().await;
    let too_heavy = lb_agent::config::MAX_WEIGHT + 1;
    let err = h
        .admin(
            "web",
            "10.0.1.1:80",
            AdminChange::Patch(ServerPatch {
                weight: Some(too_heavy),
                ..Default::default()
            }),
        )
        .await;
    assert!(
        matches!(err, Err(AdminError::Invalid(_))),
        "weight {too_heavy} is above MAX_WEIGHT and must be refused: {err:?}"
    );
    let err = h
        .admin(
            "web",
            "10.0.1.4:80",
            AdminChange::Add(NewServer {
                address: sa("10.0.1.4:80"),
                weight: too_heavy,
                spare: false,
                backup: 0,
            }),
        )
        .await;
    assert!(
        matches!(err, Err(AdminError::Invalid(_))),
        "adding with weight {too_heavy} must be refused: {err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn admin_refuses_a_dsr_server_on_another_port_than_the_vip() {
    // The config file requires it: dsr keeps the destination port, so the server would
    // get traffic on the VIP's port while its probes check another.
    let dsr = "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nforwarding = \"dsr\"\n\
               [[service.server]]\naddress = \"10.0.1.1:80\"\n";
    let mut h = Harness::start(dsr).await;
    let err = h.add_server("web", sa("10.0.1.4:8080")).await;
    assert!(
        matches!(err, Err(AdminError::Invalid(_))),
        "dsr keeps the VIP port: a server on port 8080 behind VIP port 80 must be refused: {err:?}"
    );
}

/// A server given without its port, as the config allows one: the service's one server
/// at that IP; an IP with several servers, or none, is refused.
#[tokio::test(start_paused = true)]
async fn a_server_without_its_port_is_the_services_one_server_at_that_ip() {
    let mut h = Harness::start(&web(
        "",
        &servers(&[
            ("10.0.1.1:80", ""),
            ("10.0.1.2:80", ""),
            ("10.0.1.2:81", ""),
        ]),
    ))
    .await;
    h.run_for(secs(1)).await;
    h.admin("web", "10.0.1.1", AdminChange::Patch(drain(true)))
        .await
        .expect("10.0.1.1 is the one server at that IP");
    assert_eq!(h.slots("web", sa("10.0.1.1:80")), 0, "drained");
    let several = h
        .admin("web", "10.0.1.2", AdminChange::Patch(drain(true)))
        .await
        .unwrap_err();
    assert!(
        matches!(&several, AdminError::Invalid(m) if m.contains("several servers at 10.0.1.2")),
        "{several:?}"
    );
    let none = h
        .admin("web", "10.0.1.9", AdminChange::Patch(drain(true)))
        .await
        .unwrap_err();
    assert!(matches!(none, AdminError::NoServer { .. }), "{none:?}");
}
