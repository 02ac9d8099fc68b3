//! From a parsed TOML document to a validated [`Config`]: keys, types, defaults and the
//! rules between them (see the module doc of [`super`] for the list); probes are in `probe.rs`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::fields::{
    AGENT_KEYS, BACKUP_SWITCH_KEYS, R, SERVER_KEYS, SERVICE_KEYS, TOP_KEYS, duration, misplaced,
    opt, positive_duration,
};
use super::spanned::{Field, Source, Table};
use super::values;
use super::*;

const XDP_MODES: &[(&str, XdpMode)] = &[
    ("auto", XdpMode::Auto),
    ("native", XdpMode::Native),
    ("generic", XdpMode::Generic),
];
const LOG_FORMATS: &[(&str, LogFormat)] = &[("text", LogFormat::Text), ("json", LogFormat::Json)];
const PROTOCOLS: &[(&str, Protocol)] = &[("tcp", Protocol::Tcp), ("udp", Protocol::Udp)];
const FORWARDINGS: &[(&str, Forwarding)] = &[
    ("nat", Forwarding::Nat),
    ("dsr", Forwarding::Dsr),
    ("ipip", Forwarding::Ipip),
    ("gue", Forwarding::Gue),
];

pub(super) fn parse(text: &str, path: &Path) -> R<Config> {
    let src = Source::new(path, text);
    let doc = toml_edit::Document::parse(text).map_err(|e| {
        let msg = e.message().trim_end().replace('\n', "; ");
        let line = src.line_of(e.span());
        let hint = line
            .and_then(|l| text.lines().nth(l - 1))
            .and_then(bare_alternatives)
            .map(|h| format!(" ({h})"))
            .unwrap_or_default();
        src.error(line, None, format!("invalid TOML: {msg}{hint}"))
    })?;
    config(Table::root(&src, doc.as_table()))
}

/// A hint for a line such as `expect_status = 200|204`: a value with `|` written without
/// quotes, which TOML refuses.
fn bare_alternatives(line: &str) -> Option<String> {
    let (key, value) = line.split_once('=')?;
    let (key, value) = (key.trim(), value.split('#').next()?.trim());
    if value.starts_with(['"', '\'', '[', '{']) || !value.contains('|') {
        return None;
    }
    let parts: Vec<&str> = value.split('|').map(str::trim).collect();
    Some(match key {
        "expect_status" => format!(
            "a list of statuses is an array: expect_status = [{}]",
            parts.join(", ")
        ),
        "test" => format!(
            "quote the condition, and inside it a value with `|`: test = '{}'",
            match value.rsplit_once(['~', '=']) {
                Some((head, alts)) if !alts.contains(['&', '$']) => format!(
                    "{} {} \"^({})$\"",
                    head.trim_end(),
                    &value[head.len()..head.len() + 1],
                    alts.trim()
                ),
                _ => value.to_string(),
            }
        ),
        _ => format!("quote the value: {key} = \"{value}\""),
    })
}

fn config(root: Table<'_>) -> R<Config> {
    root.check_keys(TOP_KEYS)?;
    let agent = match root.get("agent") {
        Some(f) => agent(&f.table()?)?,
        None => AgentConfig::default(),
    };
    let mut services: Vec<ServiceConfig> = Vec::new();
    if let Some(f) = root.get("service") {
        let tables = f.tables()?;
        if tables.len() > lb_common::MAX_SERVICES as usize {
            return Err(f.err(format!(
                "at most {} services are supported (got {})",
                lb_common::MAX_SERVICES,
                tables.len()
            )));
        }
        let mut servers = 0usize;
        for t in &tables {
            let svc = service(t)?;
            servers += svc.servers.len();
            if servers > agent.max_backends as usize {
                let f = t.get("server").expect("server was required");
                return Err(f.err(format!(
                    "{servers} servers up to this service; the data plane holds {} \
                     (agent.max_backends)",
                    agent.max_backends
                )));
            }
            if let Some((i, _)) = services
                .iter()
                .enumerate()
                .find(|(_, s)| s.name == svc.name)
            {
                let f = t.get("name").expect("name was required");
                return Err(f.err(format!(
                    "duplicate service name {:?} (also service[{i}])",
                    svc.name
                )));
            }
            if let Some((i, _)) = services
                .iter()
                .enumerate()
                .find(|(_, s)| s.vip == svc.vip && s.protocol == svc.protocol)
            {
                let f = t.get("vip").expect("vip was required");
                return Err(f.err(format!(
                    "{} {} is already the VIP of service[{i}] ({:?}); each (vip, protocol) belongs to one service",
                    svc.vip, svc.protocol, services[i].name
                )));
            }
            services.push(svc);
        }
    }
    let cluster = match root.get("cluster") {
        Some(f) => Some(super::cluster::cluster(&f.table()?, &services)?),
        None => None,
    };
    Ok(Config {
        agent,
        services,
        cluster,
    })
}

