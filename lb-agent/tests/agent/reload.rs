//! Reloads through the event loop (what SIGHUP does): kept servers keep their
//! state, removed ones leave, added ones join (held back until every probe passes; one
//! added back while its flows still run keeps them meanwhile); a
//! changed probe config restarts health, skipping `persistent` essential probes for
//! servers that were up; an unchanged one re-runs a non-persistent essential probe on up
//! servers (Angie), the servers keeping their established flows meanwhile.

use std::net::SocketAddr;

use crate::util::{Harness, Verdict, sa, secs, servers, web};
use lb_agent::api::{AdminChange, ServerPatch};
use lb_agent::probe::PROMPT_SPREAD;
use tokio::time::Instant;

/// `web` with the given servers and one probe `ready` (`probe` lines appended).
fn config(extra: &str, addrs: &[&str], probe: &str) -> String {
    let list: Vec<(&str, &str)> = addrs.iter().map(|a| (*a, "")).collect();
    web(
        extra,
        &(servers(&list)
            + "[[service.probe]]\nname = \"ready\"\ntype = \"http\"\ninterval = \"1s\"\n"
            + probe),
    )
}

fn a() -> SocketAddr {
    sa("10.0.1.1:80")
}
fn b() -> SocketAddr {
    sa("10.0.1.2:80")
}
fn c() -> SocketAddr {
    sa("10.0.1.3:80")
}
fn d() -> SocketAddr {
    sa("10.0.1.4:80")
}

const ABC: [&str; 3] = ["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"];

/// `a`, `b`, `c` up after passing; then `b` refusing until unhealthy.
async fn b_failed(extra: &str, probe: &str) -> Harness {
    let mut h = Harness::start(&config(extra, &ABC, probe)).await;
    h.run_for(secs(2)).await;
    for x in [a(), b(), c()] {
        assert_eq!(h.state("web", x), "up", "setup: {x} is up");
    }
    h.set(b(), Verdict::Refuse);
    h.run_until(secs(5), |h| h.state("web", b()) == "unhealthy")
        .await
        .expect("setup: b turns unhealthy");
    h
}

fn events_since(h: &Harness, n: usize) -> Vec<lb_agent::view::Event> {
    h.events
        .try_lock()
        .expect("nobody else holds the event log")
        .iter()
        .skip(n)
        .cloned()
        .collect()
}

fn event_count(h: &Harness) -> usize {
    h.events.try_lock().expect("event log").len()
}

#[tokio::test(start_paused = true)]
async fn reload_keeps_unchanged_servers_state_removes_and_adds() {
    // persistent: an up server keeps traffic across the reload (without it, see
    // `plain_reload_checks_up_servers_again_on_a_non_persistent_essential_probe`).
    let essential = "essential = true\npersistent = true\n";
    let mut h = b_failed("", essential).await;
    let before = event_count(&h);
    let a_count = h.server_status("web", a()).health.probes["ready"].count;

    // c removed, d added; a and b unchanged.
    h.reload(&config(
        "",
        &["10.0.1.1:80", "10.0.1.2:80", "10.0.1.4:80"],
        essential,
    ))
    .await;
    let reloaded = Instant::now();
    assert_eq!(h.state("web", a()), "up", "an unchanged up server stays up");
    assert!(h.slots("web", a()) > 0, "and keeps its slots");
    assert!(
        h.server_status("web", a()).health.probes["ready"].count >= a_count,
        "an unchanged server keeps its probe statistics"
    );
    assert_eq!(
        h.state("web", b()),
        "unhealthy",
        "an unchanged unhealthy server stays unhealthy (not a fresh `checking`)"
    );
    assert_eq!(h.slots("web", b()), 0);
    assert!(
        h.live("web", c()) && !h.serving("web", c()),
        "a server removed by reload takes no new flow; its established flows stay"
    );
    assert_eq!(h.slots("web", c()), 0);
    assert_eq!(
        h.state("web", d()),
        "checking",
        "an added server with an essential probe starts checking"
    );
    let ev = events_since(&h, before);
    assert!(
        !ev.iter()
            .any(|e| e.server == "10.0.1.1:80" || e.server == "10.0.1.2:80"),
        "unchanged servers must have no transition at reload: {ev:?}"
    );

    h.run_until(secs(2), |h| h.slots("web", d()) > 0)
        .await
        .expect("the added server gets slots after its first pass");
    assert_eq!(h.state("web", b()), "unhealthy");
    h.run_for(secs(3)).await;
    assert!(
        h.prober.calls_to(c(), reloaded).is_empty(),
        "a removed server is no longer probed"
    );
    assert!(
        !h.prober.calls_to(b(), reloaded).is_empty(),
        "a kept server is still probed"
    );
}

