//! The snapshot is built incrementally (server records kept between builds): over random
//! sequences of probe results, verdicts, admin changes, counter changes and reloads it
//! always equals a build from scratch, and a change rebuilds only the records it changed.

use std::{net::SocketAddr, sync::Arc};

use crate::util::{Harness, Verdict, ms, sa, secs};
use lb_agent::api::{AdminChange, NewServer, ServerPatch};
use lb_agent::view::Snapshot;
use lb_common::maps::BackendStats;

/// A small deterministic generator (xorshift64*): each seed is one reproducible sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const SERVICES: [&str; 2] = ["web", "api"];

fn address(service: usize, i: usize) -> SocketAddr {
    sa(&format!("10.0.{}.{}:80", service + 1, i + 1))
}

/// Two services of up to 6 servers with random weights, spares and backups; `web` has
/// two probes (one essential), `api` one.
fn config(rng: &mut Rng) -> String {
    let mut t = String::new();
    for (si, name) in SERVICES.iter().enumerate() {
        t.push_str(&format!(
            "[[service]]\nname = \"{name}\"\nvip = \"10.0.0.{}:80\"\nsnat_ip = \"10.0.0.2\"\n",
            100 + si
        ));
        t.push_str(
            "[[service.probe]]\nname = \"tcp\"\ntype = \"tcp\"\ninterval = \"1s\"\nfails = 2\n",
        );
        if si == 0 {
            t.push_str(
                "[[service.probe]]\nname = \"http\"\ntype = \"http\"\ninterval = \"3s\"\n\
                 timeout = \"500ms\"\nessential = false\n",
            );
        }
        for i in 0..6 {
            // Servers 0 and 1 are always there; the others come and go with reloads.
            if i >= 2 && rng.below(3) == 0 {
                continue;
            }
            t.push_str(&format!(
                "[[service.server]]\naddress = \"{}\"\nweight = {}\n",
                address(si, i),
                1 + rng.below(3)
            ));
            match rng.below(6) {
                0 => t.push_str("spare = true\n"),
                1 => t.push_str("backup = 1\n"),
                _ => {}
            }
        }
    }
    t
}

fn as_json(s: &Snapshot) -> serde_json::Value {
    serde_json::to_value(s).expect("a snapshot serializes")
}

/// Builds the snapshot as the agent does and checks it against a build from scratch;
/// returns (records rebuilt, records in the snapshot).
fn check(h: &mut Harness, what: &str) -> (usize, usize) {
    h.agent_mut().publish_snapshot();
    let incremental = h.snapshot();
    let scratch = h.agent_mut().snapshot_from_scratch();
    assert_eq!(
        as_json(&incremental),
        as_json(&scratch),
        "after {what}: the incremental snapshot differs from one built from scratch"
    );
    let records = incremental.services.iter().map(|s| s.servers.len()).sum();
    (h.agent().snapshot_records_rebuilt(), records)
}

async fn one_step(h: &mut Harness, rng: &mut Rng) -> String {
    let si = rng.below(2) as usize;
    let service = SERVICES[si];
    let target = address(si, rng.below(6) as usize);
    match rng.below(10) {
        0..=2 => {
            let v = *rng.pick(&[
                Verdict::Pass,
                Verdict::Refuse,
                Verdict::Silent,
                Verdict::LocalFault,
            ]);
            h.set(target, v);
            let d = ms(100 + rng.below(3_000));
            h.run_for(d).await;
            format!("{target} answering {v:?}, then {d:?}")
        }
        3 | 4 => {
            let patch = match rng.below(6) {
                0 => ServerPatch {
                    weight: Some(1 + rng.below(4) as u32),
                    ..Default::default()
                },
                1 => ServerPatch {
                    drain: Some(rng.below(2) == 0),
                    ..Default::default()
                },
                2 => ServerPatch {
                    down: Some(rng.below(2) == 0),
                    ..Default::default()
                },
                3 => ServerPatch {
                    spare: Some(rng.below(2) == 0),
                    ..Default::default()
                },
                _ => ServerPatch {
                    reset: Some(true),
                    ..Default::default()
                },
            };
            // Refusals (unknown server, a change the cap forbids) are fine too.
            let answer = h
                .admin(
                    service,
                    &target.to_string(),
                    AdminChange::Patch(patch.clone()),
                )
                .await;
            format!("PATCH {service} {target} {patch:?}: {answer:?}")
        }
        5 => {
            let answer = if rng.below(2) == 0 {
                h.admin(
                    service,
                    &target.to_string(),
                    AdminChange::Add(NewServer {
                        address: target,
                        weight: 1 + rng.below(3) as u32,
                        spare: false,
                        backup: 0,
                    }),
                )
                .await
            } else {
                h.admin(service, &target.to_string(), AdminChange::Remove)
                    .await
            };
            format!("add or remove {service} {target}: {answer:?}")
        }
        6 => {
            let ids = h.backend_ids(service, target);
            let packets = rng.below(1_000);
            for id in &ids {
                h.agent_mut().dataplane_mut().backend_stats.insert(
                    *id,
                    BackendStats {
                        packets,
                        bytes: packets * 100,
                        new_flows: packets / 10,
                        ..Default::default()
                    },
                );
            }
            h.run_for(secs(1)).await;
            format!("counters of {service} {target} ({ids:?}) at {packets} packets")
        }
        7 => {
            let text = config(rng);
            h.reload(&text).await;
            "a reload".to_string()
        }
        _ => {
            let d = ms(rng.below(5_000));
            h.run_for(d).await;
            format!("{d:?} passing")
        }
    }
}