fn agent(t: &Table<'_>) -> R<AgentConfig> {
    t.check_keys(AGENT_KEYS)?;
    let d = AgentConfig::default();
    let interface = opt(t, "interface", |f| {
        let s = f.str()?;
        if s.is_empty()
            || s.len() > 15
            || s.contains(|c: char| c == '/' || c.is_whitespace() || c.is_control())
        {
            return Err(f.err(format!(
                "{s:?} is not an interface name (1..15 bytes, no '/' or whitespace); leave the key out to use --interface"
            )));
        }
        Ok(s.to_string())
    })?;
    let resolver = opt(t, "resolver", |f| {
        f.parse(|s| {
            let sa = s
                .parse::<SocketAddr>()
                .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, DEFAULT_RESOLVER_PORT)))
                .map_err(|_| {
                    values::port_out_of_range(s).unwrap_or_else(|| {
                        format!("{s:?} is not an address: write \"IP\" or \"IP:PORT\", e.g. \"10.0.0.53:53\"")
                    })
                })?;
            if sa.port() == 0 {
                return Err("port 0 is not allowed (ports are 1..65535)".into());
            }
            Ok(sa)
        })
    })?;
    let xdp_mode = opt(t, "xdp_mode", |f| f.choice(XDP_MODES))?.unwrap_or(d.xdp_mode);
    let api_listen = opt(t, "api_listen", |f| {
        f.parse(|s| {
            if s.is_empty() {
                return Ok(None);
            }
            s.parse::<SocketAddr>().map(Some).map_err(|_| {
                values::port_out_of_range(s).unwrap_or_else(|| {
                    format!("{s:?} is not an address: write \"IP:PORT\", e.g. \"127.0.0.1:9900\", or \"\" to disable the API")
                })
            })
        })
    })?
    .unwrap_or(d.api_listen);
    let pin_path = opt(t, "pin_path", |f| {
        f.parse(|s| {
            if s.is_empty() {
                return Ok(None);
            }
            let p = PathBuf::from(s);
            if !p.is_absolute() {
                return Err(format!(
                    "{s:?} is not an absolute path: write a bpffs directory, e.g. \"/sys/fs/bpf/lb\", or \"\" to disable pinning"
                ));
            }
            Ok(Some(p))
        })
    })?
    .unwrap_or(d.pin_path);
    let api_socket = opt(t, "api_socket", |f| {
        f.parse(|s| optional_path(s, "a socket path, e.g. \"/run/lb-agent/lb-agent.sock\""))
    })?
    .unwrap_or(d.api_socket);
    let api_socket_group = opt(t, "api_socket_group", |f| {
        f.parse(|s| {
            let ok = !s.is_empty()
                && s.len() <= 32
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
            if !ok {
                return Err(format!(
                    "{s:?} is not a group name (1..32 letters, digits, '_', '-', '.')"
                ));
            }
            Ok(s.to_string())
        })
    })?;
    let api_token_file = opt(t, "api_token_file", |f| {
        f.parse(|s| {
            optional_path(s, "a file holding the token, e.g. \"/etc/lb/api.token\"")?.ok_or_else(
                || "must be a path; leave the key out to serve only reads over TCP".to_string(),
            )
        })
    })?;
    let state_file = opt(t, "state_file", |f| {
        f.parse(|s| optional_path(s, "a file, e.g. \"/var/lib/lb-agent/admin-state.json\""))
    })?
    .unwrap_or(d.state_file);
    let announce_interface = opt(t, "announce_interface", |f| {
        let s = f.str()?;
        if s.is_empty() {
            return Ok(None);
        }
        if s.len() > 15 || s.contains(|c: char| c == '/' || c.is_whitespace() || c.is_control()) {
            return Err(f.err(format!(
                "{s:?} is not an interface name (1..15 bytes, no '/' or whitespace); \"\" disables announcing"
            )));
        }
        Ok(Some(s.to_string()))
    })?
    .flatten();
    let announce_lifetime =
        opt(t, "announce_lifetime", announce_lifetime)?.unwrap_or(d.announce_lifetime);
    let bird_socket = opt(t, "bird_socket", |f| {
        f.parse(|s| optional_path(s, "BIRD's control socket, e.g. \"/run/bird/bird.ctl\""))
    })?
    .flatten();
    if bird_socket.is_some() && announce_interface.is_none() {
        let f = t.get("bird_socket").expect("the path came from the field");
        return Err(f.err("needs announce_interface: BGP status is part of announcing"));
    }
    let max_backends = opt(t, "max_backends", |f| {
        f.int_in(1, MAX_MAX_BACKENDS.into()).map(|n| n as u32)
    })?
    .unwrap_or(d.max_backends);
    let max_flows = opt(t, "max_flows", |f| {
        f.int_in(MIN_MAX_FLOWS.into(), MAX_MAX_FLOWS.into())
            .map(|n| n as u32)
    })?;
    let log_format = opt(t, "log_format", |f| f.choice(LOG_FORMATS))?.unwrap_or(d.log_format);
    let tunnel_source = opt(t, "tunnel_source", |f| {
        let ip = f.parse(|s| {
            s.parse::<IpAddr>()
                .map_err(|_| format!("{s:?} is not an IP address (no port), e.g. \"10.0.0.2\""))
        })?;
        if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() {
            return Err(f.err(format!("{ip} is not a unicast address of this host")));
        }
        Ok(ip)
    })?;
    if api_socket_group.is_some() && api_socket.is_none() {
        let f = t
            .get("api_socket_group")
            .expect("the group came from the field");
        return Err(f.err("needs api_socket: the group applies to the socket"));
    }
    Ok(AgentConfig {
        interface,
        resolver,
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
    })
}

