//! DESIGN.md §5 detection and recovery bounds (TR7), measured in simulated time through
//! the whole agent: probe tasks, health, membership, publishing into the Maglev table.

use std::time::Duration;

use crate::util::{Harness, Verdict, secs, servers, web};

const INTERVAL: Duration = Duration::from_secs(2);
const TIMEOUT: Duration = Duration::from_secs(1);
const FAILS: u32 = 3;
const PASSES: u32 = 2;

fn config() -> String {
    web(
        "",
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")])
            + "[[service.probe]]\nname = \"health\"\ntype = \"http\"\n\
               interval = \"2s\"\ntimeout = \"1s\"\nfails = 3\npasses = 2\n"),
    )
}

/// Both servers up, in the table, after every probe has run a few times.
async fn running() -> Harness {
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(5)).await;
    for a in ["10.0.1.1:80", "10.0.1.2:80"] {
        let a = crate::util::sa(a);
        assert!(h.slots("web", a) > 0, "setup: {a} must be in the table");
        assert_eq!(h.state("web", a), "up", "setup: {a} must be up");
    }
    h
}

#[tokio::test(start_paused = true)]
async fn silent_server_leaves_table_within_fails_times_interval_plus_timeout() {
    let mut h = running().await;
    let a = crate::util::sa("10.0.1.1:80");
    h.set(a, Verdict::Silent);
    let bound = (INTERVAL + TIMEOUT) * FAILS;
    let took = h
        .run_until(bound * 2, |h| h.slots("web", a) == 0)
        .await
        .unwrap_or_else(|| {
            panic!(
                "a silent server must leave the table, still in after {:?}",
                bound * 2
            )
        });
    assert!(
        took <= bound,
        "a silent server must leave within fails × (interval + timeout) = {bound:?}, took {took:?}"
    );
    // It cannot be faster than `fails` timeouts, the first one starting right away.
    let floor = INTERVAL * (FAILS - 1) + TIMEOUT;
    assert!(
        took >= floor,
        "{FAILS} timeouts cannot be seen in less than {floor:?}, took {took:?}"
    );
    assert_eq!(h.state("web", a), "unhealthy");
    assert!(
        h.live("web", a) && !h.serving("web", a),
        "a failed server takes no new flow; its established flows stay (LIVE kept)"
    );
    let other = crate::util::sa("10.0.1.2:80");
    assert_eq!(
        h.slots("web", other) + h.empty_slots("web"),
        h.table("web").len(),
        "the remaining server takes every slot"
    );
    assert_eq!(h.empty_slots("web"), 0, "no slot may be left empty");
}

#[tokio::test(start_paused = true)]
async fn refusing_server_leaves_within_fails_times_interval() {
    let mut h = running().await;
    let a = crate::util::sa("10.0.1.1:80");
    h.set(a, Verdict::Refuse);
    let bound = INTERVAL * FAILS;
    let took = h
        .run_until(bound * 2, |h| h.slots("web", a) == 0)
        .await
        .unwrap_or_else(|| {
            panic!(
                "a refusing server must leave the table, still in after {:?}",
                bound * 2
            )
        });
    assert!(
        took <= bound,
        "a refused probe fails at once: out within fails × interval = {bound:?}, took {took:?}"
    );
    let silent_floor = INTERVAL * (FAILS - 1) + TIMEOUT;
    assert!(
        took < silent_floor,
        "a refusing server must leave before any silent one could ({silent_floor:?}), took {took:?}"
    );
    assert_eq!(h.state("web", a), "unhealthy");
    assert!(!h.serving("web", a), "SERVING must be cleared");
    assert!(h.live("web", a), "established flows stay: LIVE is kept");
}

#[tokio::test(start_paused = true)]
async fn failed_server_returns_after_passes_within_passes_times_interval() {
    let mut h = running().await;
    let a = crate::util::sa("10.0.1.1:80");
    h.set(a, Verdict::Refuse);
    h.run_until(secs(30), |h| h.slots("web", a) == 0)
        .await
        .expect("setup: a refusing server leaves the table");
    h.run_for(secs(3)).await;
    let before = h.server_status("web", a).health.probes["health"].count;

    h.set(a, Verdict::Pass);
    let bound = INTERVAL * PASSES;
    let took = h
        .run_until(bound * 3, |h| h.slots("web", a) > 0)
        .await
        .unwrap_or_else(|| {
            panic!(
                "a recovered server must return, still out after {:?}",
                bound * 3
            )
        });
    assert!(
        took <= bound,
        "recovery must take at most passes × interval = {bound:?}, took {took:?}"
    );
    let floor = INTERVAL * (PASSES - 1);
    assert!(
        took >= floor,
        "recovery needs {PASSES} passes, at least {floor:?}, took {took:?}"
    );
    let st = h.server_status("web", a);
    assert_eq!(st.state, "up");
    assert_eq!(
        st.health.probes["health"].count - before,
        u64::from(PASSES),
        "the server must return on its {PASSES}th passing probe, not before or after"
    );
    assert!(h.live("web", a), "a returned server is LIVE");
}

#[tokio::test(start_paused = true)]
async fn silent_server_with_timeout_longer_than_interval_leaves_within_bound() {
    // Probes that outlast their interval skip ticks; the bound still holds.
    let text = web(
        "",
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")])
            + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\ntimeout = \"2500ms\"\nfails = 2\n"),
    );
    let mut h = Harness::start(&text).await;
    h.run_for(secs(3)).await;
    let a = crate::util::sa("10.0.1.1:80");
    h.set(a, Verdict::Silent);
    let bound = (secs(1) + Duration::from_millis(2500)) * 2;
    let took = h
        .run_until(bound * 2, |h| h.slots("web", a) == 0)
        .await
        .unwrap_or_else(|| panic!("a silent server must leave the table"));
    assert!(
        took <= bound,
        "out within fails × (interval + timeout) = {bound:?}, took {took:?}"
    );
    let starts: Vec<_> = h
        .prober
        .calls()
        .into_iter()
        .filter(|c| c.target == a && c.verdict == Verdict::Silent)
        .map(|c| c.started)
        .collect();
    for w in starts.windows(2) {
        assert!(
            w[1] - w[0] >= Duration::from_millis(2500),
            "probes of one server must never overlap: started {:?} apart",
            w[1] - w[0]
        );
    }
}
