//! A storm of verdicts in one publish: a share of a service's servers leaves traffic at
//! once (a rack, a zone, the probes' network), one more leaves while they are out, then
//! all return at once. Every step must give the maps a publish from scratch gives, and
//! the work per publish stays bounded: a storm is computed whole, and while most of the
//! table is out no walk state is kept (docs/internals/publish.md, "Storms"). As a test it runs one
//! service of 1,000 servers; as the benchmark of BENCHMARKS.md §2, 10,000:
//! `LB_STORM_SERVERS=10000 cargo test --release -p lb-agent --test bench_verdict_storm -- --nocapture`.
//! A binary of its own: the times it prints are the publisher's alone, with no other
//! test of the process running beside it.

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use lb_agent::{
    publish::{DesiredBackend, DesiredService, NatSpec, Publisher, Role},
    testing::MemoryDataplane,
};

/// Servers in the service unless `LB_STORM_SERVERS` says otherwise.
const SERVERS: usize = 1_000;
/// The shares of the service that leave at once, in per mille.
const STORMS: [usize; 5] = [10, 100, 300, 900, 990];

fn servers() -> usize {
    std::env::var("LB_STORM_SERVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SERVERS)
}

fn server(i: usize) -> DesiredBackend {
    DesiredBackend {
        addr: SocketAddr::new(
            IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8]),
            8080,
        ),
        weight: 1,
        mac: Some([2, 0, 0, 0, 0, 1]),
        role: Role::Active,
    }
}

fn service(backends: Vec<DesiredBackend>) -> DesiredService {
    DesiredService {
        name: "web".into(),
        vip: "10.255.0.1:80".parse().unwrap(),
        proto: lb_common::IPPROTO_TCP,
        tunnel: None,
        nat: Some(NatSpec {
            snat_ips: vec!["10.255.0.2".parse().unwrap()],
            ports: 20000..=59999,
            source_rate: 0,
            source_burst: 0,
        }),
        backends,
        maglev_size: None,
    }
}

/// The live table `want` gives when published from scratch.
fn fresh(want: &[DesiredBackend]) -> Vec<u32> {
    let mut dp = MemoryDataplane::default();
    Publisher::default()
        .apply(&[service(want.to_vec())], &mut dp)
        .unwrap();
    dp.tables.values().next().unwrap().clone()
}

/// Publishes the changed `backends` and checks the maps against a fresh publish of `want`.
fn step(
    p: &mut Publisher,
    dp: &mut MemoryDataplane,
    backends: &[DesiredBackend],
    want: &[DesiredBackend],
    what: &str,
) -> Duration {
    let started = Instant::now();
    let report = p
        .apply_backends("web", backends, dp)
        .unwrap()
        .expect("roles only: the incremental entry point takes it");
    let took = started.elapsed();
    assert_eq!(report.tables_published, 1, "{what}: one table");
    assert!(
        *dp.tables.values().next().unwrap() == fresh(want),
        "{what}: the maps of a publish from scratch"
    );
    took
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

#[test]
fn storms_of_verdicts_give_the_maps_of_a_fresh_publish_in_bounded_work() {
    let n = servers();
    let all: Vec<DesiredBackend> = (0..n).map(server).collect();
    println!("| servers out at once | leave | one more while they are out | all back |");
    println!("|---:|---:|---:|---:|");
    for per_mille in STORMS {
        let k = (n * per_mille / 1000).max(1);
        let mut dp = MemoryDataplane::default();
        let mut p = Publisher::default();
        p.apply(&[service(all.clone())], &mut dp).unwrap();
        let mut want = all.clone();
        for w in &mut want[..k] {
            w.role = Role::Sticky;
        }
        let leave = step(&mut p, &mut dp, &want[..k], &want, "leave");
        want[k].role = Role::Sticky;
        let one = step(&mut p, &mut dp, &want[k..=k], &want, "one more");
        let back = step(&mut p, &mut dp, &all[..=k], &all, "back");
        println!(
            "| {k} of {n} | {} | {} | {} |",
            ms(leave),
            ms(one),
            ms(back)
        );
    }
}
