//! `lb-agent run`: attach, publish the configured services, and keep them published
//! (SIGHUP reloads, SIGINT/SIGTERM detach and exit).

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::Context;
use lb_agent::{
    config::{self, BackupLevel, Config, Forwarding, Protocol, ServerAddress},
    dataplane::{AttachMode, BpfDataplane},
    neighbor,
    publish::{DesiredBackend, DesiredService, NatSpec, Publisher, Role},
};
use lb_common::{IPPROTO_TCP, IPPROTO_UDP, events::event_name};
use tokio::{
    signal::unix::{SignalKind, signal},
    task::JoinSet,
};
use tracing::{debug, info, warn};

/// How long one backend's MAC resolution may take before it counts as unknown.
const MAC_TIMEOUT: Duration = Duration::from_secs(1);
/// How often unknown MACs and names are retried.
const RETRY_EVERY: Duration = Duration::from_secs(2);

pub struct RunOptions {
    pub config: PathBuf,
    pub interface: Option<String>,
    pub xdp_mode: Option<AttachMode>,
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
    let mut dp = BpfDataplane::load_and_attach(&interface, mode)
        .with_context(|| format!("attaching to {interface}"))?;
    let mut events = dp.take_events().transpose()?;

    let mut state = State {
        cfg,
        interface,
        publisher: Publisher::default(),
        addrs: HashMap::new(),
        macs: HashMap::new(),
    };
    state.refresh_and_apply(&mut dp).await?;
    info!(
        interface = dp.interface(),
        mode = dp.mode().name(),
        services = state.cfg.services.len(),
        "lb-agent ready"
    );

    let mut sighup = signal(SignalKind::hangup())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut retry = tokio::time::interval(RETRY_EVERY);
    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            _ = sighup.recv() => match config::load(&opts.config) {
                Ok(new_cfg) => {
                    state.cfg = new_cfg;
                    match state.refresh_and_apply(&mut dp).await {
                        Ok(()) => info!(path = %opts.config.display(), "config reloaded"),
                        Err(err) => warn!(error = %format!("{err:#}"), "reload failed while publishing"),
                    }
                }
                Err(err) => warn!(error = %err, "reload failed: the running config stays in force"),
            },
            batch = next_events(&mut events) => match batch {
                Ok(batch) => for e in batch {
                    debug!(kind = event_name(e.kind), backend = e.backend_id, service = e.service_id, "passive event");
                },
                Err(err) => {
                    warn!(error = %err, "event ring buffer failed; passive events stop");
                    events = None;
                }
            },
            _ = retry.tick(), if state.has_unknown() => {
                if let Err(err) = state.refresh_and_apply(&mut dp).await {
                    warn!(error = %format!("{err:#}"), "republishing failed");
                }
            },
        }
    }
    info!("shutting down: detaching XDP");
    drop(dp);
    Ok(ExitCode::SUCCESS)
}

async fn next_events(
    events: &mut Option<lb_agent::dataplane::EventStream>,
) -> Result<Vec<lb_common::events::PassiveEvent>, lb_agent::dataplane::DataplaneError> {
    match events {
        Some(stream) => stream.next_batch().await,
        None => std::future::pending().await,
    }
}

/// Key of a configured server: (service index, server index).
type ServerRef = (usize, usize);

struct State {
    cfg: Config,
    interface: String,
    publisher: Publisher,
    /// Addresses each configured server expands to (one, or several for a name).
    addrs: HashMap<ServerRef, Vec<SocketAddr>>,
    /// Link-layer addresses of backends (or their next hop).
    macs: HashMap<IpAddr, [u8; 6]>,
}

impl State {
    fn has_unknown(&self) -> bool {
        self.backend_ips().any(|ip| !self.macs.contains_key(&ip))
            || self
                .cfg
                .services
                .iter()
                .enumerate()
                .any(|(si, svc)| (0..svc.servers.len()).any(|k| !self.addrs.contains_key(&(si, k))))
    }

