//! The TOML configuration (DESIGN.md §5–§7): typed model, loading, validation and the
//! `check-config` helpers ([`detection_bounds`], [`warnings`], [`render`]).
//!
//! Every error is a [`ConfigError`] naming the file, the 1-based line, the key path and
//! what is allowed, e.g. `lb.toml:12: service[0].server[1].weight: must be at least 1 (got 0)`.
//! Loading stops at the first error in file order.
//!
//! The keys, their defaults and their rules are documented in docs/configuration.md, the
//! reference held to the parser's key lists ([`accepted_keys`]) by
//! `lb-agent/tests/docs/config_keys_documented.rs`.

mod bounds;
mod cluster;
mod error;
mod failures;
mod fields;
mod passive;
mod probe;
mod report;
mod schema;
mod secret;
mod server_rules;
mod spanned;
mod values;
mod warnings;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use bounds::{Bounds, detection_bounds};
pub use cluster::{ClusterConfig, ClusterPeer, DEFAULT_RESYNC_TIMEOUT, MAX_MEMBERS};
pub use error::ConfigError;
pub use fields::accepted_keys;
pub use passive::{PassiveCoverage, passive_coverage, passive_gap};
pub use report::{HostFacts, render};
pub use secret::Secret;
pub use server_rules::{
    AgentKeyChanges, ServerRuleError, check_backup, check_server, check_server_address,
    check_weight, non_loopback_api, restart_only_changes,
};
pub use values::human;
pub use warnings::warnings;

/// Default `agent.api_listen`.
pub const DEFAULT_API_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 9900));
/// Default `agent.api_socket`.
pub const DEFAULT_API_SOCKET: &str = "/run/lb-agent/lb-agent.sock";
/// Default `agent.state_file`.
pub const DEFAULT_STATE_FILE: &str = "/var/lib/lb-agent/admin-state.json";
/// Largest `server.backup` level (an SRV priority is at most this too).
pub const MAX_BACKUP_LEVEL: u32 = 65_535;
/// Default `agent.pin_path`.
pub const DEFAULT_PIN_PATH: &str = "/sys/fs/bpf/lb";
/// Port used for `agent.resolver` when it names only an address.
pub const DEFAULT_RESOLVER_PORT: u16 = 53;
/// Default `service.snat_ports`.
///
/// Every port below the kernel's default ephemeral range (32768–60999): a backend that
/// closes first holds each pair in TIME_WAIT for a minute, so the range is what bounds
/// new connections per second per backend per SNAT address (docs/nat-ports.md).
pub const DEFAULT_SNAT_PORTS: RangeInclusive<u16> = 1024..=32767;
/// Default `service.source_rate` (see docs/nat-ports.md for the reasoning).
pub const DEFAULT_SOURCE_RATE: u32 = 1000;
/// Default `service.source_burst`.
pub const DEFAULT_SOURCE_BURST: u32 = 2000;
/// Most `snat_ips` a service can have (the data plane's `MAX_SNAT_ADDRS`).
pub const MAX_SNAT_ADDRS: usize = lb_common::maps::MAX_SNAT_ADDRS;
/// Default `agent.max_backends`: the size the XDP object is compiled with.
pub const DEFAULT_MAX_BACKENDS: u32 = lb_common::MAX_BACKENDS - 1;
/// `agent.announce_lifetime` when not set: long enough that a restart (seconds) never
/// lets an address expire, short enough that a dead node stops attracting traffic
/// within a minute.
pub const DEFAULT_ANNOUNCE_LIFETIME: Duration = Duration::from_secs(60);
/// How often the running agent restarts the announced addresses' lifetime: a third of
/// it (to the millisecond), so two refreshes can be missed (a stalled or restarting
/// agent) before an address expires.
pub fn announce_refresh_every(lifetime: Duration) -> Duration {
    Duration::from_millis((lifetime.as_millis() / 3) as u64)
}

/// The range `agent.announce_lifetime` accepts: the kernel counts lifetimes in whole
/// seconds, and the agent refreshes every third of it.
pub const ANNOUNCE_LIFETIMES: RangeInclusive<Duration> =
    Duration::from_secs(3)..=Duration::from_secs(86_400);
