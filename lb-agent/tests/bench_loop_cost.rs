//! The agent loop's two per-server costs over the memory data plane: one stats tick
//! (`poll_stats`) and one snapshot build, which must cover every server. As a test it runs
//! 10 services of 500 servers; as the benchmark of BENCHMARKS.md §3, 10 of 10,000:
//! `LB_LOOP_SERVERS_PER_SERVICE=10000 cargo test --release -p lb-agent --test bench_loop_cost -- --nocapture`.

mod agent_util;

use std::sync::Arc;
use std::time::Instant;

use agent_util::{MAC, Scripted};
use lb_agent::agent::{Agent, Environment, StaticNeighbors};
use lb_agent::dataplane::memory::MemoryDataplane;

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

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

#[tokio::test(start_paused = true)]
async fn stats_tick_and_snapshot_cover_every_server() {
    let per_service = per_service();
    let neighbors = StaticNeighbors {
        default: Some(MAC),
        ..Default::default()
    };
    let (mut agent, handles) = Agent::new(
        MemoryDataplane::with_max_backends(131_071),
        Arc::new(Scripted::default()),
        Arc::new(neighbors),
        Environment::default(),
    );
    let cfg = agent_util::parse(&config(per_service));
    agent.apply_config(&cfg).await.expect("memory publishing");
    let (mut polls, mut builds) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        agent.poll_stats();
        polls.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        agent.publish_snapshot();
        builds.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let snap = handles.snapshot.borrow().clone();
    let servers: usize = snap.services.iter().map(|s| s.servers.len()).sum();
    assert_eq!(
        servers,
        SERVICES * per_service,
        "every server is in the snapshot"
    );
    let (p, plo, phi) = median(polls);
    let (b, blo, bhi) = median(builds);
    println!("{} servers: poll_stats: median", SERVICES * per_service);
    println!("poll_stats: median {p:.1} ms [{plo:.1}-{phi:.1}] over {ROUNDS} calls");
    println!("snapshot build: median {b:.1} ms [{blo:.1}-{bhi:.1}] over {ROUNDS} calls");
}
