//! `lb-agent run`: attach, serve the configured services, probe, and keep the data plane
//! in step (SIGHUP reloads, SIGINT/SIGTERM detach and exit).

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use lb_agent::{
    agent::{Agent, Environment, KernelNeighbors},
    api::{self, ApiState},
    config::{self, Config},
    dataplane::{AttachMode, BpfDataplane, EventStream, pin::PinDir},
    probe::NetProber,
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{info, warn};

/// How long one backend's MAC resolution may take before it counts as unknown.
const MAC_TIMEOUT: Duration = Duration::from_secs(1);
/// How often unknown MACs are retried.
const MAC_RETRY: Duration = Duration::from_secs(2);
/// How often data-plane counters are read (passive success, idle mode, status).
const STATS_EVERY: Duration = Duration::from_millis(500);
/// Probe reports handled (and published) together at most.
const REPORT_BATCH: usize = 256;

pub struct RunOptions {
    pub config: PathBuf,
    pub interface: Option<String>,
    pub xdp_mode: Option<AttachMode>,
    /// Forget pinned state from a previous run and start from scratch.
    pub reset: bool,
}

pub fn run(opts: RunOptions) -> anyhow::Result<ExitCode> {
    let cfg = match config::load(&opts.config) {
        Ok(cfg) => cfg,
        Err(err) => {
            eprintln!("lb-agent: {err}");
            return Ok(ExitCode::from(2));
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(opts, cfg))
}

async fn serve(opts: RunOptions, cfg: Config) -> anyhow::Result<ExitCode> {
    lb_agent::rlimit::raise_nofile_logged();
    let interface = opts
        .interface
        .clone()
        .or_else(|| cfg.agent.interface.clone())
        .context("no interface: set `agent.interface` in the config or pass --interface")?;
    let mode = opts.xdp_mode.unwrap_or(match cfg.agent.xdp_mode {
        config::XdpMode::Auto => AttachMode::Auto,
        config::XdpMode::Native => AttachMode::Native,
        config::XdpMode::Generic => AttachMode::Generic,
    });
    // Handlers first: a SIGHUP right after "ready" must reload, not kill us.
    let mut sighup = signal(SignalKind::hangup())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let pins = match &cfg.agent.pin_path {
        Some(path) => Some(
            PinDir::prepare(path, opts.reset)
                .with_context(|| format!("preparing the pin directory {}", path.display()))?,
        ),
        None => None,
    };
    let pinned = pins.is_some();
    let mut dp = BpfDataplane::load_with(pins).context("loading the XDP program")?;
    dp.attach(&interface, mode)
        .with_context(|| format!("attaching to {interface}"))?;
    let adopted = if pinned {
        dp.published_state().context("reading the pinned state")?
    } else {
        Default::default()
    };
    let mut events = dp.take_events().transpose()?;
    let env = Environment {
        interface: interface.clone(),
        xdp_mode: dp.mode().name().to_string(),
    };
    let neighbors = Arc::new(KernelNeighbors {
        interface: interface.clone(),
        timeout: MAC_TIMEOUT,
    });
    let (mut agent, mut handles) = Agent::new(dp, Arc::new(NetProber), neighbors, env);
    if !adopted.services.is_empty() {
        info!(
            services = adopted.services.len(),
            backends = adopted.backends.len(),
            "adopting the pinned state of a previous run"
        );
        agent.adopt(&adopted);
    }
    agent
        .apply_config(&cfg)
        .await
        .context("publishing the configured services")?;
    agent.flush_snapshot();

    let (admin_tx, mut admin_rx) = mpsc::channel(64);
    let (reload_tx, mut reload_rx) = mpsc::channel::<api::ReloadRequest>(4);
    if let Some(listen) = cfg.agent.api_listen {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the API to {listen}"))?;
        info!(address = %listener.local_addr()?, "API listening");
        let state = ApiState {
            snapshot: handles.snapshot.clone(),
            events: handles.events.clone(),
            admin: admin_tx,
            reload: reload_tx,
        };
        tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, api::router(state)).await {
                warn!(error = %err, "API server stopped");
            }
        });
    }
    info!(
        interface,
        mode = agent.dataplane().mode().name(),
        services = cfg.services.len(),
        "lb-agent ready"
    );

    let mut mac_retry = tokio::time::interval(MAC_RETRY);
    let mut stats = tokio::time::interval(STATS_EVERY);
    loop {
        let deadline = agent.next_deadline();
        let result = tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            _ = sighup.recv() => {
                let _ = reload(&mut agent, &opts.config).await;
                Ok(())
            }
            Some(reply) = reload_rx.recv() => {
                let _ = reply.send(reload(&mut agent, &opts.config).await);
                Ok(())
            }
            Some(report) = handles.reports.recv() => {
                // Take what else is queued: one publish for a burst of verdicts.
                let mut batch = vec![report];
                while batch.len() < REPORT_BATCH {
                    match handles.reports.try_recv() {
                        Ok(r) => batch.push(r),
                        Err(_) => break,
                    }
                }
                agent.on_probe_reports(batch)
            }
            batch = next_events(&mut events) => match batch {
                Ok(batch) => agent.on_passive_events(&batch),
                Err(err) => {
                    warn!(error = %err, "event ring buffer failed; passive events stop");
                    events = None;
                    Ok(())
                }
            },
            Some(req) = admin_rx.recv() => {
                agent.on_admin(req).await;
                Ok(())
            }
            _ = sleep_until(deadline) => agent.on_tick(tokio::time::Instant::now()),
            _ = sleep_until(agent.snapshot_deadline()) => {
                agent.flush_snapshot();
                Ok(())
            }
            _ = stats.tick() => {
                agent.poll_stats();
                agent.publish_snapshot();
                Ok(())
            }
            _ = mac_retry.tick(), if agent.has_unknown_macs() => agent.retry_macs().await,
            _ = agent.resolve_ready() => agent.reresolve().await,
        };
        if let Err(err) = result {
            warn!(error = %err, "publishing to the data plane failed");
        }
        agent.flush_snapshot();
    }
    match agent.dataplane().pins() {
        Some(p) => info!(
            pins = %p.path().display(),
            "shutting down: XDP stays attached with the last published state; a restart adopts it \
             (`lb-agent detach` removes it)"
        ),
        None => info!("shutting down: detaching XDP"),
    }
    drop(agent);
    Ok(ExitCode::SUCCESS)
}

