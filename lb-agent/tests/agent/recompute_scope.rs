//! A verdict recomputes and publishes only its own service (membership, wanted
//! description, publisher), and what that leaves in the maps is what a recompute of
//! every service gives — over random sequences of verdicts, admin changes and reloads.

use crate::util::{Harness, Verdict, sa, secs};
use lb_agent::{
    agent::MembershipWork,
    api::{AdminChange, NewServer, ServerPatch},
    testing::{MemoryDataplane, Write},
};

/// `services` nat services `s0`, `s1`, … with `per` servers each (`10.0.<s>.<i+1>:80`),
/// one tcp probe every second. `membership`: the first server of even services is a spare,
/// the second server of each a backup (retried after 3 s), the removal cap is on, and odd
/// services do not fail open, so membership has work beyond health, some of it due by
/// time alone (and odd services, without a spare, take verdicts per server).
fn config(services: usize, per: usize, membership: bool) -> String {
    let mut text = String::new();
    for s in 0..services {
        text += &format!(
            "[[service]]\nname = \"s{s}\"\nvip = \"10.0.200.{s}:80\"\nsnat_ip = \"10.0.0.2\"\n\
             {}\n",
            if membership {
                // A backup level retried after 3 s: a membership recheck (on_tick)
                // without any new verdict.
                if s % 2 == 1 {
                    "max_unhealthy_percent = 50\nbackup_switch = { permanent = \"3s\" }\n\
                     fail_open = false"
                } else {
                    "max_unhealthy_percent = 50\nbackup_switch = { permanent = \"3s\" }"
                }
            } else {
                "max_unhealthy_percent = 100"
            }
        );
        for i in 0..per {
            let extra = match i {
                0 if membership && s % 2 == 0 => "spare = true\n",
                1 if membership => "backup = 1\n",
                _ => "",
            };
            text += &format!(
                "[[service.server]]\naddress = \"{}\"\n{extra}",
                server(s, i)
            );
        }
        text += "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n";
    }
    text
}

fn server(s: usize, i: usize) -> String {
    format!("10.0.{s}.{}:80", i + 1)
}

/// The maps as they stand: services, backend entries, tables.
fn maps(dp: &MemoryDataplane) -> String {
    format!("{:?}\n{:?}\n{:?}", dp.services, dp.backends, dp.tables)
}

#[tokio::test(start_paused = true)]
async fn a_verdict_in_one_of_many_services_is_published_for_that_service_alone() {
    let mut h = Harness::start(&config(16, 4, false)).await;
    h.run_for(secs(3)).await;
    let a = sa(&server(5, 3));
    let id = h.backend_ids("s5", a)[0];
    let sid = h.service_id("s5").unwrap();
    let mark = h.agent().dataplane().log.len();

    h.set(a, Verdict::Refuse);
    h.run_until(secs(5), |h| h.slots("s5", a) == 0)
        .await
        .expect("a refusing server leaves the table");

    let report = h.agent().last_publish();
    assert_eq!(
        report.services_given, 1,
        "only the verdict's service is recomputed and described: {report:?}"
    );
    assert_eq!(
        (
            report.tables_published,
            report.backends_written,
            report.backends_examined
        ),
        (1, 1, 1),
        "one table, the one backend's entry: {report:?}"
    );
    assert_eq!(
        h.agent().dataplane().log[mark..],
        [Write::Slots(sid), Write::Backend(id)],
        "the writes since the verdict: its service's table, then its entry"
    );
}

#[tokio::test(start_paused = true)]
async fn a_verdict_about_one_of_200_servers_reads_and_writes_that_server_alone() {
    let mut h = Harness::start(&config(1, 200, false)).await;
    h.run_for(secs(3)).await;
    let a = sa(&server(0, 117));
    let id = h.backend_ids("s0", a)[0];
    let sid = h.service_id("s0").unwrap();
    for (verdict, writes) in [
        (Verdict::Refuse, [Write::Slots(sid), Write::Backend(id)]),
        // Back: live before the table points at it.
        (Verdict::Pass, [Write::Backend(id), Write::Slots(sid)]),
    ] {
        let mark = h.agent().dataplane().log.len();
        let in_table = h.slots("s0", a) > 0;
        h.set(a, verdict);
        h.run_until(secs(5), |h| (h.slots("s0", a) > 0) != in_table)
            .await
            .unwrap_or_else(|| panic!("{verdict:?}: the table must follow the verdict"));
        assert_eq!(
            h.agent().last_membership(),
            MembershipWork {
                updated: 1,
                computed: 0,
                inputs: 1
            },
            "{verdict:?}: membership updated for the one server, not computed over 200"
        );
        let report = h.agent().last_publish();
        assert_eq!(
            (
                report.services_given,
                report.backends_examined,
                report.backends_written,
                report.tables_published
            ),
            (1, 1, 1, 1),
            "{verdict:?}: that server's entry and its service's table: {report:?}"
        );
        assert_eq!(h.agent().dataplane().log[mark..], writes, "{verdict:?}");
    }
}