/// `agent.announce_lifetime`: a duration in [`ANNOUNCE_LIFETIMES`], or `"forever"`.
fn announce_lifetime(f: &Field<'_>) -> R<Option<Duration>> {
    if f.str()? == "forever" {
        return Ok(None);
    }
    let d = duration(f)?;
    if !ANNOUNCE_LIFETIMES.contains(&d) || d.subsec_nanos() != 0 {
        return Err(f.err(format!(
            "must be whole seconds from {}s to {}s (\"60s\"), or \"forever\" to keep \
             announcing while the agent is dead",
            ANNOUNCE_LIFETIMES.start().as_secs(),
            ANNOUNCE_LIFETIMES.end().as_secs()
        )));
    }
    Ok(Some(d))
}

/// `""` → `None`; otherwise an absolute path (`what` says what to write).
fn optional_path(s: &str, what: &str) -> Result<Option<PathBuf>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let p = PathBuf::from(s);
    if !p.is_absolute() {
        return Err(format!(
            "{s:?} is not an absolute path: write {what}, or \"\" to disable"
        ));
    }
    Ok(Some(p))
}

pub(super) fn service_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        && s.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a service name: 1..64 letters, digits, '_', '-' or '.', starting with a letter or digit"
        ))
    }
}

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

fn vip(s: &str) -> Result<SocketAddr, String> {
    let sa = match s.parse::<SocketAddr>() {
        Ok(sa) => sa,
        Err(_) if s.parse::<IpAddr>().is_ok() => {
            return Err(format!(
                "{s:?} has no port: write \"IP:PORT\", e.g. \"10.0.0.100:80\""
            ));
        }
        Err(_) => {
            return Err(values::port_out_of_range(s).unwrap_or_else(|| {
                format!("{s:?} is not an address: write \"IP:PORT\" or \"[IPv6]:PORT\"")
            }));
        }
    };
    if sa.port() == 0 {
        return Err(format!("{s:?}: port 0 is not allowed (ports are 1..65535)"));
    }
    if sa.ip().is_unspecified() || sa.ip().is_multicast() {
        return Err(format!("{s:?}: a VIP must be a unicast address"));
    }
    Ok(sa)
}