#[tokio::test(start_paused = true)]
async fn reload_keeps_runtime_admin_state_of_kept_servers() {
    let mut h = b_failed("", "").await;
    h.admin(
        "web",
        "10.0.1.1:80",
        AdminChange::Patch(ServerPatch {
            drain: Some(true),
            ..Default::default()
        }),
    )
    .await
    .expect("drain accepted");
    h.reload(&config("", &ABC, "")).await;
    assert_eq!(
        h.state("web", a()),
        "draining",
        "admin states survive a reload"
    );
    assert_eq!(h.slots("web", a()), 0);
    // A probe change restarts health but keeps the admin state too.
    h.reload(&config("", &ABC, "timeout = \"500ms\"\n")).await;
    assert_eq!(h.state("web", a()), "draining");
    assert_eq!(h.slots("web", a()), 0);
    assert!(h.live("web", a()));
}

#[tokio::test(start_paused = true)]
async fn changed_probe_skips_persistent_essential_probes_for_servers_that_were_up() {
    let probe = "essential = true\npersistent = true\n";
    let mut h = b_failed("", probe).await;
    let a_slots = h.slots("web", a());

    // interval 1s -> 2s: the probe changed.
    let changed = "essential = true\npersistent = true\ninterval = \"2s\"\n";
    let text = config("", &ABC, "").replace("interval = \"1s\"\n", "") + changed;
    h.reload(&text).await;
    let reloaded = Instant::now();
    for x in [a(), c()] {
        assert_eq!(
            h.state("web", x),
            "up",
            "{x} was up: its persistent essential probe is skipped"
        );
        assert!(h.slots("web", x) > 0, "{x} keeps slots across the reload");
    }
    assert_eq!(h.slots("web", a()), a_slots, "no slot of a moved");
    assert_eq!(
        h.state("web", b()),
        "unhealthy",
        "b was down: it must pass again before it gets traffic"
    );
    assert_eq!(h.slots("web", b()), 0);
    assert_eq!(
        h.server_status("web", a()).health.probes["ready"].count,
        0,
        "health restarted: fresh probe statistics"
    );

    h.run_for(secs(5)).await;
    let new_calls = h.prober.calls_to(a(), reloaded);
    assert!(
        !new_calls.is_empty() && new_calls.iter().all(|c| c.interval == secs(2)),
        "after the reload only the new probe config runs: {new_calls:?}"
    );
    assert_eq!(h.state("web", a()), "up");

    h.set(b(), Verdict::Pass);
    h.run_until(secs(5), |h| h.slots("web", b()) > 0)
        .await
        .expect("b returns once it passes");
}

#[tokio::test(start_paused = true)]
async fn changed_non_persistent_essential_probe_checks_up_servers_again() {
    // fail_open = false so that the checking servers' table is not refilled by fail-open.
    let mut h = Harness::start(&config(
        "fail_open = false",
        &ABC[..2],
        "essential = true\n",
    ))
    .await;
    h.run_for(secs(2)).await;
    assert_eq!(h.state("web", a()), "up", "setup");
    h.reload(&config(
        "fail_open = false",
        &ABC[..2],
        "essential = true\ntimeout = \"500ms\"\n",
    ))
    .await;
    for x in [a(), b()] {
        assert_eq!(
            h.state("web", x),
            "checking",
            "without persistent an essential probe must pass again after a change"
        );
        assert_eq!(h.slots("web", x), 0);
        assert!(
            h.live("web", x) && !h.serving("web", x),
            "{x} was up: while checking again it keeps its established flows"
        );
    }
    h.run_until(secs(2), |h| {
        h.slots("web", a()) > 0 && h.slots("web", b()) > 0
    })
    .await
    .expect("both return after their first pass");
}

#[tokio::test(start_paused = true)]
async fn changed_probe_keeps_a_checking_server_checking() {
    // health::StartState: a server "still in `checking` before the reload" restarts as
    // `New` (checking), not as `unhealthy`.
    let probe = "essential = true\n";
    let mut h = Harness::start(&config("", &ABC, probe)).await;
    h.set(c(), Verdict::Silent);
    h.run_for(secs(3)).await;
    assert_eq!(h.state("web", a()), "up", "setup");
    assert_eq!(h.state("web", c()), "checking", "setup: c never answered");
    h.reload(&config("", &ABC, "essential = true\ntimeout = \"500ms\"\n"))
        .await;
    assert_eq!(
        h.state("web", c()),
        "checking",
        "a server still checking before the reload must be checking after it"
    );
    assert!(
        !h.live("web", c()),
        "never in traffic: nothing to keep (Removed, no flag)"
    );
}

