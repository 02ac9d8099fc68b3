//! `lb-apply-bench --servers N --services M [--runs R]`: how long `Agent::apply_config`
//! takes for N servers over M nat services (one tcp probe each, a prober that never
//! answers), over the in-memory data plane — the first apply of a configuration, and a
//! reload of the same text. The data plane is sized for the servers (`agent.max_backends`
//! = N, at least its default; docs/capacity.md), so every server is published: the
//! agent-side cost of a large configuration (BENCHMARKS.md §2).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::{Context, bail};
use lb_agent::{
    agent::{Agent, Environment, StaticNeighbours},
    config::ProbeConfig,
    probe::{ProbeOutcome, Prober},
    testing::MemoryDataplane,
};

/// A prober that never answers.
struct SilentProber;

impl Prober for SilentProber {
    fn probe(
        &self,
        _cfg: &ProbeConfig,
        _target: SocketAddr,
    ) -> impl Future<Output = ProbeOutcome> + Send {
        std::future::pending()
    }
}

/// `servers` servers over `services` nat services, round robin (as `lb-bench`), with
/// the data plane sized for them.
fn config(servers: usize, services: usize) -> String {
    let max_backends = servers.max(lb_agent::config::DEFAULT_MAX_BACKENDS as usize);
    let mut text = format!("[agent]\nmax_backends = {max_backends}\n");
    for s in 0..services {
        text.push_str(&format!(
            "[[service]]\nname = \"web{s}\"\nvip = \"10.8.{}.{}:80\"\nsnat_ip = \"10.7.0.2\"\n\
             [[service.probe]]\ntype = \"tcp\"\ninterval = \"1h\"\n",
            s / 250,
            1 + s % 250
        ));
        for i in (s..servers).step_by(services) {
            text.push_str(&format!(
                "[[service.server]]\naddress = \"10.{}.{}.{}:8080\"\n",
                10 + i / 62_500,
                (i / 250) % 250,
                1 + i % 250
            ));
        }
    }
    text
}

fn main() -> anyhow::Result<()> {
    let (mut servers, mut services, mut runs) = (100_000usize, 10usize, 3usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value =
            || -> anyhow::Result<usize> { Ok(args.next().context("a value")?.parse()?) };
        match a.as_str() {
            "--servers" => servers = value()?,
            "--services" => services = value()?,
            "--runs" => runs = value()?,
            _ => bail!("usage: lb-apply-bench [--servers N] [--services M] [--runs R]"),
        }
    }
    let text = config(servers, services);
    let cfg = lb_agent::config::parse(&text, std::path::Path::new("bench.toml"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for run in 1..=runs {
        rt.block_on(async {
            let neighbours = StaticNeighbours {
                default: Some([2, 0, 0, 0, 0, 9]),
                ..StaticNeighbours::default()
            };
            let (mut agent, _handles) = Agent::new(
                MemoryDataplane::with_max_backends(cfg.agent.max_backends),
                Arc::new(SilentProber),
                Arc::new(neighbours),
                Environment::default(),
            );
            let mut line = format!("run {run}: {servers} servers in {services} services:");
            for what in ["apply", "reload"] {
                let t = std::time::Instant::now();
                let result = agent.apply_config(&cfg).await;
                let spent: Duration = t.elapsed();
                let note = result.err().map(|e| format!(" ({e})")).unwrap_or_default();
                line += &format!(" {what} {:.2} s{note};", spent.as_secs_f64());
            }
            println!("{line}");
        });
    }
    Ok(())
}