fn service(t: &Table<'_>) -> R<ServiceConfig> {
    t.check_keys(SERVICE_KEYS)?;
    let name = t.require("name", "\"web\"")?.parse(service_name)?;
    let vip_field = t.require("vip", "\"10.0.0.100:80\"")?;
    let vip = vip_field.parse(vip)?;
    let protocol = opt(t, "protocol", |f| f.choice(PROTOCOLS))?.unwrap_or_default();
    let forwarding = opt(t, "forwarding", |f| f.choice(FORWARDINGS))?.unwrap_or_default();

    let snat_ips = snat_ips(t, forwarding, vip)?;
    let snat_ports = match (forwarding, t.get("snat_ports")) {
        (fw, Some(f)) if fw != Forwarding::Nat => {
            return Err(f.err(format!(
                "applies to forwarding = \"nat\" only ({fw} allocates no source ports)"
            )));
        }
        (_, Some(f)) => f.parse(values::port_range)?,
        (_, None) => DEFAULT_SNAT_PORTS,
    };

    let source_rate = nat_only(t, forwarding, "source_rate")?
        .map(|f| f.int_in(0, 1_000_000_000))
        .transpose()?
        .map_or(DEFAULT_SOURCE_RATE, |n| n as u32);
    let source_burst = nat_only(t, forwarding, "source_burst")?
        .map(|f| f.int_in(1, u32::MAX.into()))
        .transpose()?
        .map_or(DEFAULT_SOURCE_BURST, |n| n as u32);

    let maglev_size = opt(t, "maglev_size", |f| {
        let n = f.int_in(0, u32::MAX.into())?;
        let size = n as u32;
        if !lb_common::is_maglev_size(size) {
            return Err(f.err(format!(
                "must be one of {:?} (primes; at least 100 slots per server keeps the \
                 spread even)",
                lb_common::MAGLEV_SIZES
            )));
        }
        Ok(size)
    })?;
    let max_fails_written = t.get("max_fails").is_some();
    let max_fails = opt(t, "max_fails", |f| f.int_in(0, u32::MAX.into()))?
        .map_or(DEFAULT_MAX_FAILS, |n| n as u32);
    let fail_timeout = opt(t, "fail_timeout", |f| {
        let d = duration(f)?;
        if d.is_zero() && max_fails > 0 {
            return Err(f.err(
                "must be more than 0 while max_fails > 0 (max_fails = 0 turns passive checks off)",
            ));
        }
        Ok(d)
    })?
    .unwrap_or(DEFAULT_FAIL_TIMEOUT);
    let max_unhealthy_percent =
        opt(t, "max_unhealthy_percent", |f| f.int_in(0, 100))?.map_or(100, |n| n as u8);
    let fail_open = opt(t, "fail_open", Field::bool)?.unwrap_or(true);
    let backup_switch = opt(t, "backup_switch", backup_switch)?.unwrap_or_default();

    let ctx = ServiceCtx {
        vip,
        protocol,
        forwarding,
    };
    let server_field = t.get("server").ok_or_else(|| {
        t.err_key(
            "server",
            "a service needs at least one [[service.server]] with an address",
        )
    })?;
    let server_tables = server_field.tables()?;
    if server_tables.is_empty() {
        return Err(server_field.err("a service needs at least one server"));
    }
    if server_tables.len() > MAX_MAX_BACKENDS as usize {
        return Err(server_field.err(format!("at most {MAX_MAX_BACKENDS} servers are supported")));
    }
    let mut servers: Vec<ServerConfig> = Vec::with_capacity(server_tables.len());
    for st in &server_tables {
        let s = server(st, &ctx)?;
        if let Some(i) = servers
            .iter()
            .position(|o| o.address == s.address && o.service == s.service)
        {
            let f = st.get("address").expect("address was required");
            return Err(f.err(format!(
                "duplicate server {} (also {}.server[{i}])",
                s.address, t.path
            )));
        }
        servers.push(s);
    }

    let mut probes: Vec<ProbeConfig> = Vec::new();
    if let Some(f) = t.get("probe") {
        for pt in &f.tables()? {
            let p = super::probe::probe(pt)?;
            if let Some(i) = probes.iter().position(|o| o.name == p.name) {
                let msg = format!(
                    "duplicate probe name {:?} (also {}.probe[{i}]); give each probe a name",
                    p.name, t.path
                );
                return Err(match pt.get("name") {
                    Some(f) => f.err(msg),
                    None => pt.err_key("name", msg),
                });
            }
            probes.push(p);
        }
    }
    if forwarding.is_tunnel() {
        for p in probes.iter_mut().filter(|p| p.kind == ProbeKind::Icmp) {
            p.tunnel = Some(super::TunnelProbe {
                vip: vip.ip(),
                gue: forwarding == Forwarding::Gue,
            });
        }
    }

    Ok(ServiceConfig {
        name,
        vip,
        protocol,
        forwarding,
        snat_ips,
        snat_ports,
        source_rate,
        source_burst,
        maglev_size,
        max_fails,
        max_fails_written,
        fail_timeout,
        max_unhealthy_percent,
        fail_open,
        backup_switch,
        servers,
        probes,
    })
}

