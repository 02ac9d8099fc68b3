//! The real `lb-agent` binary in the lb namespace: its config (DESIGN.md §7) rendered
//! from a topology, start until `lb-agent ready`, reload with SIGHUP, stop.

use std::{
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::ExitStatus,
    time::Duration,
};

use crate::{
    net::topology::{Forwarding, HOST_IF, Host, Topology},
    util::{error::Error, process::NsProcess},
};

/// The line the agent prints once XDP is attached and every service is published.
pub const READY_LINE: &str = "lb-agent ready";
/// The line the agent prints after a successful SIGHUP reload.
pub const RELOADED_LINE: &str = "config reloaded";
/// The line the agent prints when a SIGHUP reload is refused.
pub const RELOAD_FAILED_LINE: &str = "reload failed";
/// Where the agent's REST API listens, inside the lb namespace.
pub const API_LISTEN: &str = "127.0.0.1:9900";
/// The bearer token the harness's agents accept for changes over TCP (written to
/// [`token_file`] with mode 0600; [`crate::agent::api::Api`] sends it).
pub const API_TOKEN: &str = "lb-tests-api-token-0123456789abcdef";
/// Default wait for `lb-agent ready`.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Default wait for a reload's answer.
pub const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// `tcp` or `udp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// The nat port range of the services [`Service::new`] builds (`snat_ports`).
pub const NAT_PORTS: std::ops::RangeInclusive<u16> = 20000..=29999;

/// One `[[service]]` of the config.
#[derive(Clone, Debug)]
pub struct Service {
    pub name: String,
    pub vip: SocketAddr,
    pub protocol: Proto,
    pub forwarding: Forwarding,
    /// nat: source address toward the backends.
    pub snat_ip: Option<IpAddr>,
    /// nat: source ports toward the backends, `"LOW-HIGH"`.
    pub snat_ports: Option<String>,
    /// `(address, weight)` per `[[service.server]]`.
    pub servers: Vec<(SocketAddr, u32)>,
    /// Extra `key = value` lines for the `[[service]]` table, written as given.
    pub extra: Vec<String>,
}

impl Service {
    /// A service on the topology's VIP (IPv4, or IPv6 with `v6`) and `vip_port`, whose
    /// servers are `backends` (`(host, weight)`) on `backend_port`. In nat the lb's own
    /// address is the SNAT address with ports 20000-29999; in dsr the ports must match.
    pub fn on(
        topo: &Topology,
        name: &str,
        protocol: Proto,
        v6: bool,
        vip_port: u16,
        backends: &[(&Host, u32)],
        backend_port: u16,
    ) -> Service {
        let vip = if v6 {
            IpAddr::V6(topo.vip6().expect("the topology has no IPv6"))
        } else {
            IpAddr::V4(topo.vip4())
        };
        let forwarding = topo.forwarding();
        let nat = forwarding == Forwarding::Nat;
        Service {
            name: name.to_owned(),
            vip: SocketAddr::new(vip, vip_port),
            protocol,
            forwarding,
            snat_ip: nat.then(|| topo.lb().addr(v6).expect("lb address")),
            snat_ports: nat.then(|| format!("{}-{}", NAT_PORTS.start(), NAT_PORTS.end())),
            servers: backends
                .iter()
                .map(|(h, w)| {
                    let addr = h.addr(v6).expect("backend address");
                    (SocketAddr::new(addr, backend_port), *w)
                })
                .collect(),
            extra: Vec::new(),
        }
    }

    /// The same service without the server at `addr`.
    pub fn without(&self, addr: SocketAddr) -> Service {
        let mut s = self.clone();
        s.servers.retain(|(a, _)| *a != addr);
        s
    }
}

/// The agent's config file.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub services: Vec<Service>,
    /// `agent.api_listen`; `""` disables the API. The harness's default,
    /// [`API_LISTEN`], is the lb namespace's own loopback, so tests never share it.
    pub api_listen: String,
    /// Extra `key = value` lines for the `[agent]` table.
    pub agent_extra: Vec<String>,
    /// `agent.pin_path`; `""` (the default) turns pinning off so that concurrent tests
    /// never share maps. Restart tests set a per-test bpffs directory.
    pub pin_path: String,
}

impl AgentConfig {
    pub fn new(services: Vec<Service>) -> Self {
        AgentConfig {
            services,
            api_listen: API_LISTEN.to_owned(),
            agent_extra: Vec::new(),
            pin_path: String::new(),
        }
    }

    /// The TOML text, without files of its own: no API socket and no state file (reads
    /// over `api_listen` only); see [`AgentConfig::render_in`].
    pub fn render(&self) -> String {
        self.render_with(None)
    }

    /// The TOML text of an agent whose files are in `dir` (the topology's directory, so
    /// concurrent agents never share them): [`socket_path`], [`token_file`],
    /// [`state_file`].
    pub fn render_in(&self, dir: &Path) -> String {
        self.render_with(Some(dir))
    }

