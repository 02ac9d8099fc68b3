//! The snapshot is built when a reader asks (`lb-agent run`), not after every verdict or
//! admin change; a read after a change still sees it.

use std::net::SocketAddr;

use crate::util::{Harness, Verdict, ms, sa, secs, servers, web};
use lb_agent::agent::SNAPSHOT_EVERY;
use lb_agent::api::{AdminChange, AdminRequest, ServerPatch};
use lb_agent::view::Snapshot;
use tokio::sync::oneshot;

fn config() -> String {
    web(
        "",
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")])
            + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\nfails = 1\npasses = 1\n"),
    )
}

/// The agent with both servers up, the loop leaving the snapshot to readers.
async fn running() -> Harness {
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(3)).await;
    assert_eq!(h.state("web", sa("10.0.1.1:80")), "up");
    h.snapshots_on_demand = true;
    h
}

fn state_in(snap: &Snapshot, addr: SocketAddr) -> String {
    snap.services[0]
        .servers
        .iter()
        .find(|s| s.address == addr.to_string())
        .expect("the server is in the snapshot")
        .state
        .clone()
}

#[tokio::test(start_paused = true)]
async fn an_admin_change_answers_without_a_rebuild_and_the_next_read_sees_it() {
    let mut h = running().await;
    let a = sa("10.0.1.1:80");
    let builds = h.agent().snapshot_builds();
    let (reply, answer) = oneshot::channel();
    h.agent_mut()
        .on_admin(AdminRequest {
            service: "web".into(),
            address: a.to_string(),
            change: AdminChange::Patch(ServerPatch {
                drain: Some(true),
                ..Default::default()
            }),
            reply,
        })
        .await;
    answer.await.unwrap().expect("the drain is accepted");
    h.agent_mut().answer_readers();
    assert_eq!(
        h.agent().snapshot_builds(),
        builds,
        "the change was answered without building the snapshot"
    );
    assert_eq!(
        state_in(&h.snapshot(), a),
        "up",
        "the last built one is older"
    );

    let before = tokio::time::Instant::now();
    let snap = h.read_snapshot().await;
    assert_eq!(tokio::time::Instant::now(), before, "the read did not wait");
    assert_eq!(state_in(&snap, a), "draining", "the read sees the change");
    assert_eq!(h.agent().snapshot_builds(), builds + 1);

    let again = h.read_snapshot().await;
    assert_eq!(state_in(&again, a), "draining");
    assert_eq!(
        h.agent().snapshot_builds(),
        builds + 1,
        "a read right after an unchanged one is served from the cache"
    );
}

#[tokio::test(start_paused = true)]
async fn verdicts_do_not_rebuild_and_a_read_after_them_sees_them() {
    let mut h = running().await;
    let a = sa("10.0.1.1:80");
    // A read now, so that the next one would be inside the rebuild interval.
    let _ = h.read_snapshot().await;
    let builds = h.agent().snapshot_builds();
    h.set(a, Verdict::Refuse);
    let took = h
        .run_until(secs(5), |h| h.slots("web", a) == 0)
        .await
        .expect("the failing server leaves the table");
    assert!(took > ms(0));
    assert_eq!(
        h.agent().snapshot_builds(),
        builds,
        "verdicts, publishes and stats polls built no snapshot"
    );
    assert_eq!(
        state_in(&h.snapshot(), a),
        "up",
        "the last built one is older"
    );

    let snap = h.read_snapshot().await;
    assert_ne!(state_in(&snap, a), "up", "the read sees the verdict");
    assert_eq!(h.agent().snapshot_builds(), builds + 1);
}

#[tokio::test(start_paused = true)]
async fn a_read_soon_after_a_rebuild_waits_for_the_interval_when_state_changed() {
    let mut h = running().await;
    let _ = h.read_snapshot().await;
    let built = tokio::time::Instant::now();
    let builds = h.agent().snapshot_builds();
    // A change that is not an admin change (the link watch reports a new mode).
    h.agent_mut().set_xdp_mode("skb");
    let snap = h.read_snapshot().await;
    assert!(
        tokio::time::Instant::now() >= built + SNAPSHOT_EVERY,
        "the read waited until the last rebuild was one interval old"
    );
    assert_eq!(snap.xdp_mode, "skb", "the waiting read sees the change");
    assert_eq!(h.agent().snapshot_builds(), builds + 1);
}
