//! The agent loop's per-server costs over the memory data plane: one stats tick
//! (`poll_stats`), the snapshot built from scratch, and the incremental snapshot build
//! after one server's verdict (which must equal a build from scratch and rebuild only the
//! records the verdict changed). As a test it runs 10 services of 500 servers; as the
//! benchmark of BENCHMARKS.md §3, 10 of 1,000 or 10,000:
//! `LB_LOOP_SERVERS_PER_SERVICE=10000 cargo test --release -p lb-agent --test bench_loop_cost -- --nocapture`.
//! A binary of its own: the times it prints are the agent's alone, with no other test
//! of the process running beside it.

#[path = "agent/util.rs"]
mod agent_util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_util::{MAC, Scripted, sa};
use lb_agent::agent::{Agent, Environment, StaticNeighbours};
use lb_agent::probe::{ProbeOutcome, ProbeReport};
use lb_agent::testing::MemoryDataplane;

const SERVICES: usize = 10;
/// Servers per service unless `LB_LOOP_SERVERS_PER_SERVICE` says otherwise.
const PER_SERVICE: usize = 500;
const ROUNDS: usize = 5;

fn per_service() -> usize {
    std::env::var("LB_LOOP_SERVERS_PER_SERVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PER_SERVICE)
}

fn config(per_service: usize) -> String {
    let mut t = String::from("[agent]\nmax_backends = 131071\n");
    for s in 0..SERVICES {
        t.push_str(&format!(
            "[[service]]\nname = \"s{s}\"\nvip = \"10.0.0.{}:80\"\nsnat_ip = \"10.0.0.2\"\n",
            s + 100
        ));
        t.push_str("[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n");
        for i in 0..per_service {
            t.push_str(&format!(
                "[[service.server]]\naddress = \"10.{}.{}.{}:80\"\n",
                s + 1,
                i / 250,
                i % 250 + 1
            ));
        }
    }
    t
}

/// One incremental build, in milliseconds.
fn timed_build(agent: &mut Agent<MemoryDataplane, Scripted, StaticNeighbours>) -> f64 {
    let t = Instant::now();
    agent.publish_snapshot();
    t.elapsed().as_secs_f64() * 1000.0
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

#[tokio::test(start_paused = true)]
async fn stats_tick_and_snapshot_cover_every_server() {
    let per_service = per_service();
    let neighbours = StaticNeighbours {
        default: Some(MAC),
        ..Default::default()
    };
    let (mut agent, handles) = Agent::new(
        MemoryDataplane::with_max_backends(131_071),
        Arc::new(Scripted::default()),
        Arc::new(neighbours),
        Environment::default(),
    );
    let cfg = agent_util::parse(&config(per_service));
    agent.apply_config(&cfg).await.expect("memory publishing");
    let servers = SERVICES * per_service;
    let t = Instant::now();
    agent.publish_snapshot();
    let first = t.elapsed().as_secs_f64() * 1000.0;
    let (mut polls, mut quiet) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        agent.poll_stats();
        polls.push(t.elapsed().as_secs_f64() * 1000.0);
        quiet.push(timed_build(&mut agent));
        assert_eq!(
            agent.snapshot_records_rebuilt(),
            0,
            "nothing changed: every record is kept"
        );
    }
    // Steady probing: between two builds (a reader a second or slower) every server got
    // a probe report, so every record's probe figures (count, last) changed.
    let keys: Vec<_> = (0..SERVICES)
        .flat_map(|s| (0..per_service).map(move |i| (s, i)))
        .map(|(s, i)| {
            let addr = sa(&format!("10.{}.{}.{}:80", s + 1, i / 250, i % 250 + 1));
            agent
                .server_key(&format!("s{s}"), addr)
                .expect("a configured server")
        })
        .collect();
    let mut probed = Vec::new();
    for _ in 0..ROUNDS {
        tokio::time::advance(Duration::from_secs(1)).await;
        let at = tokio::time::Instant::now();
        agent
            .on_probe_reports(keys.iter().map(|&server| ProbeReport {
                server,
                probe: 0,
                outcome: ProbeOutcome::pass(Duration::from_micros(150), "connected (SYN-ACK)"),
                at,
            }))
            .expect("memory publishing");
        probed.push(timed_build(&mut agent));
        assert_eq!(
            agent.snapshot_records_rebuilt(),
            servers,
            "every server was probed: every record is new"
        );
    }

    let snap = handles.snapshot.borrow().clone();
    let listed: usize = snap.services.iter().map(|s| s.servers.len()).sum();
    assert_eq!(listed, servers, "every server is in the snapshot");

    // One server's verdict, then the snapshot: incremental, and from scratch (the cost
    // of every build before the records were kept), in alternating order.
    let (mut after_verdict, mut scratch, mut rebuilt) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let service = format!("s{}", round % SERVICES);
        let addr = sa(&format!(
            "10.{}.{}.{}:80",
            round % SERVICES + 1,
            (round * 7 % per_service) / 250,
            (round * 7 % per_service) % 250 + 1
        ));
        for ok in [false, true] {
            let key = agent
                .server_key(&service, addr)
                .expect("a configured server");
            let before = agent.propagation().count;
            agent
                .on_probe_report(ProbeReport {
                    server: key,
                    probe: 0,
                    outcome: if ok {
                        ProbeOutcome::pass(Duration::from_millis(1), "bench")
                    } else {
                        ProbeOutcome::fail(Duration::from_millis(1), "bench")
                    },
                    at: tokio::time::Instant::now(),
                })
                .expect("memory publishing");
            assert_eq!(
                agent.propagation().count,
                before + 1,
                "the verdict on {addr} reached the maps"
            );
            let incremental_first = (round + usize::from(ok)) % 2 == 0;
            let mut inc = 0.0;
            if incremental_first {
                inc = timed_build(&mut agent);
            }
            let t = Instant::now();
            let full_snap = agent.snapshot_from_scratch();
            let full = t.elapsed().as_secs_f64() * 1000.0;
            if !incremental_first {
                inc = timed_build(&mut agent);
            }
            after_verdict.push(inc);
            scratch.push(full);
            rebuilt.push(agent.snapshot_records_rebuilt() as f64);
            if round == 0 {
                assert_eq!(
                    serde_json::to_value(&*handles.snapshot.borrow().clone()).unwrap(),
                    serde_json::to_value(&full_snap).unwrap(),
                    "the incremental snapshot equals one built from scratch"
                );
            }
            assert!(
                agent.snapshot_records_rebuilt() < per_service,
                "a verdict rebuilds its server's record and those whose slots moved, \
                 not every record ({} of {servers})",
                agent.snapshot_records_rebuilt()
            );
        }
    }
    let (p, plo, phi) = median(polls);
    let (q, qlo, qhi) = median(quiet);
    let (v, vlo, vhi) = median(after_verdict);
    let (sp, splo, sphi) = median(probed);
    let (f, flo, fhi) = median(scratch);
    let (r, rlo, rhi) = median(rebuilt);
    let n = 2 * ROUNDS;
    println!("{servers} servers ({SERVICES} services of {per_service})");
    println!("poll_stats: median {p:.2} ms [{plo:.2}-{phi:.2}] over {ROUNDS} calls");
    println!("first snapshot build (every record new): {first:.2} ms");
    println!("snapshot build, nothing changed: median {q:.3} ms [{qlo:.3}-{qhi:.3}] over {ROUNDS}");
    println!(
        "snapshot build after every server was probed once: median {sp:.2} ms \
         [{splo:.2}-{sphi:.2}] over {ROUNDS}"
    );
    println!(
        "snapshot build after one verdict, incremental: median {v:.3} ms [{vlo:.3}-{vhi:.3}] \
         over {n}, records rebuilt median {r} [{rlo}-{rhi}]"
    );
    println!(
        "snapshot build after one verdict, from scratch: median {f:.2} ms [{flo:.2}-{fhi:.2}] over {n}"
    );
}