    fn render_with(&self, dir: Option<&Path>) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "[agent]");
        let _ = writeln!(out, "interface = {:?}", HOST_IF);
        let _ = writeln!(out, "api_listen = {:?}", self.api_listen);
        let _ = writeln!(out, "pin_path = {:?}", self.pin_path);
        if let Some(dir) = dir {
            let _ = writeln!(
                out,
                "api_socket = {:?}",
                socket_path(dir).display().to_string()
            );
            let _ = writeln!(
                out,
                "api_token_file = {:?}",
                token_file(dir).display().to_string()
            );
            let _ = writeln!(
                out,
                "state_file = {:?}",
                state_file(dir).display().to_string()
            );
        } else {
            // No files of its own: never the host's defaults (another agent's socket, a
            // state file that a later test would restore).
            let _ = writeln!(out, "api_socket = \"\"");
            let _ = writeln!(out, "state_file = \"\"");
        }
        for line in &self.agent_extra {
            let _ = writeln!(out, "{line}");
        }
        for s in &self.services {
            let _ = writeln!(out, "\n[[service]]");
            let _ = writeln!(out, "name = {:?}", s.name);
            let _ = writeln!(out, "vip = \"{}\"", s.vip);
            let _ = writeln!(out, "protocol = {:?}", s.protocol.as_str());
            let _ = writeln!(out, "forwarding = {:?}", s.forwarding.as_str());
            if let Some(ip) = s.snat_ip {
                let _ = writeln!(out, "snat_ip = \"{ip}\"");
            }
            if let Some(ports) = &s.snat_ports {
                let _ = writeln!(out, "snat_ports = {ports:?}");
            }
            for line in &s.extra {
                let _ = writeln!(out, "{line}");
            }
            for (addr, weight) in &s.servers {
                let _ = writeln!(out, "\n[[service.server]]");
                let _ = writeln!(out, "address = \"{addr}\"");
                let _ = writeln!(out, "weight = {weight}");
            }
        }
        out
    }
}

/// A running `lb-agent run` in the topology's lb namespace; stopped on drop.
pub struct Agent {
    process: NsProcess,
    config_path: PathBuf,
    /// How it was started, for [`Agent::restart`].
    binary: PathBuf,
    flags: Vec<String>,
}

impl Agent {
    /// Writes `config` into the topology's directory and starts `binary run --config FILE
    /// --interface eth0 [--xdp-mode MODE]` in the lb namespace, then waits for
    /// [`READY_LINE`].
    pub fn start(
        topo: &Topology,
        binary: &Path,
        config: &AgentConfig,
        xdp_mode: Option<&str>,
        timeout: Duration,
    ) -> Result<Agent, Error> {
        let mut flags = vec!["--interface".to_owned(), HOST_IF.to_owned()];
        if let Some(mode) = xdp_mode {
            flags.extend(["--xdp-mode".to_owned(), mode.to_owned()]);
        }
        Self::launch(topo, binary, config, &flags, timeout)
    }

    /// Starts the agent exactly as an operator does: `ip netns exec <lb ns> lb-agent run
    /// --config FILE`, no other flag (the interface comes from the file, the XDP mode is
    /// the default `auto`); waits for [`READY_LINE`].
    pub fn start_as_operator(
        topo: &Topology,
        binary: &Path,
        config: &AgentConfig,
        timeout: Duration,
    ) -> Result<Agent, Error> {
        Self::launch(topo, binary, config, &[], timeout)
    }

    fn launch(
        topo: &Topology,
        binary: &Path,
        config: &AgentConfig,
        flags: &[String],
        timeout: Duration,
    ) -> Result<Agent, Error> {
        let config_path = topo.dir().join("lb.toml");
        write_config(&config_path, config)?;
        let process = Self::spawn(topo, binary, &config_path, flags, timeout)?;
        Ok(Agent {
            process,
            config_path,
            binary: binary.to_owned(),
            flags: flags.to_vec(),
        })
    }

    fn spawn(
        topo: &Topology,
        binary: &Path,
        config_path: &Path,
        flags: &[String],
        timeout: Duration,
    ) -> Result<NsProcess, Error> {
        let mut args = vec![
            "run".to_owned(),
            "--config".to_owned(),
            config_path.display().to_string(),
        ];
        args.extend(flags.iter().cloned());
        let process = topo.lb().spawn("lb-agent", binary, &args)?;
        process.wait_for_line(0, READY_LINE, timeout)?;
        Ok(process)
    }

    /// Ends the agent with `signal` (SIGTERM: a clean stop; SIGKILL: a crash) and starts
    /// it again as it was started (same config file and flags), waiting for
    /// [`READY_LINE`].
    pub fn restart(
        &mut self,
        topo: &Topology,
        signal: i32,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.process.end_with(signal, Duration::from_secs(10))?;
        self.process = Self::spawn(topo, &self.binary, &self.config_path, &self.flags, timeout)?;
        Ok(())
    }

