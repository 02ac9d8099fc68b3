//! `lb-agent run`: attach, serve the configured services, probe, and keep the data plane
//! in step (SIGHUP reloads; SIGINT/SIGTERM exit and leave the program attached, see
//! docs/restarts.md).

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use super::lifecycle;
use anyhow::Context;
use lb_agent::{
    agent::{AdminState, Agent, Environment, KernelNeighbors},
    api::{self, ApiState},
    config::{self, Config},
    dataplane::{AttachMode, EventStream, LinkWatch, MapSizes},
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
/// How often the agent checks that the interface still runs its XDP program, at least
/// (link notifications trigger a check at once).
const LINK_WATCH_EVERY: Duration = Duration::from_secs(1);
/// How often the flow and nat tables are counted (`lb_flow_table_entries`,
/// `lb_server_active_flows`; docs/metrics.md).
const TABLE_CENSUS_EVERY: Duration = Duration::from_secs(5);

pub struct RunOptions {
    pub config: PathBuf,
    pub interface: Option<String>,
    pub xdp_mode: Option<AttachMode>,
    /// Do not adopt the running program's maps: replace it with fresh state.
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
    super::init_logging(cfg.agent.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(opts, cfg))
}

async fn serve(opts: RunOptions, cfg: Config) -> anyhow::Result<ExitCode> {
    lb_agent::rlimit::raise_nofile_logged();
    if let Some(warning) = config::non_loopback_api(&cfg.agent) {
        warn!("!!! {warning} !!!");
    }
    if let Err(why) = lb_agent::host::check_snat_ips(&cfg) {
        eprintln!("lb-agent: {}: {why}", opts.config.display());
        return Ok(ExitCode::from(2));
    }
    for warning in lb_agent::host::snat_port_warnings(&cfg) {
        warn!("{warning}");
    }
    let token = match &cfg.agent.api_token_file {
        Some(path) if cfg.agent.api_listen.is_some() => match api::load_token(path) {
            Ok(token) => Some(token),
            Err(err) => {
                eprintln!("lb-agent: {err}");
                return Ok(ExitCode::from(2));
            }
        },
        _ => None,
    };
    let saved = match &cfg.agent.state_file {
        Some(path) => match AdminState::load(path) {
            Ok(state) => state,
            Err(err) => {
                warn!(error = %err, "the runtime admin state cannot be restored: starting from the file alone");
                AdminState::default()
            }
        },
        None => AdminState::default(),
    };
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
    let lifecycle::Prepared {
        mut dp,
        adopted,
        previous,
        pin_lock: _pin_lock,
    } = lifecycle::prepare(
        &interface,
        cfg.agent.pin_path.as_deref(),
        opts.reset,
        MapSizes::for_backends(cfg.agent.max_backends)
            .context("agent.max_backends out of range (the config check allows 1..=1048575)")?
            .with_flows(config::max_flows(&cfg.agent))
            .context("agent.max_flows out of range (the config check allows 1024..=16777216)")?,
    )?;
    let mut events = dp.take_events().transpose()?;
    // Counted off the agent's task: a scan reads both tables (about 130 MB).
    if let Err(err) = dp.start_census(TABLE_CENSUS_EVERY) {
        warn!("flow and nat table figures unavailable: {err}");
    }
    let env = Environment {
        interface: interface.clone(),
        xdp_mode: dp.mode_name().to_string(),
        tables: dp.sizes().status(),
    };
    // The netlink watch starts with it: the MACs lb writes follow the kernel's tables.
    let (neighbors, mut mac_updates) = KernelNeighbors::new(&interface, MAC_TIMEOUT)
        .context("opening the netlink connection for neighbours and routes")?;
    let neighbors = Arc::new(neighbors);
    // Sets the SYN check up (or says once why tcp probes connect instead) before the
    // first probe runs.
    if cfg
        .services
        .iter()
        .flat_map(|s| &s.probes)
        .any(lb_agent::probe::syn::wanted)
    {
        let _ = lb_agent::probe::syn::availability();
    }
    let (mut agent, mut handles) = Agent::new(dp, Arc::new(NetProber), neighbors, env);
    if !adopted.services.is_empty() {
        agent.adopt(&adopted);
    }
    if !saved.is_empty()
        && let Some(path) = &cfg.agent.state_file
    {
        info!(path = %path.display(), "restoring the runtime admin state of the previous run");
    }
    agent.keep_admin_state(cfg.agent.state_file.clone(), saved);
    agent
        .apply_config(&cfg)
        .await
        .context("publishing the configured services")?;
    // Attached (or swapped in) only now: the program never runs on unpublished maps.
    agent
        .dataplane_mut()
        .set_tunnel_source(cfg.agent.tunnel_source);
    lifecycle::attach(agent.dataplane_mut(), &interface, mode, previous.as_ref())?;
    drop(previous);
    let xdp_mode = agent.dataplane().mode_name();
    agent.set_xdp_mode(xdp_mode);
    // Announced only now, with the program forwarding (docs/multi-node.md).
    let mut bgp_rx = super::node::start_announcing(&mut agent, &cfg.agent)?;

    let (admin_tx, mut admin_rx) = mpsc::channel(64);
    // Readers ask the loop for the snapshot; it is built then, not after every change.
    let (snapshot_tx, mut snapshot_rx) = mpsc::channel::<api::SnapshotRequest>(256);
    let (reload_tx, mut reload_rx) = mpsc::channel::<api::ReloadRequest>(4);
    let state = ApiState {
        snapshot: api::SnapshotSource::on_demand(handles.snapshot.clone(), snapshot_tx),
        events: handles.events.clone(),
        admin: admin_tx,
        reload: reload_tx,
        counters: Default::default(),
    };
    let listen = api::ListenConfig {
        tcp: cfg.agent.api_listen,
        socket: cfg.agent.api_socket.clone(),
        socket_group: cfg.agent.api_socket_group.clone(),
        token,
        limits: api::Limits::default(),
    };
    let listening = api::listen(state, listen).await?;
    if let Some(addr) = listening.tcp {
        info!(address = %addr, changes = if cfg.agent.api_token_file.is_some() { "with the bearer token" } else { "refused (use the socket)" }, "API listening on TCP");
    }
    if let Some(socket) = &listening.socket {
        info!(path = %socket.path().display(), "API listening on the Unix socket");
    }
    log_passive_gaps(&cfg);
    info!(
        interface,
        mode = agent.dataplane().mode_name(),
        services = cfg.services.len(),
        "lb-agent ready"
    );
    // systemd (`Type=notify`): started once the program is attached and published.
    tell_systemd(&format!(
        "READY=1\nSTATUS=serving {} services on {interface} ({} XDP)",
        cfg.services.len(),
        agent.dataplane().mode_name()
    ));
    // `WatchdogSec=`: pinged from this loop, so a loop that hangs stops the pings.
    let mut watchdog = lb_agent::sd_notify::watchdog_every().map(tokio::time::interval);

    let mut mac_retry = tokio::time::interval(MAC_RETRY);
    // Only when announcing with a lifetime; the first tick is at once, so a restart
    // refreshes what the previous run announced before anything else.
    let mut announce_refresh = match (&cfg.agent.announce_interface, cfg.agent.announce_lifetime) {
        (Some(_), Some(lifetime)) => Some(tokio::time::interval(
            lb_agent::config::announce_refresh_every(lifetime),
        )),
        _ => None,
    };
    let mut stats = tokio::time::interval(STATS_EVERY);
    let mut link_watch = LinkWatch::new(LINK_WATCH_EVERY);
    let mut reattached = 0;
    let mut exit = ExitCode::SUCCESS;
    loop {
        let deadline = agent.next_deadline();
        let result = tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            _ = sighup.recv() => {
                let _ = reload(&mut agent, &opts.config, &cfg.agent).await;
                Ok(())
            }
            Some(reply) = reload_rx.recv() => {
                let _ = reply.send(reload(&mut agent, &opts.config, &cfg.agent).await);
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
            Some(reply) = snapshot_rx.recv() => {
                agent.on_snapshot_request(reply);
                Ok(())
            }
            _ = sleep_until(agent.readers_deadline()) => Ok(()),
            _ = stats.tick() => {
                agent.poll_stats();
                Ok(())
            }
            _ = mac_retry.tick(), if agent.has_unknown_macs() => agent.retry_macs().await,
            Some(updates) = mac_updates.recv() => agent.on_mac_updates(&updates),
            _ = next_tick(&mut watchdog) => {
                tell_systemd("WATCHDOG=1");
                Ok(())
            }
            _ = next_tick(&mut announce_refresh) => {
                agent.refresh_announcements();
                Ok(())
            }
            _ = link_watch.due() => {
                match lifecycle::watch(agent.dataplane_mut(), &mut reattached) {
                    Ok(Some(status)) => agent.set_xdp_mode(&status),
                    Ok(None) => {}
                    Err(_) => {
                        exit = ExitCode::FAILURE;
                        break;
                    }
                }
                Ok(())
            }
            _ = agent.resolve_ready() => agent.reresolve().await,
            Some(sessions) = super::node::next_bgp(&mut bgp_rx) => {
                agent.set_bgp_sessions(sessions);
                Ok(())
            }
        };
        if let Err(err) = result {
            warn!(error = %err, "publishing to the data plane failed");
        }
        agent.answer_readers();
    }
    tell_systemd("STOPPING=1");
    lifecycle::log_shutdown(agent.dataplane());
    drop(agent);
    drop(listening);
    Ok(exit)
}

/// Says, once per service, where `max_fails` is set but passive checks see little or
/// nothing (udp, dsr: docs/passive-signals.md), so that `max_fails = 1` is not taken for
/// protection.
fn log_passive_gaps(cfg: &config::Config) {
    for svc in &cfg.services {
        if let Some(gap) = config::passive_gap(svc) {
            warn!(service = %svc.name, "passive checks: {gap}");
        }
    }
}

/// Re-reads the config and applies it as a diff; an invalid file leaves the running
/// config in force. Logs `config reloaded` (with a warning naming `[agent]` keys that
/// need a restart) or `reload failed: …`. `running` is the `[agent]` table in force.
async fn reload<D, P, N>(
    agent: &mut Agent<D, P, N>,
    path: &std::path::Path,
    running: &config::AgentConfig,
) -> Result<api::ReloadOutcome, String>
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
    if let Err(why) = lb_agent::host::check_snat_ips(&new_cfg) {
        warn!(error = %why, "reload failed: the running config stays in force");
        return Err(format!("{}: {why}", path.display()));
    }
    let mut warnings = Vec::new();
    let restart_only = config::restart_only_changes(running, &new_cfg.agent);
    if !restart_only.is_empty() {
        warn!(keys = restart_only.0.join(", "), "{restart_only}");
        warnings.push(restart_only.to_string());
    }
    match agent.apply_config_reporting(&new_cfg).await {
        Ok(report) => {
            warnings.extend(
                report
                    .dropped
                    .iter()
                    .map(|d| format!("runtime admin state dropped: {d}")),
            );
            log_passive_gaps(&new_cfg);
            if warnings.is_empty() {
                info!(path = %path.display(), "config reloaded");
            } else {
                info!(path = %path.display(), warnings = warnings.len(), "config reloaded (with warnings)");
            }
            Ok(api::ReloadOutcome { warnings })
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

/// Sends `state` to systemd when it started the agent as `Type=notify`; a failure is
/// logged (systemd then times the start out, or the watchdog fires).
fn tell_systemd(state: &str) {
    if let Err(err) = lb_agent::sd_notify::notify(state) {
        warn!(error = %err, state, "notifying systemd failed");
    }
}

/// The next tick of an optional interval (pending forever without one).
async fn next_tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
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