/// A key that applies to nat services only.
fn nat_only<'a>(t: &Table<'a>, forwarding: Forwarding, key: &str) -> R<Option<Field<'a>>> {
    match (forwarding, t.get(key)) {
        (fw, Some(f)) if fw != Forwarding::Nat => Err(f.err(format!(
            "applies to forwarding = \"nat\" only ({fw} allocates no source ports)"
        ))),
        (_, f) => Ok(f),
    }
}

/// `snat_ip = "IP"` or `snat_ips = ["IP", ...]` (one of them, required with nat).
fn snat_ips(t: &Table<'_>, forwarding: Forwarding, vip: SocketAddr) -> R<Vec<IpAddr>> {
    let fields = match (forwarding, t.get("snat_ip"), t.get("snat_ips")) {
        (fw @ (Forwarding::Dsr | Forwarding::Ipip | Forwarding::Gue), one, many) => {
            if let Some(f) = one.or(many) {
                return Err(f.err(format!(
                    "applies to forwarding = \"nat\" only ({fw} keeps the client's source address)"
                )));
            }
            return Ok(Vec::new());
        }
        (Forwarding::Nat, None, None) => {
            return Err(t.err_key(
                "snat_ip",
                format!(
                    "forwarding = \"nat\" needs snat_ip: an {} address of this host toward the backends \
                     (or snat_ips = [...] for several)",
                    family(vip.ip())
                ),
            ));
        }
        (Forwarding::Nat, Some(_), Some(many)) => {
            return Err(many.err(
                "snat_ip and snat_ips both given: use snat_ips = [...] alone for several addresses",
            ));
        }
        (Forwarding::Nat, Some(one), None) => vec![one],
        (Forwarding::Nat, None, Some(many)) => {
            let items = many.array()?;
            if items.is_empty() || items.len() > MAX_SNAT_ADDRS {
                return Err(many.err(format!(
                    "must list 1 to {MAX_SNAT_ADDRS} addresses (got {})",
                    items.len()
                )));
            }
            items
        }
    };
    let mut ips: Vec<IpAddr> = Vec::with_capacity(fields.len());
    for f in fields {
        let ip = f.parse(|s| {
            s.parse::<IpAddr>()
                .map_err(|_| format!("{s:?} is not an IP address (no port), e.g. \"10.0.0.2\""))
        })?;
        if ip.is_ipv4() != vip.ip().is_ipv4() {
            return Err(f.err(format!(
                "must be of the VIP's family ({} for {vip}), got {ip}",
                family(vip.ip())
            )));
        }
        if ip.is_unspecified() || ip.is_multicast() {
            return Err(f.err(format!("{ip} is not a unicast address")));
        }
        if ips.contains(&ip) {
            return Err(f.err(format!("{ip} is listed twice")));
        }
        ips.push(ip);
    }
    Ok(ips)
}

fn backup_switch(f: &Field<'_>) -> R<BackupSwitch> {
    let t = f.table().map_err(|_| {
        f.err("must be a table: { permanent = \"2m\" }, { permanent = true } or { permanent = false }")
    })?;
    t.check_keys(BACKUP_SWITCH_KEYS)?;
    let Some(p) = t.get("permanent") else {
        return Ok(BackupSwitch::TryPrimaryEachFlow);
    };
    if let Some(b) = p.as_bool_opt() {
        return Ok(if b {
            BackupSwitch::Permanent
        } else {
            BackupSwitch::TryPrimaryEachFlow
        });
    }
    if p.as_str_opt().is_none() {
        return Err(p.err("must be true, false or a duration such as \"2m\""));
    }
    Ok(BackupSwitch::RetryAfter(positive_duration(&p)?))
}