    /// Sends SIGHUP without changing the config file and waits for the answer; returns
    /// the `config reloaded` line, or an error with the `reload failed` line.
    pub fn reload_unchanged(&self, timeout: Duration) -> Result<String, Error> {
        let since = self.process.cursor();
        self.process.signal(libc::SIGHUP)?;
        let (which, line) =
            self.process
                .wait_for_any(since, &[RELOADED_LINE, RELOAD_FAILED_LINE], timeout)?;
        if which == 1 {
            return Err(Error::Unexpected(format!(
                "the agent refused the reload: {line}"
            )));
        }
        Ok(line)
    }

    /// Rewrites the config, sends SIGHUP and waits for the agent's answer; returns the
    /// `config reloaded` line, or an error with the `reload failed` line.
    pub fn reload(&self, config: &AgentConfig, timeout: Duration) -> Result<String, Error> {
        write_config(&self.config_path, config)?;
        self.reload_unchanged(timeout)
    }

    /// The agent process (log, signals).
    pub fn process(&self) -> &NsProcess {
        &self.process
    }

    /// The config file the agent reads.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// SIGTERM and wait (SIGKILL after `grace`); a clean agent exits 0.
    pub fn stop(self, grace: Duration) -> Result<ExitStatus, Error> {
        self.process.stop(grace)
    }
}

/// The agent's API socket in `dir` (`lb-agent … --socket`).
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("api.sock")
}

/// The agent's bearer token file in `dir` (holds [`API_TOKEN`]).
pub fn token_file(dir: &Path) -> PathBuf {
    dir.join("api.token")
}

/// The agent's runtime admin state file in `dir` (survives a restart in the same dir).
pub fn state_file(dir: &Path) -> PathBuf {
    dir.join("admin-state.json")
}

fn write_config(path: &Path, config: &AgentConfig) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let token = token_file(dir);
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&token)
        .and_then(|mut f| std::io::Write::write_all(&mut f, API_TOKEN.as_bytes()))
        .map_err(Error::io(format!(
            "writing the agent config {}",
            token.display()
        )))?;
    // Write then rename, so a reload never reads half a file.
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, config.render_in(dir))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(Error::io(format!(
            "writing the agent config {}",
            path.display()
        )))
}

/// Finds a binary of the workspace: `$LB_<NAME>_BIN` (e.g. `LB_AGENT_BIN`) if set, else
/// next to the running executable (a binary in `target/<profile>/`) or one directory up
/// (a test in `target/<profile>/deps/`).
pub fn locate_binary(name: &str) -> Result<PathBuf, Error> {
    let env = format!(
        "LB_{}_BIN",
        name.trim_start_matches("lb-")
            .to_uppercase()
            .replace('-', "_")
    );
    if let Some(path) = std::env::var_os(&env) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(not_found(name, &path.display().to_string(), &env));
    }
    let mut tried = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        let mut dir = exe.parent().map(Path::to_owned);
        if dir.as_ref().is_some_and(|d| d.ends_with("deps")) {
            dir = dir.and_then(|d| d.parent().map(Path::to_owned));
        }
        if let Some(dir) = dir {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
            tried.push(candidate.display().to_string());
        }
    }
    Err(not_found(name, &tried.join(", "), &env))
}

fn not_found(name: &str, tried: &str, env: &str) -> Error {
    Error::Unexpected(format!(
        "the {name} binary is not at {tried}; build it first (`cargo build -p lb-agent`, \
         which `cargo xtask test` does) or set {env}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_renders_services_and_servers() {
        let cfg = AgentConfig::new(vec![Service {
            name: "web".into(),
            vip: "10.77.1.200:80".parse().unwrap(),
            protocol: Proto::Tcp,
            forwarding: Forwarding::Nat,
            snat_ip: Some("10.77.1.2".parse().unwrap()),
            snat_ports: Some("20000-29999".into()),
            servers: vec![
                ("10.77.1.11:8080".parse().unwrap(), 1),
                ("10.77.1.12:8080".parse().unwrap(), 2),
            ],
            extra: vec!["max_fails = 0".into()],
        }]);
        let text = cfg.render();
        for want in [
            "interface = \"eth0\"",
            "pin_path = \"\"",
            "vip = \"10.77.1.200:80\"",
            "forwarding = \"nat\"",
            "snat_ip = \"10.77.1.2\"",
            "snat_ports = \"20000-29999\"",
            "max_fails = 0",
            "address = \"10.77.1.12:8080\"\nweight = 2",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        let fewer = cfg.services[0].without("10.77.1.11:8080".parse().unwrap());
        assert_eq!(fewer.servers.len(), 1);
    }

    #[test]
    fn ipv6_addresses_render_bracketed() {
        let cfg = AgentConfig::new(vec![Service {
            name: "v6".into(),
            vip: "[fd77::c8]:80".parse().unwrap(),
            protocol: Proto::Udp,
            forwarding: Forwarding::Dsr,
            snat_ip: None,
            snat_ports: None,
            servers: vec![("[fd77::b]:80".parse().unwrap(), 1)],
            extra: vec![],
        }]);
        let text = cfg.render();
        assert!(text.contains("vip = \"[fd77::c8]:80\""), "{text}");
        assert!(!text.contains("snat_ip"), "{text}");
    }
}
