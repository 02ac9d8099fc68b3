//! Command-line surface of `lb-agent` (DESIGN.md §8).

mod check_config;
mod decap;
mod detach;
mod doctor;
mod events;
mod generate;
mod http;
mod import;
mod lifecycle;
mod node;
mod run;
mod server;
mod status;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};

use lb_agent::dataplane::AttachMode;

#[derive(Parser, Debug)]
#[command(
    name = "lb-agent",
    version,
    about = "XDP L4 load balancer and health agent"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Attach to the interface and serve the configured services.
    Run {
        /// The config file, e.g. /etc/lb/lb.toml.
        #[arg(long, short)]
        config: PathBuf,
        /// NIC to attach to (overrides `agent.interface`).
        #[arg(long)]
        interface: Option<String>,
        /// XDP attach mode (overrides `agent.xdp_mode`).
        #[arg(long, value_enum)]
        xdp_mode: Option<XdpModeArg>,
        /// Do not adopt the maps of the lb program running on the interface: replace it
        /// with fresh state (pinned flows and NAT state are dropped).
        #[arg(long)]
        reset: bool,
    },
    /// Remove lb's XDP program, which a stopped agent leaves forwarding, from the
    /// interface, and the pins of `agent.pin_path`. Refuses while an agent runs. Run it
    /// in the agent's network namespace.
    Detach {
        /// The config file, e.g. /etc/lb/lb.toml.
        #[arg(long, short)]
        config: PathBuf,
        /// The interface (overrides `agent.interface`).
        #[arg(long)]
        interface: Option<String>,
    },
    /// On a backend of `ipip`/`gue` services: lb's decapsulation program, which strips
    /// the tunnel headers of packets to this host (docs/tunnel.md).
    Decap {
        #[command(subcommand)]
        action: DecapCommand,
    },
    /// Check this host before running the balancer: kernel, privileges, the interface and
    /// its driver, sysctls, addresses, bpffs, BIRD. One line per check (ok, warning,
    /// blocker, with what to do); exit status 1 when something blocks (docs/doctor.md).
    Doctor {
        /// The config the agent will run with (without it, only host-wide checks run).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// The interface (overrides `agent.interface`).
        #[arg(long)]
        interface: Option<String>,
    },
    /// Validate a config file and print each probe's detection and recovery bounds.
    CheckConfig {
        /// The config file, e.g. /etc/lb/lb.toml.
        #[arg(long, short, required_unless_present = "file")]
        config: Option<PathBuf>,
        /// The config file, as `--config` (`check-config lb.toml` works too).
        #[arg(value_name = "FILE", conflicts_with = "config")]
        file: Option<PathBuf>,
    },
    /// Print an lb.toml converted from keepalived's `virtual_server` blocks or Angie/nginx
    /// `upstream` blocks, with a comment on every directive lb does differently or not at
    /// all (docs/migrating.md).
    Import {
        /// The format of FILE.
        #[arg(value_enum)]
        format: ImportFormat,
        /// The file to convert, e.g. /etc/keepalived/keepalived.conf.
        file: PathBuf,
    },
    /// Make the running agent re-read its config file (as SIGHUP does); prints why if
    /// the new file is refused (the running config then stays in force).
    Reload {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Services, servers, states, weights and spares, read from the agent's API.
    Status {
        #[command(flatten)]
        api: ApiArgs,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The agent's recent state transitions (`GET /api/v1/events`), oldest first.
    Events {
        #[command(flatten)]
        api: ApiArgs,
        /// Print the API's JSON instead of one line per transition.
        #[arg(long, conflicts_with = "follow")]
        json: bool,
        /// Keep polling (every second) and print new transitions as they come; stop
        /// with Ctrl-C.
        #[arg(long, short)]
        follow: bool,
    },
    /// This node's VIP announcement to the routers (docs/multi-node.md).
    Node {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        action: NodeCommand,
    },
    /// Change a server at runtime (through the agent's API).
    Server {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        action: ServerCommand,
    },
    /// Print a shell completion script, e.g. `lb-agent completions bash >
    /// /etc/bash_completion.d/lb-agent` (the package installs them).
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (lb-agent.8 and one per command) into DIR (packaging).
    #[command(hide = true)]
    Manpages {
        /// The directory to write them into (created if missing).
        dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum DecapCommand {
    /// Attach `lb_decap` (it stays attached after this command exits).
    Attach {
        /// The interface tunnel packets arrive on.
        #[arg(long)]
        interface: String,
        /// An outer destination to decapsulate (repeatable); default: the interface's
        /// addresses.
        #[arg(long = "address")]
        addresses: Vec<std::net::IpAddr>,
        /// XDP attach mode.
        #[arg(long, value_enum, default_value = "auto")]
        xdp_mode: XdpModeArg,
    },
    /// Remove `lb_decap` from the interface.
    Detach {
        /// The interface.
        #[arg(long)]
        interface: String,
    },
}

/// Where the agent's API is (docs/api-security.md): `--api`, else `--socket`, else the
/// `--config` file's `api_socket` (or its `api_listen` when the socket is disabled),
/// else the default socket.
#[derive(clap::Args, Debug)]
struct ApiArgs {
    /// The agent's Unix socket (`agent.api_socket`): every command, no token [default:
    /// the config's `api_socket`, else /run/lb-agent/lb-agent.sock].
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    /// Use the TCP API instead, e.g. `http://127.0.0.1:9900` (`agent.api_listen`).
    #[arg(long, global = true)]
    api: Option<String>,
    /// With --api: the bearer token file (`agent.api_token_file`) changes need.
    #[arg(long, global = true, requires = "api")]
    token_file: Option<PathBuf>,
    /// The agent's config file: its `api_socket` (or `api_listen` and `api_token_file`
    /// when the socket is disabled) says where the API is.
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
}

impl ApiArgs {
    fn target(&self) -> anyhow::Result<http::Target> {
        if self.api.is_some() {
            return http::Target::new(
                self.socket
                    .as_deref()
                    .unwrap_or(http::DEFAULT_SOCKET.as_ref()),
                self.api.as_deref(),
                self.token_file.as_deref(),
            );
        }
        if let Some(socket) = &self.socket {
            return http::Target::new(socket, None, None);
        }
        match &self.config {
            Some(path) => http::Target::from_config(path),
            None => http::Target::new(http::DEFAULT_SOCKET.as_ref(), None, None),
        }
    }
}

/// The server a `server` command changes.
#[derive(clap::Args, Debug)]
struct ServerRef {
    /// The service's `name` in the config, e.g. `web`.
    service: String,
    /// The server's address as the service lists it: `IP:PORT` or `[IPv6]:PORT`
    /// (`lb-agent status` shows them), or the IP alone when the service has one server
    /// there.
    address: String,
}

#[derive(Subcommand, Debug)]
enum NodeCommand {
    /// Withdraw every VIP from the routers; flows that still arrive keep being forwarded.
    /// Persists across restarts. Before stopping a node for good: drain, then stop.
    Drain {
        /// Wait until no packet arrived for this many seconds (traffic has stopped).
        #[arg(long, value_name = "SECONDS")]
        wait_quiet: Option<u64>,
        /// Give up waiting after this many seconds (exit status 1).
        #[arg(long, default_value_t = 300, value_name = "SECONDS")]
        timeout: u64,
    },
    /// Announce the VIPs again (those whose services can serve).
    Undrain,
    /// Announced and withdrawn VIPs with the reason, drain, BGP sessions.
    Status,
}

#[derive(Subcommand, Debug)]
enum ServerCommand {
    /// No new flows; existing flows continue.
    Drain(ServerRef),
    /// Undo `drain`.
    Undrain(ServerRef),
    /// Take out of traffic now (pinned flows move).
    Down(ServerRef),
    /// Undo `down`.
    Up(ServerRef),
    /// Change weight and/or spare flag.
    Set {
        #[command(flatten)]
        server: ServerRef,
        /// The new weight (1..10000): share of new flows.
        #[arg(long)]
        weight: Option<u32>,
        /// Make the server a spare of its primary group (`--spare` or `--spare=true`),
        /// or a primary again (`--spare=false`).
        #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        spare: Option<bool>,
    },
    /// Add a server (it takes traffic once every probe passes).
    Add {
        #[command(flatten)]
        server: ServerRef,
        /// Its weight (1..10000): share of new flows.
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// A spare of the primary group: idle until the primaries lose weight
        /// (`--spare` or `--spare=true`; `--spare=false` is the default).
        #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        spare: Option<bool>,
        /// Backup level (0 = primary group): used only when no lower level has a usable
        /// server.
        #[arg(long, default_value_t = 0, value_name = "LEVEL")]
        backup: u32,
    },
    /// Remove a server.
    Remove(ServerRef),
    /// Forget the server's runtime changes (weight, spare, drain, down): back to the file.
    Reset(ServerRef),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ImportFormat {
    /// keepalived.conf (IPVS `virtual_server`, `real_server`, checkers).
    Keepalived,
    /// Angie or nginx (`upstream`, `server`, `upstream_probe`).
    Angie,
}

impl From<ImportFormat> for lb_agent::import::Format {
    fn from(f: ImportFormat) -> Self {
        match f {
            ImportFormat::Keepalived => lb_agent::import::Format::Keepalived,
            ImportFormat::Angie => lb_agent::import::Format::Angie,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum XdpModeArg {
    Auto,
    Native,
    Generic,
}

impl From<XdpModeArg> for AttachMode {
    fn from(m: XdpModeArg) -> Self {
        match m {
            XdpModeArg::Auto => AttachMode::Auto,
            XdpModeArg::Native => AttachMode::Native,
            XdpModeArg::Generic => AttachMode::Generic,
        }
    }
}

/// `info`, but for the netlink library's warning about an answer that came after its
/// request was given up: the agent bounds its neighbour lookups (a few milliseconds in
/// the event loop) and asks again later, so a late answer is expected, not a fault.
const DEFAULT_LOG_FILTER: &str = "info,netlink_proto::connection=error";

/// Logs to stderr at `RUST_LOG`'s levels (default [`DEFAULT_LOG_FILTER`]) in `format`.
/// Text has colour only when stderr is a terminal and `NO_COLOR` is unset, so files and
/// journald get plain lines.
pub fn init_logging(format: lb_agent::config::LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        lb_agent::config::LogFormat::Text => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(colour).init();
        }
        lb_agent::config::LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    // `run` starts its log once it has read `agent.log_format`.
    if !matches!(cli.command, Command::Run { .. }) {
        // A command that prints ends quietly when its reader goes away (`| head`), as
        // Unix tools do; `run` keeps SIGPIPE ignored for its sockets.
        // SAFETY: setting a signal's disposition to its default, before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        init_logging(lb_agent::config::LogFormat::Text);
    }
    match cli.command {
        Command::Completions { shell } => {
            generate::completions(shell, &mut std::io::stdout())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Manpages { dir } => {
            generate::manpages(&dir)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            config,
            interface,
            xdp_mode,
            reset,
        } => run::run(run::RunOptions {
            config,
            interface,
            xdp_mode: xdp_mode.map(Into::into),
            reset,
        }),
        Command::Detach { config, interface } => detach::detach(&config, interface),
        Command::Decap { action } => match action {
            DecapCommand::Attach {
                interface,
                addresses,
                xdp_mode,
            } => decap::attach(&interface, addresses, xdp_mode.into()),
            DecapCommand::Detach { interface } => decap::detach(&interface),
        },
        Command::CheckConfig { config, file } => {
            check_config::check(&config.or(file).expect("clap requires one of them"))
        }
        Command::Import { format, file } => import::import(format.into(), &file),
        Command::Doctor { config, interface } => {
            block_on(doctor::doctor(config.as_deref(), interface))
        }
        Command::Status { api, json } => block_on(status::status(&api.target()?, json)),
        Command::Reload { api } => block_on(async {
            let answer =
                http::request_ok(&api.target()?, hyper::Method::POST, "/api/v1/reload", None)
                    .await?;
            println!("config reloaded");
            let warnings = serde_json::from_str::<serde_json::Value>(&answer)
                .ok()
                .and_then(|v| v.get("warnings").and_then(|w| w.as_array()).cloned())
                .unwrap_or_default();
            for w in warnings.iter().filter_map(|w| w.as_str()) {
                println!("warning: {w}");
            }
            Ok(ExitCode::SUCCESS)
        }),
        Command::Node { api, action } => {
            let action = match action {
                NodeCommand::Drain {
                    wait_quiet,
                    timeout,
                } => node::NodeAction::Drain {
                    wait: wait_quiet.map(std::time::Duration::from_secs),
                    timeout: std::time::Duration::from_secs(timeout),
                },
                NodeCommand::Undrain => node::NodeAction::Undrain,
                NodeCommand::Status => node::NodeAction::Status,
            };
            block_on(node::node(&api.target()?, action))
        }
        Command::Events { api, json, follow } => {
            block_on(events::events(&api.target()?, json, follow))
        }
        Command::Server { api, action } => {
            use server::ServerAction as A;
            let (server, action) = match action {
                ServerCommand::Drain(s) => (s, A::Drain),
                ServerCommand::Undrain(s) => (s, A::Undrain),
                ServerCommand::Down(s) => (s, A::Down),
                ServerCommand::Up(s) => (s, A::Up),
                ServerCommand::Set {
                    server,
                    weight,
                    spare,
                } => (server, A::Set { weight, spare }),
                ServerCommand::Add {
                    server,
                    weight,
                    spare,
                    backup,
                } => (
                    server,
                    A::Add {
                        weight,
                        spare: spare.unwrap_or(false),
                        backup,
                    },
                ),
                ServerCommand::Remove(s) => (s, A::Remove),
                ServerCommand::Reset(s) => (s, A::Reset),
            };
            block_on(server::server(
                &api.target()?,
                &server.service,
                &server.address,
                action,
            ))
        }
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
        .block_on(f)
}

#[cfg(test)]
mod tests {
    use super::DEFAULT_LOG_FILTER;

    #[test]
    fn the_default_log_filter_parses() {
        tracing_subscriber::EnvFilter::try_new(DEFAULT_LOG_FILTER)
            .expect("every directive of the default filter is valid");
    }
}
