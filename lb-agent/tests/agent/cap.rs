//! DESIGN.md §6 removal cap through the whole agent: `max_unhealthy_percent` limits how
//! many servers health removes at once; the most recent failures stay in the table.

use std::net::SocketAddr;

use crate::util::{Harness, Verdict, sa, secs, servers, web};

fn config() -> String {
    web(
        "max_unhealthy_percent = 50",
        &(servers(&[
            ("10.0.1.1:80", ""),
            ("10.0.1.2:80", ""),
            ("10.0.1.3:80", ""),
            ("10.0.1.4:80", ""),
        ]) + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n"),
    )
}

fn four() -> [SocketAddr; 4] {
    [
        sa("10.0.1.1:80"),
        sa("10.0.1.2:80"),
        sa("10.0.1.3:80"),
        sa("10.0.1.4:80"),
    ]
}

/// .1, .2 and .3 fail one after the other (in that order), .4 stays up.
async fn three_failed() -> Harness {
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(2)).await;
    for a in &four()[..3] {
        h.set(*a, Verdict::Refuse);
        h.run_until(secs(5), |h| h.state("web", *a) == "unhealthy")
            .await
            .expect("setup: a refusing server turns unhealthy");
        h.run_for(secs(1)).await;
    }
    h
}

#[tokio::test(start_paused = true)]
async fn half_cap_removes_two_of_four_and_keeps_the_latest_failure() {
    let h = three_failed().await;
    let [a, b, c, d] = four();
    for gone in [a, b] {
        assert_eq!(
            h.slots("web", gone),
            0,
            "{gone} failed first: one of the 2 (50% of 4) health may remove"
        );
        assert!(h.live("web", gone) && !h.serving("web", gone));
    }
    for kept in [c, d] {
        assert!(
            h.slots("web", kept) > 0,
            "{kept} must keep slots: the cap allows only 2 of 4 removed"
        );
        assert!((h.share("web", kept) - 0.5).abs() < 0.01);
    }
    let sc = h.server_status("web", c);
    assert_eq!(sc.state, "unhealthy", "status keeps the truth");
    assert!(sc.active, "status shows the held server in the table");
    assert!(!h.service_status("web").fail_open);
}

#[tokio::test(start_paused = true)]
async fn held_server_is_removed_once_an_earlier_failure_recovers() {
    let mut h = three_failed().await;
    let [a, _, c, _] = four();
    h.set(a, Verdict::Pass);
    h.run_until(secs(5), |h| h.state("web", a) == "up")
        .await
        .expect("the first failure recovers");
    assert!(h.slots("web", a) > 0);
    assert_eq!(
        h.slots("web", c),
        0,
        "with 2 unhealthy of 4 the cap no longer holds {c}"
    );
    assert!(h.live("web", c) && !h.serving("web", c));
}

/// Azure's rule for the case every server is unhealthy: none is removed. With
/// `max_unhealthy_percent = 50` and all four failing, all four keep their slots (before,
/// the cap held the two latest failures and the two earliest left: half out).
#[tokio::test(start_paused = true)]
async fn every_server_unhealthy_under_a_cap_none_is_removed() {
    let mut h = three_failed().await;
    let all = four();
    h.set(all[3], Verdict::Refuse);
    h.run_until(secs(5), |h| h.state("web", all[3]) == "unhealthy")
        .await
        .expect("the last server turns unhealthy");
    h.run_for(secs(1)).await;
    for s in all {
        assert_eq!(h.state("web", s), "unhealthy", "status keeps the truth");
        assert!(
            h.slots("web", s) > 0,
            "{s}: every server unhealthy, none removed (Azure)"
        );
        assert!((h.share("web", s) - 0.25).abs() < 0.01);
    }
    // One recovers: the cap's arithmetic applies again, 2 of the 3 failing removed.
    h.set(all[0], Verdict::Pass);
    h.run_until(secs(5), |h| h.state("web", all[0]) == "up")
        .await
        .expect("the first failure recovers");
    h.run_for(secs(1)).await;
    let kept: Vec<_> = all[1..]
        .iter()
        .filter(|s| h.slots("web", **s) > 0)
        .collect();
    assert_eq!(
        kept,
        vec![&all[3]],
        "the latest failure is held, the others go"
    );
}
