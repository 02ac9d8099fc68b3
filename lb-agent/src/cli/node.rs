//! `lb-agent node {drain|undrain|status}`: the node's VIP announcement (docs/multi-node.md),
//! and the `run` side of it: start announcing once attached, poll BIRD for status.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use hyper::Method;
use lb_agent::{
    agent::{Agent, Neighbours},
    announce::{KernelRoutes, bird_sessions},
    config::AgentConfig,
    dataplane::Dataplane,
    probe::Prober,
    view::AnnounceStatus,
};
use tokio::sync::watch;
use tracing::info;

use super::http;

/// How often BIRD's sessions are read for status.
const BIRD_EVERY: Duration = Duration::from_secs(2);

/// What to do to the node.
pub enum NodeAction {
    /// Withdraw every VIP; with `wait`, return once no packet arrived for that long.
    Drain {
        wait: Option<Duration>,
        timeout: Duration,
    },
    Undrain,
    Status,
}

/// Where the node's drain is kept across restarts: next to the admin state file.
pub fn drain_file(agent: &AgentConfig) -> Option<PathBuf> {
    let state = agent.state_file.as_ref()?;
    let mut name = state.clone().into_os_string();
    name.push(".node-drained");
    Some(PathBuf::from(name))
}

/// Starts announcing when `announce_interface` is set, and BIRD polling when
/// `bird_socket` is; returns the channel BGP status arrives on.
pub fn start_announcing<D: Dataplane, P: Prober, N: Neighbours>(
    agent: &mut Agent<D, P, N>,
    cfg: &AgentConfig,
) -> anyhow::Result<Option<watch::Receiver<bird_sessions::Sessions>>> {
    let Some(interface) = &cfg.announce_interface else {
        return Ok(None);
    };
    let routes = KernelRoutes::open(interface, cfg.announce_lifetime)
        .with_context(|| format!("preparing the announce interface {interface}"))?;
    agent.start_announcing(Box::new(routes), drain_file(cfg));
    match cfg.announce_lifetime {
        Some(lifetime) => info!(
            interface,
            lifetime_s = lifetime.as_secs(),
            refresh_s = lb_agent::config::announce_refresh_every(lifetime).as_secs_f64(),
            "announcing VIPs (withdrawn by the kernel if the agent stays dead)"
        ),
        None => info!(interface, "announcing VIPs (lifetime forever)"),
    }
    let Some(socket) = cfg.bird_socket.clone() else {
        return Ok(None);
    };
    let (tx, rx) = watch::channel(bird_sessions::Sessions::default());
    tokio::spawn(async move {
        let mut every = tokio::time::interval(BIRD_EVERY);
        loop {
            every.tick().await;
            if tx.send(bird_sessions::read(&socket).await).is_err() {
                return;
            }
        }
    });
    Ok(Some(rx))
}

pub async fn node(api: &http::Target, action: NodeAction) -> anyhow::Result<ExitCode> {
    match action {
        NodeAction::Drain { wait, timeout } => {
            http::request_ok(api, Method::POST, "/api/v1/node/drain", None).await?;
            println!("node drained: every VIP withdrawn; forwarding continues");
            let Some(quiet) = wait else {
                return Ok(ExitCode::SUCCESS);
            };
            let until = tokio::time::Instant::now() + timeout;
            loop {
                let status = read(api).await?;
                if status
                    .quiet_seconds
                    .is_some_and(|q| q >= quiet.as_secs_f64())
                {
                    println!(
                        "no packet for {:.1} s: traffic has stopped",
                        status.quiet_seconds.unwrap_or_default()
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                if tokio::time::Instant::now() >= until {
                    println!("traffic still arrives after {} s", timeout.as_secs());
                    return Ok(ExitCode::FAILURE);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        NodeAction::Undrain => {
            http::request_ok(api, Method::POST, "/api/v1/node/undrain", None).await?;
            println!("node undrained: VIPs announced again where their services can serve");
            Ok(ExitCode::SUCCESS)
        }
        NodeAction::Status => {
            print!("{}", render(&read(api).await?));
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn read(api: &http::Target) -> anyhow::Result<AnnounceStatus> {
    let body = http::request_ok(api, Method::GET, "/api/v1/node", None).await?;
    Ok(serde_json::from_str(&body)?)
}

/// The human view of the node's announcement.
pub fn render(s: &AnnounceStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if !s.enabled {
        out.push_str("announcing off (no announce_interface)\n");
        return out;
    }
    let _ = writeln!(
        out,
        "announce interface {}  {}  quiet {}",
        s.interface,
        if s.drained { "DRAINED" } else { "in service" },
        s.quiet_seconds
            .map_or("-".to_string(), |q| format!("{q:.1} s"))
    );
    for v in &s.vips {
        let _ = writeln!(
            out,
            "  vip {:<40} {:<10} {}{}",
            v.vip,
            if v.announced {
                "announced"
            } else {
                "withdrawn"
            },
            v.reason,
            v.error
                .as_deref()
                .map_or(String::new(), |e| format!("  (route error: {e})"))
        );
    }
    if let Some(err) = &s.bgp_error {
        let _ = writeln!(out, "  bgp: {err}");
    }
    for p in &s.bgp {
        let _ = writeln!(
            out,
            "  {:<12} {:<8} {:<6} {}",
            p.proto, p.name, p.state, p.info
        );
    }
    out
}