/// What a server's rules depend on.
struct ServiceCtx {
    vip: SocketAddr,
    protocol: Protocol,
    forwarding: Forwarding,
}

fn server(t: &Table<'_>, ctx: &ServiceCtx) -> R<ServerConfig> {
    t.check_keys_hinted(SERVER_KEYS, |key| misplaced(key, "[[service.server]]"))?;
    let addr_field = t.require("address", "\"10.0.1.11:8080\"")?;
    let mut address = addr_field.parse(values::server_address)?;
    let weight = opt(t, "weight", |f| f.int_in(1, MAX_WEIGHT.into()))?.map_or(1, |n| n as u32);
    let spare_field = t.get("spare");
    let spare = spare_field
        .as_ref()
        .map(Field::bool)
        .transpose()?
        .unwrap_or(false);
    let backup_field = t.get("backup");
    let backup = match &backup_field {
        None => BackupLevel::Level(0),
        Some(f) => {
            if let Some(b) = f.as_bool_opt() {
                BackupLevel::Level(u32::from(b))
            } else if f.as_int_opt().is_some() {
                BackupLevel::Level(f.int_in(0, MAX_BACKUP_LEVEL.into())? as u32)
            } else if f.as_str_opt() == Some("prio") {
                BackupLevel::Prio
            } else {
                return Err(f.err(
                    "must be a level (0 = primary, 1, 2, ...), true (= 1), false (= 0) or \"prio\"",
                ));
            }
        }
    };
    let resolve_field = t.get("resolve");
    let resolve = resolve_field
        .as_ref()
        .map(Field::bool)
        .transpose()?
        .unwrap_or(false);
    let srv_field = t.get("service");
    let service = srv_field
        .as_ref()
        .map(|f| f.parse(|s| srv_service(s, ctx.protocol)))
        .transpose()?;

    match &mut address {
        ServerAddress::Socket(sa) => {
            if let Some(f) = &resolve_field
                && resolve
            {
                return Err(f.err(format!(
                    "resolve = true needs a host name, and {:?} is an IP address",
                    addr_field.str()?
                )));
            }
            if sa.port() == 0 && sa.is_ipv4() == ctx.vip.is_ipv4() {
                sa.set_port(ctx.vip.port());
            }
            // The rules the API applies to servers it adds, too.
            super::check_server_address(ctx.vip, ctx.forwarding, *sa)
                .map_err(|e| addr_field.err(e.0))?;
        }
        ServerAddress::Name { port, .. } => {
            if service.is_some() {
                if port.is_some() {
                    return Err(addr_field.err(
                        "a port cannot be combined with service: the SRV records give the ports; write the name alone",
                    ));
                }
            } else if port.is_none() {
                *port = Some(ctx.vip.port());
            }
        }
    }
    if let Some(f) = &srv_field
        && !resolve
    {
        return Err(f.err("an SRV service needs resolve = true"));
    }
    if ctx.forwarding.keeps_destination()
        && let Some(p) = address.port()
        && p != ctx.vip.port()
    {
        return Err(addr_field.err(format!(
            "forwarding = \"{}\" keeps the destination port: the server port must be the VIP's ({}), got {p}",
            ctx.forwarding,
            ctx.vip.port()
        )));
    }
    if backup == BackupLevel::Prio && service.is_none() {
        let f = backup_field.as_ref().expect("prio came from the field");
        return Err(f.err("backup = \"prio\" needs resolve = true and an SRV service (the SRV priority becomes the level)"));
    }
    if spare && backup != BackupLevel::Level(0) {
        let f = spare_field.as_ref().expect("spare came from the field");
        return Err(f.err(
            "spare servers belong to the primary group (backup = 0); a backup level is a group of its own",
        ));
    }
    Ok(ServerConfig {
        address,
        weight,
        spare,
        backup,
        resolve,
        service,
    })
}

/// `"http"` → `"_http._tcp"` (`._udp` for udp services); a name with a dot as given.
fn srv_service(s: &str, protocol: Protocol) -> Result<String, String> {
    let full = if s.contains('.') {
        s.to_string()
    } else {
        format!("_{}._{}", s.trim_start_matches('_'), protocol)
    };
    values::dns_name(&full).map_err(|_| {
        format!("{s:?} is not an SRV service: write e.g. \"http\" (meaning \"_http._{protocol}\") or \"_http._tcp\"")
    })?;
    Ok(full)
}