/// Largest `agent.max_backends`.
pub const MAX_MAX_BACKENDS: u32 = lb_common::BACKEND_ENTRIES_LIMIT - 1;
/// Smallest and largest `agent.max_flows`.
pub use crate::dataplane::sizing::{MAX_MAX_FLOWS, MIN_MAX_FLOWS};
/// `agent.max_flows`, or its default on this host (0.25 % of its memory for the three
/// tables, at least 262,144 flows; `dataplane::sizing::default_max_flows`).
pub fn max_flows(agent: &AgentConfig) -> u32 {
    agent.max_flows.unwrap_or_else(|| {
        crate::dataplane::sizing::default_max_flows(
            crate::dataplane::sizing::host_memory().unwrap_or(0),
        )
    })
}

/// Default `service.max_fails`.
pub const DEFAULT_MAX_FAILS: u32 = 3;
/// Default `service.fail_timeout`.
pub const DEFAULT_FAIL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest `server.weight`: a 65537-slot Maglev table cannot express finer ratios.
pub const MAX_WEIGHT: u32 = 10_000;
/// Default probe `interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Default probe `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default probe `max_body` and `max_response` (256k).
pub const DEFAULT_MAX_READ: usize = 256 * 1024;

/// The whole file.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub agent: AgentConfig,
    /// In file order.
    pub services: Vec<ServiceConfig>,
    /// `[cluster]`; `None`: this node shares no state.
    pub cluster: Option<ClusterConfig>,
}

/// `[agent]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// NIC to attach to; the CLI's `--interface` overrides it.
    pub interface: Option<String>,
    /// DNS server for names; `None` means the system's (`/etc/resolv.conf`).
    pub resolver: Option<SocketAddr>,
    pub xdp_mode: XdpMode,
    /// REST API and `/metrics`; `None` when disabled with `""`.
    pub api_listen: Option<SocketAddr>,
    /// bpffs directory for pinned maps; `None` when disabled with `""`.
    pub pin_path: Option<PathBuf>,
    /// Unix-socket API (all requests); `None` when disabled with `""`.
    pub api_socket: Option<PathBuf>,
    /// Group that may use the socket (mode 0660); `None`: root only (0600).
    pub api_socket_group: Option<String>,
    /// Bearer token file for changes over `api_listen`; `None`: TCP serves reads only.
    pub api_token_file: Option<PathBuf>,
    /// Where runtime admin state is kept across restarts; `None` when disabled with `""`.
    pub state_file: Option<PathBuf>,
    /// Interface holding the announced VIPs as host addresses (docs/multi-node.md);
    /// `None`: announcing off.
    pub announce_interface: Option<String>,
    /// Lifetime of the announced VIP addresses, restarted by the running agent every
    /// third of it; an agent that stays dead is withdrawn when it ends; `None`: never
    /// (`"forever"`).
    pub announce_lifetime: Option<Duration>,
    /// BIRD's control socket, read for BGP session status; `None`: not read.
    pub bird_socket: Option<PathBuf>,
    /// Backends the data plane holds over all services (the backend maps' size, set
    /// at load; docs/capacity.md).
    pub max_backends: u32,
    /// Live flows the flow table holds (the nat and source tables are sized from it,
    /// docs/capacity.md); `None`: derived from the host's memory at start.
    pub max_flows: Option<u32>,
    /// How the log is written (restart to change).
    pub log_format: LogFormat,
    /// Outer source address of tunnel services' packets for its family; `None` (and
    /// the other family): the interface's first address of that family.
    pub tunnel_source: Option<IpAddr>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            interface: None,
            resolver: None,
            xdp_mode: XdpMode::Auto,
            api_listen: Some(DEFAULT_API_LISTEN),
            pin_path: Some(PathBuf::from(DEFAULT_PIN_PATH)),
            api_socket: Some(PathBuf::from(DEFAULT_API_SOCKET)),
            api_socket_group: None,
            api_token_file: None,
            state_file: Some(PathBuf::from(DEFAULT_STATE_FILE)),
            announce_interface: None,
            announce_lifetime: Some(DEFAULT_ANNOUNCE_LIFETIME),
            bird_socket: None,
            max_backends: DEFAULT_MAX_BACKENDS,
            tunnel_source: None,
            max_flows: None,
            log_format: LogFormat::Text,
        }
    }
}