/// Re-reads the config and applies it as a diff; an invalid file leaves the running
/// config in force. Logs `config reloaded` or `reload failed: …`.
async fn reload<D, P, N>(agent: &mut Agent<D, P, N>, path: &std::path::Path) -> Result<(), String>
where
    D: lb_agent::dataplane::Dataplane,
    P: lb_agent::probe::Prober,
    N: lb_agent::agent::Neighbors,
{
    let new_cfg = match config::load(path) {
        Ok(cfg) => cfg,
        Err(err) => {
            warn!(error = %err, "reload failed: the running config stays in force");
            return Err(err.to_string());
        }
    };
    match agent.apply_config(&new_cfg).await {
        Ok(()) => {
            info!(path = %path.display(), "config reloaded");
            Ok(())
        }
        Err(err) => {
            warn!(error = %err, "reload failed while publishing");
            Err(format!("publishing the new config failed: {err}"))
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn next_events(
    events: &mut Option<EventStream>,
) -> Result<Vec<lb_common::events::PassiveEvent>, lb_agent::dataplane::DataplaneError> {
    match events {
        Some(stream) => stream.next_batch().await,
        None => std::future::pending().await,
    }
}

/// `lb-agent detach`: removes the pin directory (the program detaches with its link).
pub fn detach(config: &std::path::Path) -> anyhow::Result<ExitCode> {
    let cfg = match config::load(config) {
        Ok(cfg) => cfg,
        Err(err) => {
            eprintln!("lb-agent: {err}");
            return Ok(ExitCode::from(2));
        }
    };
    match cfg.agent.pin_path {
        Some(path) => {
            lb_agent::dataplane::pin::remove(&path)
                .with_context(|| format!("removing {}", path.display()))?;
            println!("removed {}", path.display());
        }
        None => println!("pin_path is empty: nothing is pinned"),
    }
    Ok(ExitCode::SUCCESS)
}