#[tokio::test(start_paused = true)]
async fn incremental_snapshot_equals_a_build_from_scratch() {
    let (mut rebuilt, mut records) = (0, 0);
    for seed in 1..=8u64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x1000_0000_01b3));
        let mut h = Harness::start(&config(&mut rng)).await;
        h.run_for(secs(2)).await;
        check(&mut h, "the start");
        for step in 0..40 {
            let what = one_step(&mut h, &mut rng).await;
            let (r, n) = check(&mut h, &format!("seed {seed} step {step}: {what}"));
            rebuilt += r;
            records += n;
        }
    }
    assert!(
        rebuilt < records,
        "the checks compared kept records too (rebuilt {rebuilt} of {records})"
    );
}

/// One service of 20 servers probed once a minute, so nothing changes between probes.
fn quiet_config() -> String {
    let mut t = String::from(
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n\
         [[service.probe]]\ntype = \"tcp\"\ninterval = \"60s\"\n",
    );
    for i in 0..20 {
        t.push_str(&format!(
            "[[service.server]]\naddress = \"{}\"\n",
            address(0, i)
        ));
    }
    t
}

/// Records of `after` that equal their record in `before` must be the same (shared)
/// record; returns how many differ.
fn changed_records(before: &Snapshot, after: &Snapshot) -> usize {
    let (b, a) = (&before.services[0].servers, &after.services[0].servers);
    assert_eq!(a.len(), b.len());
    b.iter()
        .zip(a)
        .filter(|(b, a)| {
            if b == a {
                assert!(
                    Arc::ptr_eq(b, a),
                    "{}: its record did not change, yet it was rebuilt",
                    a.address
                );
                false
            } else {
                true
            }
        })
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_change_to_one_server_rebuilds_only_the_records_it_changed() {
    let mut h = Harness::start(&quiet_config()).await;
    h.run_for(secs(2)).await;
    let settled = h.snapshot();
    h.agent_mut().publish_snapshot();
    assert_eq!(
        h.agent().snapshot_records_rebuilt(),
        0,
        "nothing changed: every record is kept"
    );
    changed_records(&settled, &h.snapshot());

    // One server's counters move: its record alone is rebuilt at the next stats tick.
    let c = address(0, 5);
    let before = h.snapshot();
    for id in h.backend_ids("web", c) {
        h.agent_mut().dataplane_mut().backend_stats.insert(
            id,
            BackendStats {
                packets: 7,
                ..Default::default()
            },
        );
    }
    h.run_for(secs(2)).await;
    let after = h.snapshot();
    assert_eq!(h.server_status("web", c).stats.packets, 7);
    let probed = |s: &Snapshot| -> Vec<u64> {
        s.services[0]
            .servers
            .iter()
            .map(|r| r.health.probes.values().map(|p| p.count).sum())
            .collect()
    };
    // Probes of the others are spread over their minute: one may have run meanwhile.
    let probed_meanwhile = probed(&before)
        .iter()
        .zip(probed(&after))
        .filter(|(b, a)| **b != *a)
        .count();
    assert_eq!(
        changed_records(&before, &after),
        1 + probed_meanwhile,
        "only {c}'s record and those of servers probed meanwhile changed"
    );

    // A weight change: that server's record and those whose slot count moved (with 20
    // servers, every one's); each is rebuilt once, the build counts them all.
    let a = address(0, 3);
    let before = h.snapshot();
    h.admin(
        "web",
        &a.to_string(),
        AdminChange::Patch(ServerPatch {
            weight: Some(3),
            ..Default::default()
        }),
    )
    .await
    .expect("a weight change is accepted");
    let after = h.snapshot();
    let changed = changed_records(&before, &after);
    assert_eq!(h.agent().snapshot_records_rebuilt(), changed);
    assert_eq!(h.server_status("web", a).weight, 3);

    // A verdict: the failing server's record changes; every server was probed meanwhile
    // (their counts moved), and the records that still equal their old one are shared.
    let b = address(0, 7);
    h.set(b, Verdict::Refuse);
    let before = h.snapshot();
    h.run_until(secs(180), |h| h.state("web", b) == "unhealthy")
        .await
        .expect("a refusing server turns unhealthy");
    let after = h.snapshot();
    assert_eq!(
        as_json(&after),
        as_json(&h.agent_mut().snapshot_from_scratch()),
        "after the verdict"
    );
    let changed = changed_records(&before, &after);
    assert!(changed >= 1, "the failed server's record changed");
}