#[tokio::test(start_paused = true)]
async fn runtime_added_server_written_into_the_file_keeps_its_health() {
    // The usual flow: add a server through the API, then write it into the file and
    // reload. Probes did not change (and the essential one is persistent), so it is a
    // kept server: its health stays.
    let probe = "essential = true\npersistent = true\n";
    let mut h = Harness::start(&config("", &ABC[..2], probe)).await;
    h.run_for(secs(2)).await;
    h.admin(
        "web",
        "10.0.1.4:80",
        AdminChange::Add(lb_agent::api::NewServer {
            address: d(),
            weight: 1,
            spare: false,
            backup: 0,
        }),
    )
    .await
    .expect("add accepted");
    h.run_until(secs(2), |h| h.slots("web", d()) > 0)
        .await
        .expect("setup: the added server passes and gets slots");
    let before = event_count(&h);

    h.reload(&config(
        "",
        &["10.0.1.1:80", "10.0.1.2:80", "10.0.1.4:80"],
        probe,
    ))
    .await;
    assert_eq!(
        h.state("web", d()),
        "up",
        "a server kept across a reload with unchanged probes keeps its health"
    );
    assert!(
        h.slots("web", d()) > 0,
        "it must not lose its slots to a fresh essential check"
    );
    let ev = events_since(&h, before);
    assert!(
        !ev.iter().any(|e| e.server == "10.0.1.4:80"),
        "no transition for it at reload: {ev:?}"
    );
    assert!(
        h.server_status("web", d()).differs_from_config.is_empty(),
        "it is in the file now"
    );
}

#[tokio::test(start_paused = true)]
async fn reports_of_replaced_probes_do_not_count_against_the_new_probes() {
    // Reports the old probe tasks sent before a reload replaced them (queued while the
    // agent was busy) belong to the old probe config: they must not feed the new one.
    let old = web(
        "",
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")])
            + "[[service.probe]]\nname = \"old\"\ntype = \"tcp\"\ninterval = \"1s\"\nfails = 3\n"),
    );
    let new = web(
        "",
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")])
            + "[[service.probe]]\nname = \"new\"\ntype = \"tcp\"\ninterval = \"1s\"\nfails = 1\n"),
    );
    let mut h = Harness::start(&old).await;
    h.prober.set_probe(a(), "old", Verdict::Refuse);
    h.run_for(secs(1)).await;
    assert_eq!(h.state("web", a()), "up", "setup: 1 failure of 3");
    // The agent is busy (not reading reports) while the old probe fails once more.
    let busy = Instant::now();
    tokio::time::sleep(secs(1)).await;
    assert!(
        !h.prober.calls_to(a(), busy).is_empty(),
        "setup: an old probe ran while the agent was busy"
    );
    h.reload(&new).await;
    assert_eq!(h.state("web", a()), "up", "setup: a was up at the reload");

    h.run_for(crate::util::ms(100)).await;
    let st = h.server_status("web", a());
    assert_eq!(
        st.state, "up",
        "a stale report of the replaced probe `old` must not fail the new probe `new`"
    );
    assert_eq!(
        st.health.probes["new"].failures, 0,
        "probe `new` never failed: {:?}",
        st.health.probes["new"]
    );
}

#[tokio::test(start_paused = true)]
async fn plain_reload_checks_up_servers_again_on_a_non_persistent_essential_probe() {
    let probe = "essential = true\n";
    let mut h = Harness::start(&config("", &ABC[..2], probe)).await;
    h.run_for(secs(2)).await;
    assert_eq!(h.state("web", a()), "up", "setup: a passed");
    h.set(a(), Verdict::Refuse);

    // The same file again: nothing changed, yet the essential probe must pass again.
    h.reload(&config("", &ABC[..2], probe)).await;
    let reloaded = Instant::now();
    assert_eq!(
        h.state("web", a()),
        "checking",
        "without persistent an essential probe gates an up server after any reload"
    );
    assert_eq!(h.slots("web", a()), 0, "no new flows until it passes again");
    assert!(
        h.live("web", a()),
        "it was in traffic: its established flows stay while it is checked"
    );
    let ever = h.run_until(secs(5), |h| h.slots("web", a()) > 0).await;
    assert_eq!(ever, None, "a refusing server never gets its slots back");
    let calls = h.prober.calls_to(a(), reloaded);
    assert!(
        calls
            .first()
            .is_some_and(|c| c.started - reloaded < PROMPT_SPREAD),
        "the essential probe ran again promptly after the reload: {calls:?}"
    );

    h.set(a(), Verdict::Pass);
    h.run_until(secs(3), |h| h.slots("web", a()) > 0)
        .await
        .expect("slots come back with the first pass after the reload");
    assert_eq!(h.state("web", a()), "up");
}