/// A `RetryAfter` try falls due with no verdict: the tick marks the service and its
/// membership is computed again (without the marking the primaries never come back).
#[tokio::test(start_paused = true)]
async fn a_due_retry_recomputes_its_service_without_a_verdict() {
    let text = format!(
        "[[service]]\nname = \"retry\"\nvip = \"10.0.201.1:80\"\nsnat_ip = \"10.0.0.2\"\n\
         backup_switch = {{ permanent = \"10s\" }}\n\
         [[service.server]]\naddress = \"10.0.99.1:80\"\n\
         [[service.server]]\naddress = \"10.0.99.2:80\"\n\
         [[service.server]]\naddress = \"10.0.99.3:80\"\nbackup = 1\n\
         [[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n{}",
        config(2, 3, false)
    );
    let mut h = Harness::start(&text).await;
    h.run_for(secs(3)).await;
    let primaries = [sa("10.0.99.1:80"), sa("10.0.99.2:80")];
    let backup = sa("10.0.99.3:80");
    for p in primaries {
        h.set(p, Verdict::Refuse);
    }
    h.run_until(secs(5), |h| h.slots("retry", backup) > 0)
        .await
        .expect("the backup level takes over");
    for p in primaries {
        h.set(p, Verdict::Pass);
    }
    h.run_until(secs(5), |h| {
        primaries.iter().all(|&p| h.state("retry", p) == "up")
    })
    .await
    .expect("the primaries pass again");
    assert!(
        primaries.iter().all(|&p| h.slots("retry", p) == 0),
        "the backup level stays until its retry is due"
    );
    h.run_until(secs(12), |h| {
        primaries.iter().all(|&p| h.slots("retry", p) > 0)
    })
    .await
    .expect("the retry, due without any verdict, returns to the primaries");
    assert_eq!(h.slots("retry", backup), 0);
    let (work, report) = (h.agent().last_membership(), h.agent().last_publish());
    assert_eq!(
        (work.computed, work.updated, report.services_given),
        (1, 0, 1),
        "the due service alone, computed over its servers: {work:?} {report:?}"
    );
}

/// xorshift64*: a reproducible sequence without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

#[tokio::test(start_paused = true)]
async fn publishing_per_service_leaves_the_maps_a_recompute_of_every_service_gives() {
    const SERVICES: usize = 5;
    const PER: usize = 6;
    let text = config(SERVICES, PER, true);
    for seed in 1..=3u64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
        let mut h = Harness::start(&text).await;
        h.run_for(secs(3)).await;
        let mut scoped_publishes = 0;
        let mut updated = 0;
        let mut added = Vec::new();
        for step in 0..60 {
            let s = rng.below(SERVICES);
            let name = format!("s{s}");
            let addr = server(s, rng.below(PER));
            let ctx = format!("seed {seed} step {step}");
            match rng.below(10) {
                0..=5 => {
                    let v = [Verdict::Refuse, Verdict::Pass, Verdict::Silent][rng.below(3)];
                    h.set(sa(&addr), v);
                }
                6 => {
                    let patch = match rng.below(4) {
                        0 => ServerPatch {
                            drain: Some(rng.below(2) == 0),
                            ..Default::default()
                        },
                        1 => ServerPatch {
                            down: Some(rng.below(2) == 0),
                            ..Default::default()
                        },
                        2 => ServerPatch {
                            weight: Some(1 + rng.below(4) as u32),
                            ..Default::default()
                        },
                        _ => ServerPatch {
                            reset: Some(true),
                            ..Default::default()
                        },
                    };
                    h.admin(&name, &addr, AdminChange::Patch(patch))
                        .await
                        .unwrap_or_else(|e| panic!("{ctx}: patch refused: {e}"));
                }
                7 => {
                    let new = format!("10.0.{s}.{}:80", 100 + step);
                    let add = NewServer {
                        address: sa(&new),
                        weight: 1,
                        spare: false,
                        backup: 0,
                    };
                    h.admin(&name, &new, AdminChange::Add(add))
                        .await
                        .unwrap_or_else(|e| panic!("{ctx}: add refused: {e}"));
                    added.push((name, new));
                }
                8 if !added.is_empty() => {
                    let (name, addr) = added.remove(rng.below(added.len()));
                    h.admin(&name, &addr, AdminChange::Remove)
                        .await
                        .unwrap_or_else(|e| panic!("{ctx}: remove refused: {e}"));
                }
                _ => h.reload(&text).await,
            }
            h.run_for(secs(1 + rng.below(3) as u64)).await;
            let report = h.agent().last_publish();
            if report.services_given < h.cfg.services.len() {
                scoped_publishes += 1;
            }
            if h.agent().last_membership().updated > 0 {
                updated += 1;
            }
            // A reload with the same text recomputes and republishes every service: it
            // must find nothing to write.
            let before = maps(h.agent().dataplane());
            let mark = h.agent().dataplane().log.len();
            h.reload(&text).await;
            assert_eq!(
                h.agent().last_publish().services_given,
                h.cfg.services.len(),
                "{ctx}: a reload recomputes every service"
            );
            assert_eq!(
                h.agent().dataplane().log[mark..],
                [],
                "{ctx}: the per-service publishes left something a full one changes"
            );
            assert_eq!(maps(h.agent().dataplane()), before, "{ctx}");
        }
        assert!(
            scoped_publishes > 10,
            "seed {seed}: the sequence must exercise per-service publishes ({scoped_publishes})"
        );
        assert!(
            updated > 3,
            "seed {seed}: the sequence must exercise membership updated per server ({updated})"
        );
    }
}
