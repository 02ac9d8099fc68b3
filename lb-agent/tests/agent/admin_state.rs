//! The one rule for runtime admin changes (docs/admin-state.md): drain, down, weight,
//! spare and servers added at runtime stay in force across reloads and restarts (the
//! state file) until cleared through the API; what no longer fits the config is dropped
//! and reported.

use std::net::SocketAddr;

use crate::util::{Harness, sa, secs, servers, web};
use lb_agent::{
    agent::AdminState,
    api::{AdminChange, NewServer, ServerPatch},
};

fn config(addrs: &[&str]) -> String {
    let list: Vec<(&str, &str)> = addrs.iter().map(|a| (*a, "weight = 2\n")).collect();
    web(
        "",
        &(servers(&list) + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n"),
    )
}

const AB: [&str; 2] = ["10.0.1.1:80", "10.0.1.2:80"];

fn a() -> SocketAddr {
    sa("10.0.1.1:80")
}
fn b() -> SocketAddr {
    sa("10.0.1.2:80")
}
fn added() -> SocketAddr {
    sa("10.0.1.9:80")
}

async fn patch(h: &mut Harness, addr: SocketAddr, p: ServerPatch) {
    h.admin("web", &addr.to_string(), AdminChange::Patch(p.clone()))
        .await
        .unwrap_or_else(|e| panic!("{p:?} on {addr}: {e}"));
}

/// Runs `AB`, then: `a` down, `b` weight 7 and drained, server `added` added (weight 3).
async fn changed(addrs: &[&str]) -> Harness {
    let mut h = Harness::start(&config(addrs)).await;
    h.run_for(secs(2)).await;
    patch(
        &mut h,
        a(),
        ServerPatch {
            down: Some(true),
            ..Default::default()
        },
    )
    .await;
    patch(
        &mut h,
        b(),
        ServerPatch {
            weight: Some(7),
            drain: Some(true),
            ..Default::default()
        },
    )
    .await;
    h.admin(
        "web",
        &added().to_string(),
        AdminChange::Add(NewServer {
            address: added(),
            weight: 3,
            spare: false,
            backup: 0,
        }),
    )
    .await
    .expect("add accepted");
    h.run_until(secs(3), |h| h.state("web", added()) == "up")
        .await
        .expect("setup: the added server comes up");
    h
}

fn assert_changes_in_force(h: &Harness, when: &str) {
    assert_eq!(h.state("web", a()), "down", "{when}: a stays down");
    assert_eq!(h.state("web", b()), "draining", "{when}: b stays drained");
    let b_status = h.server_status("web", b());
    assert_eq!(b_status.weight, 7, "{when}: b keeps its runtime weight");
    assert!(
        b_status
            .differs_from_config
            .iter()
            .any(|d| d == "weight 7 (file: 2)"),
        "{when}: status shows the override: {:?}",
        b_status.differs_from_config
    );
    assert_eq!(
        h.state("web", added()),
        "up",
        "{when}: the added server stays, up"
    );
    assert_eq!(h.server_status("web", added()).weight, 3);
    assert!(h.slots("web", added()) > 0, "{when}: and keeps its slots");
    assert_eq!(h.slots("web", a()), 0);
    assert_eq!(h.slots("web", b()), 0);
}

#[tokio::test(start_paused = true)]
async fn down_weight_drain_and_added_servers_survive_a_reload() {
    let mut h = changed(&AB).await;
    h.reload(&config(&AB)).await;
    assert_changes_in_force(&h, "after a reload");
    // The file's new weight for b does not undo the runtime one either.
    h.reload(&config(&AB).replace("weight = 2", "weight = 4"))
        .await;
    assert_eq!(h.server_status("web", b()).weight, 7);
    assert!(
        h.server_status("web", b())
            .differs_from_config
            .contains(&"weight 7 (file: 4)".to_string())
    );
}

#[tokio::test(start_paused = true)]
async fn reset_returns_a_server_to_the_file_and_setting_the_file_value_clears_it() {
    let mut h = changed(&AB).await;
    patch(
        &mut h,
        b(),
        ServerPatch {
            reset: Some(true),
            ..Default::default()
        },
    )
    .await;
    let b_status = h.server_status("web", b());
    assert_eq!((b_status.weight, b_status.state.as_str()), (2, "up"));
    assert!(b_status.differs_from_config.is_empty(), "{b_status:?}");
    patch(
        &mut h,
        a(),
        ServerPatch {
            down: Some(false),
            ..Default::default()
        },
    )
    .await;
    let state = h.agent().admin_state().services["web"].clone();
    assert!(
        !state.contains_key(&a()) && !state.contains_key(&b()),
        "up and reset leave nothing to keep: {state:?}"
    );
    h.reload(&config(&AB)).await;
    assert_eq!(h.state("web", a()), "up");
    assert_eq!(h.server_status("web", b()).weight, 2);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_restores_the_state_file_and_drops_what_no_longer_fits() {
    let dir = std::env::temp_dir().join(format!("lb-admin-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("sub").join("admin-state.json");
    let mut h = changed(&AB).await;
    let state = h.agent().admin_state().clone();
    h.agent_mut().keep_admin_state(Some(path.clone()), state);
    // Any change saves the whole state.
    patch(
        &mut h,
        a(),
        ServerPatch {
            down: Some(true),
            ..Default::default()
        },
    )
    .await;
    let saved = AdminState::load(&path).expect("the state file reads back");
    assert_eq!(&saved, h.agent().admin_state());
    assert!(
        !path.with_extension("tmp").exists(),
        "written through a temporary file that is renamed"
    );
    drop(h);

    // A new agent, as `lb-agent run` starts it: the file, then the saved state.
    let mut fresh = Harness::start(&config(&AB)).await;
    fresh
        .agent_mut()
        .keep_admin_state(Some(path.clone()), AdminState::load(&path).unwrap());
    let report = fresh
        .agent_mut()
        .apply_config_reporting(&crate::util::parse(&config(&AB)))
        .await
        .unwrap();
    fresh.agent_mut().publish_snapshot();
    assert_eq!(report.applied.len(), 3, "{report:?}");
    assert!(report.dropped.is_empty(), "{report:?}");
    fresh
        .run_until(secs(3), |h| h.state("web", added()) == "up")
        .await
        .expect("the restored added server passes its probe");
    assert_changes_in_force(&fresh, "after a restart");

    // b leaves the file: its override is dropped, reported and the file rewritten.
    let report = fresh
        .agent_mut()
        .apply_config_reporting(&crate::util::parse(&config(&AB[..1])))
        .await
        .unwrap();
    assert_eq!(report.dropped.len(), 1, "{report:?}");
    assert!(
        report.dropped[0].contains("10.0.1.2:80")
            && report.dropped[0].contains("no longer in the config"),
        "{report:?}"
    );
    let saved = AdminState::load(&path).unwrap();
    assert!(!saved.services["web"].contains_key(&b()), "{saved:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(start_paused = true)]
async fn an_added_server_the_file_now_lists_follows_the_file() {
    let mut h = changed(&AB).await;
    h.reload(&config(&["10.0.1.1:80", "10.0.1.2:80", "10.0.1.9:80"]))
        .await;
    let s = h.server_status("web", added());
    assert_eq!(s.weight, 2, "the file's weight applies");
    assert!(s.differs_from_config.is_empty(), "{s:?}");
    assert!(
        !h.agent().admin_state().services["web"].contains_key(&added()),
        "no longer a runtime addition"
    );
    // Removed from the file again: it goes (it is a file server now).
    h.reload(&config(&AB)).await;
    assert!(
        h.snapshot().services[0]
            .servers
            .iter()
            .all(|v| v.address != added().to_string())
    );
}

#[test]
fn a_corrupt_or_foreign_state_file_is_an_error_and_a_missing_one_is_empty() {
    let dir = std::env::temp_dir().join(format!("lb-admin-state-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.json");
    assert!(AdminState::load(&path).unwrap().is_empty());
    std::fs::write(&path, "{not json").unwrap();
    assert!(AdminState::load(&path).is_err());
    std::fs::write(&path, r#"{"version": 99, "services": {}}"#).unwrap();
    let err = AdminState::load(&path).unwrap_err().to_string();
    assert!(err.contains("version 99"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(start_paused = true)]
async fn an_added_server_keeps_traffic_when_a_reload_changes_the_probes() {
    let probe = |interval: &str| {
        format!(
            "[[service.probe]]\ntype = \"tcp\"\ninterval = \"{interval}\"\nessential = true\npersistent = true\n"
        )
    };
    let text = |interval: &str| web("", &(servers(&[("10.0.1.1:80", "")]) + &probe(interval)));
    let mut h = Harness::start(&text("1s")).await;
    h.run_for(secs(2)).await;
    h.admin(
        "web",
        &added().to_string(),
        AdminChange::Add(NewServer {
            address: added(),
            weight: 1,
            spare: false,
            backup: 0,
        }),
    )
    .await
    .expect("add accepted");
    h.run_until(secs(3), |h| h.state("web", added()) == "up")
        .await
        .expect("setup: the added server passes its essential probe");
    h.reload(&text("2s")).await;
    assert_eq!(
        h.state("web", added()),
        "up",
        "a persistent essential probe is skipped for a server that was up, added or not"
    );
    assert!(h.slots("web", added()) > 0);
    assert_eq!(
        h.server_status("web", added()).differs_from_config,
        ["added at runtime"]
    );
}