#[tokio::test(start_paused = true)]
async fn plain_reload_keeps_up_servers_whose_essential_probe_is_persistent() {
    let probe = "essential = true\npersistent = true\n";
    let mut h = Harness::start(&config("", &ABC[..2], probe)).await;
    h.run_for(secs(2)).await;
    h.set(a(), Verdict::Refuse);
    h.reload(&config("", &ABC[..2], probe)).await;
    assert_eq!(
        h.state("web", a()),
        "up",
        "persistent: no re-check at reload"
    );
    assert!(h.slots("web", a()) > 0);
}

#[tokio::test(start_paused = true)]
async fn a_server_a_reload_adds_waits_for_its_plain_probe() {
    let mut h = Harness::start(&config("", &ABC[..2], "")).await;
    assert_eq!(
        h.state("web", a()),
        "up",
        "at start a plain probe does not gate"
    );
    h.run_for(secs(2)).await;
    h.set(d(), Verdict::Refuse);
    h.reload(&config(
        "",
        &["10.0.1.1:80", "10.0.1.2:80", "10.0.1.4:80"],
        "",
    ))
    .await;
    assert_eq!(
        h.state("web", d()),
        "checking",
        "added by the reload: held back"
    );
    assert_eq!(h.slots("web", d()), 0);
    let ever = h.run_until(secs(3), |h| h.slots("web", d()) > 0).await;
    assert_eq!(ever, None, "no slot while its probe fails");
    h.set(d(), Verdict::Pass);
    h.run_until(secs(2), |h| h.slots("web", d()) > 0)
        .await
        .expect("slots with its first pass");
    assert_eq!(
        h.state("web", a()),
        "up",
        "the kept servers were never touched"
    );
}

#[tokio::test(start_paused = true)]
async fn a_server_a_reload_adds_back_while_its_flows_run_keeps_them() {
    let mut h = Harness::start(&config("", &ABC, "")).await;
    h.run_for(secs(2)).await;
    let id = h.backend_ids("web", c())[0];
    h.reload(&config("", &ABC[..2], "")).await;
    h.run_for(secs(30)).await;
    assert!(
        h.live("web", c()) && !h.serving("web", c()),
        "setup: removed, its established flows stay"
    );
    h.set(c(), Verdict::Refuse);
    h.reload(&config("", &ABC, "")).await;
    assert_eq!(
        h.state("web", c()),
        "checking",
        "added back: held back until its probe passes"
    );
    assert_eq!(
        h.backend_ids("web", c()),
        vec![id],
        "the same id: flows pinned to it can continue"
    );
    assert!(
        h.live("web", c()) && !h.serving("web", c()),
        "added back within its grace period: no new flow, its established flows stay"
    );
    let lost = h.run_until(secs(3), |h| !h.live("web", c())).await;
    assert_eq!(lost, None, "its flows stay while its probe fails");
    h.set(c(), Verdict::Pass);
    h.run_until(secs(2), |h| h.serving("web", c()))
        .await
        .expect("new flows with its first pass");
}

#[tokio::test(start_paused = true)]
async fn a_reload_that_does_not_parse_is_refused_and_the_running_config_stays() {
    let mut h = Harness::start(&config("", &ABC, "")).await;
    h.run_for(secs(2)).await;
    let slots: Vec<usize> = [a(), b(), c()].iter().map(|x| h.slots("web", *x)).collect();
    let refused = h
        .try_reload(&config("", &["10.0.1.1:80"], "timeout = \"soon\"\n"))
        .await
        .expect_err("a config that does not parse is refused");
    assert!(
        refused.contains("timeout"),
        "the answer says why: {refused}"
    );
    let kept: Vec<usize> = [a(), b(), c()].iter().map(|x| h.slots("web", *x)).collect();
    assert_eq!(kept, slots, "every server keeps its slots");
    h.run_for(secs(2)).await;
    for x in [a(), b(), c()] {
        assert_eq!(h.state("web", x), "up", "{x} stays in service");
    }
}

#[tokio::test(start_paused = true)]
async fn a_reload_applies_the_services_and_warns_about_agent_keys_that_need_a_restart() {
    let mut h = Harness::start(&config("", &ABC, "")).await;
    h.run_for(secs(2)).await;
    let text = format!(
        "[agent]\napi_listen = \"127.0.0.1:9999\"\n{}",
        config("", &["10.0.1.1:80", "10.0.1.2:80"], "")
    );
    let outcome = h.try_reload(&text).await.expect("the services are applied");
    assert_eq!(outcome.warnings.len(), 1, "{outcome:?}");
    assert!(
        outcome.warnings[0].contains("api_listen"),
        "the warning names the key: {outcome:?}"
    );
    assert_eq!(h.slots("web", c()), 0, "the removed server left");
    assert!(h.slots("web", a()) > 0 && h.slots("web", b()) > 0);
}
