//! Measures (ignored by default) the agent loop's two per-server costs at 100,000 servers
//! over the memory data plane: one stats tick (`poll_stats`) and one snapshot build.
//! Run: `cargo test -p lb-agent --test bench_loop_cost -- --ignored --nocapture`.

mod agent_util;

use std::sync::Arc;
use std::time::Instant;

use agent_util::{MAC, Scripted};
use lb_agent::agent::{Agent, Environment, StaticNeighbors};
use lb_agent::dataplane::memory::MemoryDataplane;

const SERVICES: usize = 10;
const PER_SERVICE: usize = 10_000;
const ROUNDS: usize = 5;

fn config() -> String {
    let mut t = String::from("[agent]\nmax_backends = 131071\n");
    for s in 0..SERVICES {
        t.push_str(&format!(
            "[[service]]\nname = \"s{s}\"\nvip = \"10.0.0.{}:80\"\nsnat_ip = \"10.0.0.2\"\n",
            s + 100
        ));
        t.push_str("[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n");
        for i in 0..PER_SERVICE {
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
#[ignore = "a benchmark: run by name with --ignored --nocapture"]
async fn stats_tick_and_snapshot_at_100000_servers() {
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
    let cfg = agent_util::parse(&config());
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
        SERVICES * PER_SERVICE,
        "every server is in the snapshot"
    );
    let (p, plo, phi) = median(polls);
    let (b, blo, bhi) = median(builds);
    println!("poll_stats: median {p:.1} ms [{plo:.1}-{phi:.1}] over {ROUNDS} calls");
    println!("snapshot build: median {b:.1} ms [{blo:.1}-{bhi:.1}] over {ROUNDS} calls");
}