/// `agent.log_format`: how `lb-agent run` writes its log to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LogFormat {
    /// One human line per event (colour only when stderr is a terminal).
    #[default]
    Text,
    /// One JSON object per event (for log shippers).
    Json,
}

/// `agent.xdp_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum XdpMode {
    /// Native when the driver supports it, else generic.
    #[default]
    Auto,
    Native,
    Generic,
}

/// `service.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl Protocol {
    /// The IP protocol number (`lb_common::IPPROTO_*`).
    pub fn ip_proto(self) -> u8 {
        match self {
            Protocol::Tcp => lb_common::IPPROTO_TCP,
            Protocol::Udp => lb_common::IPPROTO_UDP,
        }
    }
}

/// `service.forwarding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Forwarding {
    /// Full NAT through `snat_ip`; backends anywhere routable.
    #[default]
    Nat,
    /// L2 direct server return; backends on the segment hold the VIP.
    Dsr,
    /// IP-in-IP tunnel to the backend's address (anywhere routable); backends
    /// decapsulate, hold the VIP and answer clients directly (docs/tunnel.md).
    Ipip,
    /// As [`Forwarding::Ipip`] inside UDP to port 6080 (GUE), spread by ECMP on the
    /// outer source port.
    Gue,
}

impl Forwarding {
    /// Whether the packet keeps its destination address and port (dsr and the tunnels:
    /// every server port must be the VIP's, the backend holds the VIP).
    pub fn keeps_destination(self) -> bool {
        self != Forwarding::Nat
    }

    /// Whether packets travel encapsulated (`ipip`, `gue`).
    pub fn is_tunnel(self) -> bool {
        matches!(self, Forwarding::Ipip | Forwarding::Gue)
    }
}

/// `service.backup_switch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackupSwitch {
    /// Every new flow tries the primary group first (no `backup_switch`, or `permanent = false`).
    #[default]
    TryPrimaryEachFlow,
    /// `permanent = "2m"`: once on a backup level, try the primaries at most this often.
    RetryAfter(Duration),
    /// `permanent = true`: stay on the active backup level until it fails.
    Permanent,
}

/// One `[[service]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    pub name: String,
    pub vip: SocketAddr,
    pub protocol: Protocol,
    pub forwarding: Forwarding,
    /// Source addresses toward backends (1..=`MAX_SNAT_ADDRS`); empty exactly when
    /// `forwarding` is `Dsr`.
    pub snat_ips: Vec<IpAddr>,
    /// NAT source ports (ignored, left at the default, for `Dsr`).
    pub snat_ports: RangeInclusive<u16>,
    /// nat: new flows per second one client address may open on average; 0 = no limit.
    pub source_rate: u32,
    /// nat: new flows one client address may open at once.
    pub source_burst: u32,
    /// Slots of the service's Maglev table (one of `lb_common::MAGLEV_SIZES`); `None`:
    /// chosen by its backend count.
    pub maglev_size: Option<u32>,
    /// Passive failures within `fail_timeout` that make a server unavailable; 0 = off.
    pub max_fails: u32,
    /// `max_fails` is in the file (not the default): warnings about it are about what
    /// the operator wrote.
    pub max_fails_written: bool,
    pub fail_timeout: Duration,
    pub max_unhealthy_percent: u8,
    pub fail_open: bool,
    pub backup_switch: BackupSwitch,
    /// In file order; never empty.
    pub servers: Vec<ServerConfig>,
    /// In file order; names unique.
    pub probes: Vec<ProbeConfig>,
}

/// One `[[service.server]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// A socket address always has a port (the VIP's when omitted); a name has one unless
    /// it is an SRV name (`service` set).
    pub address: ServerAddress,
    /// 1..=[`MAX_WEIGHT`].
    pub weight: u32,
    pub spare: bool,
    pub backup: BackupLevel,
    pub resolve: bool,
    /// Full SRV service prefix, e.g. `"_http._tcp"`.
    pub service: Option<String>,
}

impl ServerConfig {
    /// A primary server with every default (`weight` 1, not spare, not resolved).
    pub fn new(address: ServerAddress) -> Self {
        ServerConfig {
            address,
            weight: 1,
            spare: false,
            backup: BackupLevel::Level(0),
            resolve: false,
            service: None,
        }
    }
}

