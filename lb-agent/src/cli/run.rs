//! `lb-agent run`: attach, serve the configured services, probe, and keep the data plane
//! in step (SIGHUP reloads; SIGINT/SIGTERM exit and leave the program attached, see
//! docs/restarts.md).

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use super::lifecycle;
use anyhow::Context;
use lb_agent::{
    agent::{AdminState, Agent, ClusterNode, Environment, KernelNeighbours},
    api::{self, ApiState},
    config::{self, Config},
    dataplane::{AttachMode, DataplaneLifecycle, MapSizes, peers::ClusterTables},
    event_loop::{
        ConfigFile, EventLoop, Exit, Inputs, UnixSignals, log_passive_gaps, tell_systemd,
    },
    probe::NetProber,
};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// How long one backend's MAC resolution may take before it counts as unknown.
const MAC_TIMEOUT: Duration = Duration::from_secs(1);
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
    if let Err(err) = lb_agent::alloc::no_transparent_huge_pages() {
        warn!("transparent huge pages stay on for the agent: {err}");
    }
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
    if let Err(why) = lb_agent::doctor::dsr_segment::check(&cfg, &interface) {
        eprintln!("lb-agent: {}: {why}", opts.config.display());
        return Ok(ExitCode::from(2));
    }
    let mode = opts.xdp_mode.unwrap_or(match cfg.agent.xdp_mode {
        config::XdpMode::Auto => AttachMode::Auto,
        config::XdpMode::Native => AttachMode::Native,
        config::XdpMode::Generic => AttachMode::Generic,
    });
    // Handlers first: a SIGHUP right after "ready" must reload, not kill us.
    let signals = UnixSignals::install()?;
    let lifecycle::Prepared {
        mut dp,
        adopted,
        previous,
        pin_lock: _pin_lock,
    } = lifecycle::prepare(&interface, cfg.agent.pin_path.as_deref(), opts.reset, {
        let sizes = MapSizes::for_backends(cfg.agent.max_backends)
            .context("agent.max_backends out of range (the config check allows 1..=1048575)")?
            .with_flows(config::max_flows(&cfg.agent))
            .context("agent.max_flows out of range (the config check allows 1024..=16777216)")?;
        // Cluster mode: the peer tables and the connection events.
        if cfg.cluster.is_some() {
            sizes.with_cluster()
        } else {
            sizes
        }
    })?;
    let events = dp.take_events().transpose()?;
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
    let (neighbours, neighbour_changes) = KernelNeighbours::new(&interface, MAC_TIMEOUT)
        .context("opening the netlink connection for neighbours and routes")?;
    let neighbours = Arc::new(neighbours);
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
    let (mut agent, handles) = Agent::new(dp, Arc::new(NetProber), neighbours, env);
    // Before the first publish: in a cluster the node hands out its slice of nat ports.
    let mut cluster_changes = None;
    let mut conn_events = None;
    if let Some(cluster) = &cfg.cluster {
        let mut started = lb_agent::cluster::Cluster::start(cluster)
            .context("starting the cluster sync ([cluster])")?;
        info!(
            node = %cluster.node,
            listen = %cluster.listen,
            peers = cluster.peers.len(),
            "cluster sync started"
        );
        cluster_changes = started.take_changes();
        let tables = ClusterTables::new(
            agent.dataplane_mut().take_peer_tables()?,
            agent.dataplane().table_reader()?,
        );
        conn_events = Some(forward_conn_events(
            agent.dataplane_mut().take_conn_events()?,
        ));
        agent.start_cluster(ClusterNode::new(started, Box::new(tables)));
    }
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
    // Before the event loop runs: the peers' MACs may need a neighbour resolution.
    agent.resolve_members(MAC_TIMEOUT).await;
    // Attached (or swapped in) only now: the program never runs on unpublished maps.
    agent
        .dataplane_mut()
        .set_tunnel_source(cfg.agent.tunnel_source);
    lifecycle::attach(agent.dataplane_mut(), &interface, mode, previous.as_ref())?;
    drop(previous);
    let xdp_mode = agent.dataplane().mode_name();
    agent.set_xdp_mode(xdp_mode);
    // In a cluster, nothing is announced before the peers' bulk resync completed (or
    // `resync_timeout` passed): the node could not forward their connections.
    if let Some(cluster) = agent.cluster() {
        let mut resynced = cluster.resync_complete();
        info!("waiting for the cluster's bulk resync before announcing");
        // The replicas the bulk brings are installed as they come.
        loop {
            tokio::select! {
                _ = resynced.wait_for(|done| *done) => break,
                Some(changes) = next_changes(&mut cluster_changes) => {
                    agent.on_cluster_changes(changes).await;
                }
            }
        }
    }
    // Announced only now, with the program forwarding (docs/multi-node.md).
    let bgp = super::node::start_announcing(&mut agent, &cfg.agent)?;

    let (admin_tx, admin) = mpsc::channel(64);
    // Readers ask the loop for the snapshot; it is built then, not after every change.
    let (snapshot_tx, snapshots) = mpsc::channel::<api::SnapshotRequest>(256);
    let (reload_tx, reloads) = mpsc::channel::<api::ReloadRequest>(4);
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
    let inputs = Inputs {
        reports: handles.reports,
        admin,
        snapshots,
        reloads,
        neighbour_changes,
        bgp,
        signals,
        passive_events: events,
        conn_events,
        cluster_changes,
        attachment: lifecycle::Attachment::watch(),
        config: Box::new(ConfigFile::new(opts.config.clone(), interface.clone())),
        // `WatchdogSec=`: pinged from the loop, so a loop that hangs stops the pings.
        watchdog: lb_agent::sd_notify::watchdog_every(),
    };
    let mut event_loop = EventLoop::new(agent, cfg.agent.clone(), inputs);
    let exit = match event_loop.run().await {
        Exit::Stopped => ExitCode::SUCCESS,
        Exit::DataplaneLost => ExitCode::FAILURE,
    };
    tell_systemd("STOPPING=1");
    lifecycle::log_shutdown(event_loop.agent().dataplane());
    drop(event_loop);
    drop(listening);
    Ok(exit)
}

/// Reads the data plane's connection events on a task of their own and hands them to
/// the event loop in batches (the loop stays generic over where they come from).
fn forward_conn_events(
    mut stream: lb_agent::dataplane::ConnEventStream,
) -> mpsc::Receiver<Vec<lb_common::events::ConnEvent>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            match stream.next_batch().await {
                Ok(batch) => {
                    if tx.send(batch).await.is_err() {
                        return;
                    }
                }
                Err(err) => {
                    warn!(error = %err, "connection event ring failed; the cluster gets no more of this node's connections");
                    return;
                }
            }
        }
    });
    rx
}

/// The next batch of replica changes; pending forever without a stream.
async fn next_changes(
    changes: &mut Option<mpsc::UnboundedReceiver<Vec<lb_agent::cluster::Change>>>,
) -> Option<Vec<lb_agent::cluster::Change>> {
    match changes {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
