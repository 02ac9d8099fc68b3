//! Rules a server must meet wherever it comes from — the config file or `POST`/`PATCH`
//! through the API — and the `[agent]` facts the running agent reports about (keys a
//! reload cannot apply, a non-loopback API address).

use std::net::{IpAddr, SocketAddr};

use super::{AgentConfig, Forwarding, MAX_BACKUP_LEVEL, MAX_WEIGHT, ServiceConfig};

/// Why a server is refused; the text says what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ServerRuleError(pub String);

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// A server address of `svc`: the VIP's family, a port (1..65535), a unicast address
/// that is not the VIP's own, and with dsr the VIP's port.
pub fn check_server_address(
    vip: SocketAddr,
    forwarding: Forwarding,
    addr: SocketAddr,
) -> Result<(), ServerRuleError> {
    let err = |m: String| Err(ServerRuleError(m));
    if addr.is_ipv4() != vip.is_ipv4() {
        return err(format!(
            "an {} server in a service whose VIP is {} ({vip}); mixed families are not supported",
            family(addr.ip()),
            family(vip.ip()),
        ));
    }
    if addr.port() == 0 {
        return err(format!(
            "{addr}: port 0 is not allowed (ports are 1..65535)"
        ));
    }
    let ip = addr.ip();
    let broadcast = matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if ip.is_unspecified() || ip.is_multicast() || broadcast {
        return err(format!(
            "{ip} is not a unicast address: a server needs the address of one host"
        ));
    }
    if ip == vip.ip() {
        return err(format!(
            "{ip} is the VIP itself: packets to it would come back to the balancer"
        ));
    }
    if forwarding.keeps_destination() && addr.port() != vip.port() {
        return err(format!(
            "forwarding = \"{forwarding}\" keeps the destination port: the server port must be the VIP's ({}), got {}",
            vip.port(),
            addr.port()
        ));
    }
    Ok(())
}

/// `weight`: 1..=[`MAX_WEIGHT`], said as the config loader says it ("must be at least 1",
/// "must be at most 10000").
pub fn check_weight(weight: u32) -> Result<(), ServerRuleError> {
    if weight < 1 {
        return Err(ServerRuleError(format!(
            "weight must be at least 1 (got {weight})"
        )));
    }
    if weight > MAX_WEIGHT {
        return Err(ServerRuleError(format!(
            "weight must be at most {MAX_WEIGHT} (got {weight})"
        )));
    }
    Ok(())
}

/// `backup`: 0..=[`MAX_BACKUP_LEVEL`]; a spare only in the primary group.
pub fn check_backup(backup: u32, spare: bool) -> Result<(), ServerRuleError> {
    if backup > MAX_BACKUP_LEVEL {
        return Err(ServerRuleError(format!(
            "backup level must be 0..={MAX_BACKUP_LEVEL} (got {backup})"
        )));
    }
    if spare && backup != 0 {
        return Err(ServerRuleError(
            "spare servers belong to the primary group (backup = 0); a backup level is a group of its own"
                .into(),
        ));
    }
    Ok(())
}

/// All rules for a server of `svc` given by address (what the API adds).
pub fn check_server(
    svc: &ServiceConfig,
    addr: SocketAddr,
    weight: u32,
    spare: bool,
    backup: u32,
) -> Result<(), ServerRuleError> {
    check_server_address(svc.vip, svc.forwarding, addr)?;
    check_weight(weight)?;
    check_backup(backup, spare)
}

/// `[agent]` keys whose new value a reload cannot apply (they take effect at restart).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentKeyChanges(pub Vec<&'static str>);

impl AgentKeyChanges {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for AgentKeyChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[agent] {} changed: restart to apply (the running values stay)",
            self.0.join(", ")
        )
    }
}

/// The `[agent]` keys that differ between the running and the reloaded config. Every
/// `[agent]` key is restart-only except `resolver` (used at each resolution).
pub fn restart_only_changes(running: &AgentConfig, new: &AgentConfig) -> AgentKeyChanges {
    // Destructured so that a new key is a compile error here.
    let AgentConfig {
        interface,
        resolver: _,
        xdp_mode,
        api_listen,
        pin_path,
        api_socket,
        api_socket_group,
        api_token_file,
        state_file,
        announce_interface,
        announce_lifetime,
        bird_socket,
        max_backends,
        max_flows,
        log_format,
        tunnel_source,
    } = running;
    let mut keys = Vec::new();
    let mut diff = |changed: bool, key| {
        if changed {
            keys.push(key);
        }
    };
    diff(*interface != new.interface, "interface");
    diff(*xdp_mode != new.xdp_mode, "xdp_mode");
    diff(*api_listen != new.api_listen, "api_listen");
    diff(*pin_path != new.pin_path, "pin_path");
    diff(*api_socket != new.api_socket, "api_socket");
    diff(
        *api_socket_group != new.api_socket_group,
        "api_socket_group",
    );
    diff(*api_token_file != new.api_token_file, "api_token_file");
    diff(*state_file != new.state_file, "state_file");
    diff(
        *announce_interface != new.announce_interface,
        "announce_interface",
    );
    diff(
        *announce_lifetime != new.announce_lifetime,
        "announce_lifetime",
    );
    diff(*bird_socket != new.bird_socket, "bird_socket");
    diff(*max_backends != new.max_backends, "max_backends");
    diff(*max_flows != new.max_flows, "max_flows");
    diff(*log_format != new.log_format, "log_format");
    diff(*tunnel_source != new.tunnel_source, "tunnel_source");
    AgentKeyChanges(keys)
}

/// The warning for an `api_listen` other hosts can reach, `None` on loopback.
pub fn non_loopback_api(agent: &AgentConfig) -> Option<String> {
    let listen = agent.api_listen?;
    if listen.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "api_listen = \"{listen}\" is not a loopback address: every host that reaches it can read \
         status and metrics{}",
        if agent.api_token_file.is_some() {
            ", and anyone holding the token can change servers"
        } else {
            " (changes over TCP stay refused without api_token_file)"
        }
    ))
}