/// `server.address`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServerAddress {
    Socket(SocketAddr),
    Name { host: String, port: Option<u16> },
}

impl ServerAddress {
    pub fn port(&self) -> Option<u16> {
        match self {
            ServerAddress::Socket(sa) => Some(sa.port()),
            ServerAddress::Name { port, .. } => *port,
        }
    }
}

impl fmt::Display for ServerAddress {
    /// `10.0.1.11:8080`, `[::1]:80`, `host:80` or `host`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerAddress::Socket(sa) => write!(f, "{sa}"),
            ServerAddress::Name {
                host,
                port: Some(p),
            } => write!(f, "{host}:{p}"),
            ServerAddress::Name { host, port: None } => write!(f, "{host}"),
        }
    }
}

/// `server.backup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackupLevel {
    /// 0 is the primary group, 1.. backup levels (with SRV: the base level, see module doc).
    Level(u32),
    /// `"prio"`: the SRV priority is the level.
    Prio,
}

impl Default for BackupLevel {
    fn default() -> Self {
        BackupLevel::Level(0)
    }
}

/// Probe `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    Http,
    Tcp,
    Udp,
    Icmp,
}

/// Probe `mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ProbeMode {
    #[default]
    Always,
    /// Only while the server had no client traffic for `interval`, or is unhealthy.
    Idle,
    /// Only while the server is unhealthy.
    Onfail,
}

/// `tcp_check`: how a tcp probe without `send`/`expect`/`test` checks the port
/// (docs/probes.md, "SYN check").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TcpCheck {
    /// The SYN check where the process can open a raw socket, else connect.
    #[default]
    Auto,
    /// Always the SYN check (a local fault, no verdict, where it cannot run).
    Syn,
    /// Always a full connect.
    Connect,
}

/// One `[[service.probe]]`. The `http` part keeps its defaults for other kinds; `send`,
/// `expect` are `None` except for tcp/udp.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub name: String,
    pub kind: ProbeKind,
    /// `None`: the server's port.
    pub port: Option<u16>,
    pub interval: Duration,
    pub timeout: Duration,
    pub fails: u32,
    pub passes: u32,
    pub essential: bool,
    pub persistent: bool,
    pub mode: ProbeMode,
    pub http: HttpProbe,
    pub send: Option<Vec<u8>>,
    pub expect: Option<regex::Regex>,
    /// 0 = read no reply (tcp: the connect decides; udp: a port unreachable within the
    /// timeout fails, anything else passes).
    pub max_response: usize,
    pub jitter: Duration,
    /// `test`: the condition a response must meet (http, tcp, udp); it replaces
    /// `expect_status`/`expect_body`/`expect`, which cannot be set with it.
    pub test: Option<crate::probe::condition::Condition>,
    /// tcp only.
    pub tcp_check: TcpCheck,
    /// icmp of an `ipip` / `gue` service: the echo request travels through the tunnel
    /// to the VIP (docs/tunnel.md, "Health"); set by the loader, not a key.
    pub tunnel: Option<TunnelProbe>,
}

/// Where an icmp probe of a tunnel service sends its echo request: encapsulated toward
/// the server, addressed to the service's VIP, so that a server whose decapsulation is
/// broken fails it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelProbe {
    pub vip: IpAddr,
    /// GUE (UDP to port 6080) rather than IP-in-IP.
    pub gue: bool,
}

impl ProbeConfig {
    /// A probe with every default of DESIGN.md §5.
    pub fn new(name: impl Into<String>, kind: ProbeKind) -> Self {
        ProbeConfig {
            name: name.into(),
            kind,
            port: None,
            interval: DEFAULT_INTERVAL,
            timeout: DEFAULT_TIMEOUT,
            fails: 1,
            passes: 1,
            essential: false,
            persistent: false,
            mode: ProbeMode::Always,
            http: HttpProbe::default(),
            send: None,
            expect: None,
            max_response: DEFAULT_MAX_READ,
            jitter: Duration::ZERO,
            test: None,
            tcp_check: TcpCheck::Auto,
            tunnel: None,
        }
    }
}