    fn backend_ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.addrs.values().flatten().map(SocketAddr::ip)
    }

    /// Resolves names and MACs that are still unknown, then publishes.
    async fn refresh_and_apply(&mut self, dp: &mut BpfDataplane) -> anyhow::Result<()> {
        self.resolve_names().await;
        self.resolve_macs().await;
        let desired = self.desired();
        let report = self.publisher.apply(&desired, dp)?;
        debug!(?report, "published");
        Ok(())
    }

    async fn resolve_names(&mut self) {
        let mut fresh = HashMap::new();
        for (si, svc) in self.cfg.services.iter().enumerate() {
            for (k, server) in svc.servers.iter().enumerate() {
                if server.resolve {
                    warn!(
                        service = svc.name,
                        "SRV discovery (`resolve = true`) is not supported yet; server skipped"
                    );
                    continue;
                }
                let found = match &server.address {
                    ServerAddress::Socket(addr) => Some(vec![*addr]),
                    ServerAddress::Name { host, port } => {
                        let port = port.unwrap_or(svc.vip.port());
                        match tokio::net::lookup_host((host.as_str(), port)).await {
                            Ok(it) => {
                                Some(it.filter(|a| a.is_ipv4() == svc.vip.is_ipv4()).collect())
                            }
                            Err(err) => {
                                warn!(service = svc.name, host, error = %err, "cannot resolve server name");
                                self.addrs.get(&(si, k)).cloned()
                            }
                        }
                    }
                };
                if let Some(found) = found {
                    fresh.insert((si, k), found);
                }
            }
        }
        self.addrs = fresh;
    }

    async fn resolve_macs(&mut self) {
        let mut wanted: Vec<IpAddr> = self
            .backend_ips()
            .filter(|ip| !self.macs.contains_key(ip))
            .collect();
        wanted.sort();
        wanted.dedup();
        let mut jobs = JoinSet::new();
        for ip in wanted {
            let interface = self.interface.clone();
            jobs.spawn(
                async move { (ip, neighbor::resolve_mac(&interface, ip, MAC_TIMEOUT).await) },
            );
        }
        while let Some(done) = jobs.join_next().await {
            match done {
                Ok((ip, Ok(mac))) => {
                    self.macs.insert(ip, mac);
                }
                Ok((ip, Err(err))) => {
                    warn!(backend = %ip, error = %err, "backend MAC unknown: not selectable until resolved")
                }
                Err(err) => warn!(error = %err, "MAC resolution task failed"),
            }
        }
    }

    /// The services as they should be in the data plane. Health arrives with the health
    /// agent; until then every configured primary carries traffic, spares and backup
    /// levels stand by (they keep any flow pinned to them).
    fn desired(&self) -> Vec<DesiredService> {
        self.cfg
            .services
            .iter()
            .enumerate()
            .map(|(si, svc)| {
                let mut backends: BTreeMap<SocketAddr, DesiredBackend> = BTreeMap::new();
                for (k, server) in svc.servers.iter().enumerate() {
                    let primary = !server.spare && matches!(server.backup, BackupLevel::Level(0));
                    for addr in self.addrs.get(&(si, k)).into_iter().flatten() {
                        backends.entry(*addr).or_insert(DesiredBackend {
                            addr: *addr,
                            weight: server.weight,
                            mac: self.macs.get(&addr.ip()).copied(),
                            role: if primary { Role::Active } else { Role::Sticky },
                        });
                    }
                }
                DesiredService {
                    name: svc.name.clone(),
                    vip: svc.vip,
                    proto: match svc.protocol {
                        Protocol::Tcp => IPPROTO_TCP,
                        Protocol::Udp => IPPROTO_UDP,
                    },
                    nat: match svc.forwarding {
                        Forwarding::Nat => svc.snat_ip.map(|snat_ip| NatSpec {
                            snat_ip,
                            ports: svc.snat_ports.clone(),
                        }),
                        Forwarding::Dsr => None,
                    },
                    backends: backends.into_values().collect(),
                }
            })
            .collect()
    }
}
