//! DESIGN.md §4: the path "verdict -> maps written" is measured. Every verdict that
//! changes the maps adds one observation; verdicts that change nothing add none.

use crate::util::{Harness, Verdict, sa, secs, servers, web};
use lb_agent::api::{AdminChange, ServerPatch};

fn config() -> String {
    web(
        "",
        &(servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "")])
            + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n"),
    )
}

#[tokio::test(start_paused = true)]
async fn a_transition_adds_a_propagation_observation() {
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(3)).await;
    let steady = h.agent().propagation().count;
    h.run_for(secs(5)).await;
    assert_eq!(
        h.agent().propagation().count,
        steady,
        "passing probes change nothing: no map write, no observation"
    );

    let a = sa("10.0.1.1:80");
    h.set(a, Verdict::Refuse);
    h.run_until(secs(5), |h| h.slots("web", a) == 0)
        .await
        .expect("a refusing server leaves the table");
    let after_fail = h.agent().propagation().count;
    assert_eq!(
        after_fail,
        steady + 1,
        "the verdict that removed the server is measured once"
    );
    let hist = &h.snapshot().propagation;
    assert_eq!(hist.count, after_fail, "the snapshot carries the histogram");
    assert_eq!(
        hist.counts.iter().sum::<u64>(),
        hist.count,
        "every observation lands in a bucket"
    );

    h.set(a, Verdict::Pass);
    h.run_until(secs(5), |h| h.slots("web", a) > 0)
        .await
        .expect("the server returns");
    assert_eq!(h.agent().propagation().count, after_fail + 1);

    h.admin(
        "web",
        "10.0.1.2:80",
        AdminChange::Patch(ServerPatch {
            drain: Some(true),
            ..Default::default()
        }),
    )
    .await
    .expect("drain accepted");
    assert_eq!(
        h.agent().propagation().count,
        after_fail + 2,
        "an admin change that writes maps is measured too"
    );
}