/// Regexes compare by their source text.
fn same_regex(a: &Option<regex::Regex>, b: &Option<regex::Regex>) -> bool {
    a.as_ref().map(regex::Regex::as_str) == b.as_ref().map(regex::Regex::as_str)
}

impl PartialEq for ProbeConfig {
    fn eq(&self, o: &Self) -> bool {
        // Destructured so that a new field is a compile error here.
        let ProbeConfig {
            name,
            kind,
            port,
            interval,
            timeout,
            fails,
            passes,
            essential,
            persistent,
            mode,
            http,
            send,
            expect,
            max_response,
            jitter,
            test,
            tcp_check,
            tunnel,
        } = self;
        *name == o.name
            && *kind == o.kind
            && *port == o.port
            && *interval == o.interval
            && *timeout == o.timeout
            && *fails == o.fails
            && *passes == o.passes
            && *essential == o.essential
            && *persistent == o.persistent
            && *mode == o.mode
            && *http == o.http
            && *send == o.send
            && same_regex(expect, &o.expect)
            && *max_response == o.max_response
            && *jitter == o.jitter
            && *test == o.test
            && *tcp_check == o.tcp_check
            && *tunnel == o.tunnel
    }
}

/// The http part of a probe.
#[derive(Debug, Clone)]
pub struct HttpProbe {
    pub uri: String,
    pub method: String,
    /// In file order.
    pub headers: Vec<(String, String)>,
    /// Headers whose value comes from a file or an environment variable, in file order.
    pub secret_headers: Vec<(String, Secret)>,
    /// The request body (`Content-Length` set); `None`: no body.
    pub body: Option<Vec<u8>>,
    /// `Host:` header; `None`: the server address.
    pub host: Option<String>,
    pub tls: bool,
    /// `None`: the server's name, or its address.
    pub sni: Option<String>,
    pub verify: bool,
    /// A response passes when its status is in any of these.
    pub expect_status: Vec<RangeInclusive<u16>>,
    pub expect_body: Option<regex::Regex>,
    pub max_body: usize,
}

impl Default for HttpProbe {
    fn default() -> Self {
        HttpProbe {
            uri: "/".into(),
            method: "GET".into(),
            headers: Vec::new(),
            secret_headers: Vec::new(),
            body: None,
            host: None,
            tls: false,
            sni: None,
            verify: true,
            // One range of accepted statuses (not the statuses 200 to 299 as a list).
            #[allow(clippy::single_range_in_vec_init)]
            expect_status: vec![200..=299],
            expect_body: None,
            max_body: DEFAULT_MAX_READ,
        }
    }
}

impl PartialEq for HttpProbe {
    fn eq(&self, o: &Self) -> bool {
        let HttpProbe {
            uri,
            method,
            headers,
            secret_headers,
            body,
            host,
            tls,
            sni,
            verify,
            expect_status,
            expect_body,
            max_body,
        } = self;
        *uri == o.uri
            && *method == o.method
            && *headers == o.headers
            && *secret_headers == o.secret_headers
            && *body == o.body
            && *host == o.host
            && *tls == o.tls
            && *sni == o.sni
            && *verify == o.verify
            && *expect_status == o.expect_status
            && same_regex(expect_body, &o.expect_body)
            && *max_body == o.max_body
    }
}

macro_rules! names {
    ($ty:ty { $($v:ident => $s:literal),* $(,)? }) => {
        impl $ty {
            /// The name used in the config file and the API.
            pub fn as_str(self) -> &'static str {
                match self { $(<$ty>::$v => $s),* }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
names!(XdpMode { Auto => "auto", Native => "native", Generic => "generic" });
names!(Protocol { Tcp => "tcp", Udp => "udp" });
names!(Forwarding { Nat => "nat", Dsr => "dsr", Ipip => "ipip", Gue => "gue" });
names!(ProbeKind { Http => "http", Tcp => "tcp", Udp => "udp", Icmp => "icmp" });
names!(ProbeMode { Always => "always", Idle => "idle", Onfail => "onfail" });

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_path_buf(),
        line: None,
        key: None,
        message: format!("cannot read: {e}"),
        io_kind: Some(e.kind()),
    })?;
    parse(&text, path)
}

/// Validates config text; `path` is only used in errors.
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    schema::parse(text, path)
}
