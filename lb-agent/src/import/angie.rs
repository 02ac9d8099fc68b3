//! Angie/nginx `upstream` blocks into lb services: each upstream, once per `listen` of
//! the `server` blocks whose `proxy_pass` names it, becomes a service; its `server`s
//! keep weight, `backup` (levels), `spare`, `resolve` and `service`; `max_fails` and
//! `fail_timeout` become the service's passive checks, Angie's `upstream_probe` (and
//! nginx's `health_check`) its probes, a `map` a probe's `test` names becomes the test's
//! condition; everything else becomes a note on what lb does instead.

use std::{collections::BTreeMap, net::IpAddr};

use super::{
    ImportError, bad,
    draft::{Draft, Service, Table, Value},
    service_name, socket,
    syntax::Directive,
};

/// nginx's defaults for a server's passive checks.
const MAX_FAILS: i64 = 1;
const FAIL_TIMEOUT: &str = "10s";
/// The VIP written where the config names no address clients reach (TEST-NET-1).
const PLACEHOLDER_V4: &str = "192.0.2.1";
const PLACEHOLDER_V6: &str = "2001:db8::1";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Http,
    Stream,
}

/// A place that proxies to an upstream: the listens of its `server` block and the
/// probes beside its `proxy_pass`.
struct User<'a> {
    listens: Vec<&'a Directive>,
    probes: Vec<&'a Directive>,
    probe_timeout: Option<&'a Directive>,
    pass: &'a Directive,
}

#[derive(Default)]
struct Found<'a> {
    upstreams: Vec<(Context, &'a Directive)>,
    maps: BTreeMap<String, &'a Directive>,
    users: BTreeMap<String, Vec<User<'a>>>,
}

pub fn convert(tree: &[Directive]) -> Result<Draft, ImportError> {
    let mut found = Found::default();
    walk(tree, Context::Http, &mut found);
    let mut draft = Draft::default();
    if found.upstreams.is_empty() {
        draft.note(1, "no upstream block: nothing to convert");
    }
    for (ctx, upstream) in &found.upstreams {
        let name = upstream.args.first().map_or("", String::as_str);
        let users = found.users.get(name).map_or(&[][..], Vec::as_slice);
        convert_upstream(*ctx, upstream, users, &found.maps, &mut draft)?;
    }
    Ok(draft)
}

fn walk<'a>(level: &'a [Directive], ctx: Context, found: &mut Found<'a>) {
    for d in level {
        match d.name.as_str() {
            "stream" => walk(d.children(), Context::Stream, found),
            "http" => walk(d.children(), Context::Http, found),
            "upstream" if d.block.is_some() => found.upstreams.push((ctx, d)),
            "map" => {
                if let Some(var) = d.args.get(1) {
                    found.maps.insert(var.clone(), d);
                }
            }
            "server" if d.block.is_some() => {
                let listens = d.children().iter().filter(|c| c.name == "listen").collect();
                users(d, &listens, None, found);
            }
            _ if d.block.is_some() => walk(d.children(), ctx, found),
            _ => {}
        }
    }
}

/// Every `proxy_pass` in `block` (and its locations) with the probes beside it.
fn users<'a>(
    block: &'a Directive,
    listens: &Vec<&'a Directive>,
    timeout: Option<&'a Directive>,
    found: &mut Found<'a>,
) {
    let children = block.children();
    let timeout = children
        .iter()
        .find(|c| c.name == "upstream_probe_timeout")
        .or(timeout);
    for pass in children.iter().filter(|c| c.name == "proxy_pass") {
        let Some(target) = pass.args.first() else {
            continue;
        };
        let name = target
            .trim_start_matches("http://")
            .trim_start_matches("https://");
        let name = name.split('/').next().unwrap_or(name);
        found.users.entry(name.to_owned()).or_default().push(User {
            listens: listens.clone(),
            probes: children
                .iter()
                .filter(|c| c.name == "upstream_probe" || c.name == "health_check")
                .collect(),
            probe_timeout: timeout,
            pass,
        });
    }
    for c in children.iter().filter(|c| c.block.is_some()) {
        users(c, listens, timeout, found);
    }
}

/// The address and port a `listen` names, whether it is udp, and notes.
struct Listen {
    ip: Option<IpAddr>,
    port: u16,
    udp: bool,
}

fn listen(d: &Directive) -> Option<Listen> {
    let first = d.args.first()?;
    let udp = d.args.iter().any(|a| a == "udp");
    if let Ok(port) = first.parse() {
        return Some(Listen {
            ip: None,
            port,
            udp,
        });
    }
    let (host, port) = split_host_port(first)?;
    let port = port?.parse().ok()?;
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) if !ip.is_unspecified() => Some(ip),
        Ok(_) => None,
        Err(_) if host == "*" => None,
        Err(_) => return None,
    };
    Some(Listen { ip, port, udp })
}

/// `host:port`, `[v6]:port`, `host` → host and the port if any.
fn split_host_port(s: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return Some((host, after.strip_prefix(':')));
    }
    match s.split_once(':') {
        Some((h, p)) if !p.contains(':') => Some((h, Some(p))),
        Some(_) => Some((s, None)),
        None => Some((s, None)),
    }
}

/// A VIP for each listen of the users (a placeholder where none names an address).
fn vips(
    ctx: Context,
    upstream: &Directive,
    users: &[User],
    first_port: Option<u16>,
    notes: &mut Table,
) -> Vec<(IpAddr, u16, bool)> {
    let mut out = Vec::new();
    let placeholder = |v6: bool| -> IpAddr {
        if v6 { PLACEHOLDER_V6 } else { PLACEHOLDER_V4 }
            .parse()
            .expect("a valid address")
    };
    for user in users {
        if user
            .pass
            .args
            .first()
            .is_some_and(|t| t.starts_with("https://"))
        {
            notes.note(
                user.pass.line,
                format!(
                    "{}: lb forwards the client's connection as it is: TLS stays between \
                     the client and the server (http probes use tls = true)",
                    user.pass.text()
                ),
            );
        }
        if user.listens.is_empty() {
            let port = if ctx == Context::Http {
                80
            } else {
                first_port.unwrap_or(80)
            };
            notes.note(
                user.pass.line,
                format!(
                    "{}: its server block has no listen; the VIP {PLACEHOLDER_V4}:{port} is \
                     a placeholder: set vip to the address and port clients reach",
                    user.pass.text()
                ),
            );
            out.push((placeholder(false), port, false));
        }
        for l in &user.listens {
            let Some(parsed) = listen(l) else {
                notes.note(
                    l.line,
                    format!("{}: not an address lb can serve; not converted", l.text()),
                );
                continue;
            };
            if l.args.iter().any(|a| a == "ssl") {
                notes.note(
                    l.line,
                    format!(
                        "{}: lb does not terminate TLS: the servers receive the client's TLS \
                         connection",
                        l.text()
                    ),
                );
            }
            let ip = parsed.ip.unwrap_or_else(|| {
                let v6 = l.args[0].starts_with('[');
                let ip = placeholder(v6);
                notes.note(
                    l.line,
                    format!(
                        "{}: no address; the VIP {ip} is a placeholder: set vip to the \
                         address clients reach",
                        l.text()
                    ),
                );
                ip
            });
            if !out
                .iter()
                .any(|(i, p, u)| *i == ip && *p == parsed.port && *u == parsed.udp)
            {
                out.push((ip, parsed.port, parsed.udp));
            }
        }
    }
    if out.is_empty() {
        let port = first_port.unwrap_or(80);
        notes.note(
            upstream.line,
            format!(
                "no listen of a server block that proxies to this upstream names a port; \
                 the VIP {PLACEHOLDER_V4}:{port} is a placeholder: set vip to the address \
                 and port clients reach"
            ),
        );
        out.push((placeholder(false), port, false));
    }
    out
}

fn convert_upstream(
    ctx: Context,
    upstream: &Directive,
    users: &[User],
    maps: &BTreeMap<String, &Directive>,
    draft: &mut Draft,
) -> Result<(), ImportError> {
    let name = upstream.args.first().cloned().unwrap_or_default();
    let mut service = Table::default();
    let mut servers: Vec<Table> = Vec::new();
    let mut passive: Option<(i64, String)> = None;
    let mut first_port = None;
    for d in upstream.children() {
        let text = d.text();
        match d.name.as_str() {
            "server" => {
                let Some((t, fails, port)) = server(ctx, d, &mut service)? else {
                    continue;
                };
                first_port = first_port.or(port);
                match &passive {
                    None => passive = Some(fails),
                    Some(p) if *p != fails => service.note(
                        d.line,
                        "its max_fails/fail_timeout differ from the first server's: lb's \
                         passive checks are per service, with the first server's values",
                    ),
                    Some(_) => {}
                }
                servers.push(t);
            }
            "backup_switch" => match d.args.first().map(String::as_str) {
                Some("permanent") => {
                    service.set("backup_switch", Value::Raw("{ permanent = true }".into()))
                }
                Some(p) if p.starts_with("permanent=") => service.set(
                    "backup_switch",
                    Value::Raw(format!(
                        "{{ permanent = {} }}",
                        Value::str(duration(&p["permanent=".len()..])).render()
                    )),
                ),
                _ => service.note(d.line, format!("{text}: no equivalent in lb")),
            },
            "zone" => service.note(
                d.line,
                format!("{text}: lb keeps its state in the agent and BPF maps; no zone is needed"),
            ),
            "hash" | "ip_hash" | "least_conn" | "least_time" | "random" | "sticky"
            | "sticky_secret" | "sticky_strict" => service.note(
                d.line,
                format!(
                    "{text}: lb spreads new flows by weighted Maglev hashing and pins each \
                     flow to its server in a flow table (docs/internals/fast-path.md)"
                ),
            ),
            "keepalive" | "keepalive_time" | "keepalive_timeout" | "keepalive_requests"
            | "queue" | "ntlm" => service.note(
                d.line,
                format!(
                    "{text}: lb forwards packets; it holds no connections of its own to the \
                     servers"
                ),
            ),
            _ => service.note(d.line, format!("{text}: no equivalent in lb")),
        }
    }
    if servers.is_empty() {
        draft.note(
            upstream.line,
            format!("upstream {name}: no server lb can use; not converted"),
        );
        return Ok(());
    }
    let (max_fails, fail_timeout) = passive.unwrap_or_else(|| (MAX_FAILS, FAIL_TIMEOUT.to_owned()));
    service.note(
        upstream.line,
        "max_fails and fail_timeout (nginx's defaults 1 and 10s where unset) are lb's passive \
         checks, which count what a packet balancer sees: a RST answering a SYN, an ICMP \
         unreachable, a SYN resent (docs/passive-signals.md)",
    );
    service.note(
        upstream.line,
        "lb's nat is full NAT, as a proxy's: the servers see the balancer's snat_ip, set to \
         the VIP here; set an address of this host on their network",
    );
    let mut probe_notes = Table::default();
    let vips = vips(ctx, upstream, users, first_port, &mut service);
    let probes = probes(ctx, users, maps, &mut probe_notes)?;
    for (ip, port, udp) in vips {
        let vip = socket(ip, port);
        let protocol = if udp { "udp" } else { "tcp" };
        if let Some(other) = draft.services.iter().find(|s| {
            s.table.get("vip") == Some(&Value::str(&vip))
                && s.table.get("protocol") == Some(&Value::str(protocol))
        }) {
            let other = other
                .table
                .get("name")
                .map(Value::render)
                .unwrap_or_default();
            draft.note(
                upstream.line,
                format!(
                    "upstream {name} on {vip}: the VIP of service {other} already; lb \
                     balances connections, not requests, and cannot tell locations or \
                     hosts apart: not converted"
                ),
            );
            continue;
        }
        let mut table = Table::with_notes(service.notes.clone());
        table.set(
            "name",
            Value::str(service_name(&format!("{name}-{vip}"), &draft.services)),
        );
        table.set("vip", Value::str(&vip));
        table.set("protocol", Value::str(protocol));
        table.set("forwarding", Value::str("nat"));
        table.set("snat_ip", Value::str(ip.to_string()));
        table.set("max_fails", Value::Int(max_fails));
        if max_fails > 0 {
            table.set("fail_timeout", Value::str(&fail_timeout));
        }
        for (k, v) in service.keys() {
            table.set(k, v.clone());
        }
        table.notes.extend(probe_notes.notes.iter().cloned());
        let servers: Vec<Table> = servers
            .iter()
            .filter(|t| ip_of(t).is_none_or(|s| s.is_ipv4() == ip.is_ipv4() && s != ip))
            .cloned()
            .collect();
        if servers.is_empty() {
            draft.note(
                upstream.line,
                format!("upstream {name} for {vip}: no server of the VIP's family; not converted"),
            );
            continue;
        }
        draft.services.push(Service {
            table,
            servers,
            probes: probes
                .iter()
                .filter(|p| udp || p.get("type") != Some(&Value::str("udp")))
                .cloned()
                .collect(),
        });
    }
    Ok(())
}

/// A server's IP address (`None`: a name).
fn ip_of(t: &Table) -> Option<IpAddr> {
    let Some(Value::Str(a)) = t.get("address") else {
        return None;
    };
    let (host, _) = split_host_port(a)?;
    host.parse().ok()
}

/// One upstream `server` as an lb server, its (max_fails, fail_timeout) and its port;
/// `None` for a server lb cannot use (a Unix socket).
#[allow(clippy::type_complexity)]
fn server(
    ctx: Context,
    d: &Directive,
    service: &mut Table,
) -> Result<Option<(Table, (i64, String), Option<u16>)>, ImportError> {
    let Some(addr) = d.args.first() else {
        return Err(bad(d, "expects an address"));
    };
    if addr.starts_with("unix:") {
        service.note(
            d.line,
            format!(
                "{}: lb forwards to IP addresses only; not converted",
                d.text()
            ),
        );
        return Ok(None);
    }
    let (host, port) = split_host_port(addr).ok_or_else(|| bad(d, "cannot read the address"))?;
    let port: Option<u16> = match port {
        Some(p) => Some(
            p.parse()
                .map_err(|_| bad(d, &format!("{p:?} is not a port")))?,
        ),
        None => None,
    };
    let mut t = Table::default();
    let mut max_fails = MAX_FAILS;
    let mut fail_timeout = FAIL_TIMEOUT.to_owned();
    let mut resolve = false;
    let mut srv = None;
    let mut extra = Vec::new();
    for p in &d.args[1..] {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        match k {
            "weight" => {
                let w = v.parse().map_err(|_| bad(d, &format!("weight {v:?}")))?;
                let (w, note) = super::weight(w);
                if let Some(n) = note {
                    t.note(d.line, n);
                }
                extra.push(("weight", Value::Int(w)));
            }
            "max_fails" => {
                max_fails = v.parse().map_err(|_| bad(d, &format!("max_fails {v:?}")))?
            }
            "fail_timeout" => fail_timeout = duration(v),
            "backup" if v.is_empty() => extra.push(("backup", Value::Int(1))),
            "backup" if v == "prio" => extra.push(("backup", Value::str("prio"))),
            "backup" => extra.push((
                "backup",
                Value::Int(v.parse().map_err(|_| bad(d, &format!("backup {v:?}")))?),
            )),
            "spare" => extra.push(("spare", Value::Bool(true))),
            "resolve" => resolve = true,
            "service" => srv = Some(v.to_owned()),
            "down" | "drain" => t.note(
                d.line,
                format!(
                    "{p}: lb keeps admin states at runtime: run `lb-agent server {}` for \
                     this server after the start (docs/admin-state.md)",
                    if k == "down" { "down" } else { "drain" }
                ),
            ),
            _ => t.note(d.line, format!("{p}: no equivalent in lb")),
        }
    }
    let is_ip = host.parse::<IpAddr>().is_ok();
    let port = match (port, &srv, ctx) {
        (Some(p), _, _) => Some(p),
        (None, Some(_), _) => None,
        (None, None, Context::Http) => Some(80),
        (None, None, Context::Stream) => None,
    };
    let address = match (host.parse::<IpAddr>(), port) {
        (Ok(ip), Some(p)) => socket(ip, p),
        (Ok(ip), None) => ip.to_string(),
        (Err(_), Some(p)) => format!("{host}:{p}"),
        (Err(_), None) => host.to_owned(),
    };
    t.set("address", Value::str(address));
    for (k, v) in extra {
        t.set(k, v);
    }
    if !is_ip && (resolve || srv.is_some()) {
        t.set("resolve", Value::Bool(true));
    }
    if let Some(s) = srv {
        t.set("service", Value::str(s));
    }
    Ok(Some((t, (max_fails, fail_timeout), port)))
}

/// An nginx time (`30`, `10s`, `1m`, `500ms`) as lb writes durations.
fn duration(v: &str) -> String {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        format!("{v}s")
    } else {
        v.to_owned()
    }
}

/// The probes of every user of the upstream (the first user's where several repeat a
/// name), with the users' `upstream_probe_timeout`.
fn probes(
    ctx: Context,
    users: &[User],
    maps: &BTreeMap<String, &Directive>,
    notes: &mut Table,
) -> Result<Vec<Table>, ImportError> {
    let mut out: Vec<Table> = Vec::new();
    for user in users {
        for d in &user.probes {
            let mut p = probe(ctx, d, user.probe_timeout, maps, notes)?;
            let https = user
                .pass
                .args
                .first()
                .is_some_and(|t| t.starts_with("https://"));
            if https && p.get("type") == Some(&Value::str("http")) {
                p.set("tls", Value::Bool(true));
            }
            if !out.iter().any(|o| o.get("name") == p.get("name")) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

fn probe(
    ctx: Context,
    d: &Directive,
    timeout: Option<&Directive>,
    maps: &BTreeMap<String, &Directive>,
    notes: &mut Table,
) -> Result<Table, ImportError> {
    let nginx_plus = d.name == "health_check";
    let (name, params) = if nginx_plus {
        ("health_check".to_owned(), &d.args[..])
    } else {
        let Some((name, rest)) = d.args.split_first() else {
            return Err(bad(d, "expects a name"));
        };
        (name.clone(), rest)
    };
    let mut p = Table::default();
    p.set("name", Value::str(&name));
    let flags: Vec<&str> = params.iter().map(String::as_str).collect();
    let kind = if flags.contains(&"ping") {
        "icmp"
    } else if ctx == Context::Http {
        "http"
    } else if flags.contains(&"udp") {
        "udp"
    } else {
        "tcp"
    };
    p.set("type", Value::str(kind));
    if let Some(t) = timeout.and_then(|t| t.args.first()) {
        p.set("timeout", Value::str(duration(t)));
    }
    for param in params {
        let (k, v) = param.split_once('=').unwrap_or((param, ""));
        match k {
            "ping" | "udp" => {}
            "send" => p.set(k, payload(v)),
            "uri" | "method" | "max_body" | "max_response" | "mode" => p.set(k, Value::str(v)),
            "port" | "fails" | "passes" => p.set(
                k,
                Value::Int(v.parse().map_err(|_| bad(d, &format!("{k} {v:?}")))?),
            ),
            "interval" | "jitter" => p.set(k, Value::str(duration(v))),
            "ping_timeout" => p.set("timeout", Value::str(duration(v))),
            "essential" | "mandatory" => p.set("essential", Value::Bool(true)),
            "persistent" => p.set("persistent", Value::Bool(true)),
            "test" => match test(v, maps) {
                Some(t) => p.set("test", Value::str(t)),
                None => notes.note(
                    d.line,
                    format!(
                        "probe {name}: test={v}: no map defines it; lb's test is a condition \
                         over $upstream_status, $upstream_http_<name> and \
                         $upstream_probe_response (docs/probes.md): write it there"
                    ),
                ),
            },
            _ => notes.note(
                d.line,
                format!("probe {name}: {param}: no equivalent in lb"),
            ),
        }
    }
    if kind == "http" && p.get("uri").is_none() {
        p.set("uri", Value::str("/"));
    }
    Ok(p)
}

/// A tcp/udp payload as a TOML literal string in lb's escapes (`\r`, `\n`, `\xNN`),
/// as Angie's docs write it.
fn payload(v: &str) -> Value {
    let mut out = String::from("'");
    for c in v.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\x27"),
            c if c.is_control() && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    Value::Raw(out)
}

/// Angie's `test=$var` as lb's condition: the `map` that sets `$var`, its entries whose
/// value is neither empty nor `0` joined with `||` (or, when its default is such a value,
/// the others negated); other values are kept as they are.
fn test(v: &str, maps: &BTreeMap<String, &Directive>) -> Option<String> {
    let Some(map) = maps.get(v) else {
        let known = [
            "$upstream_status",
            "$upstream_http_",
            "$upstream_probe_response",
        ];
        return known.iter().any(|k| v.contains(k)).then(|| v.to_owned());
    };
    let source = map.args.first()?;
    let truthy = |r: &[String]| r.first().is_some_and(|x| !x.is_empty() && x != "0");
    let mut yes = Vec::new();
    let mut no = Vec::new();
    let mut default_true = false;
    for e in map.children() {
        let cond = match e.name.as_str() {
            "default" => {
                default_true = truthy(&e.args);
                continue;
            }
            "hostnames" | "volatile" => continue,
            n => match (n.strip_prefix("~*"), n.strip_prefix('~')) {
                (Some(re), _) => format!("{source} ~* {}", quoted(re)),
                (None, Some(re)) => format!("{source} ~ {}", quoted(re)),
                (None, None) => format!("{source} == {}", quoted(n)),
            },
        };
        if truthy(&e.args) {
            yes.push(cond);
        } else {
            no.push(cond);
        }
    }
    if default_true {
        Some(if no.is_empty() {
            source.clone()
        } else {
            format!("!({})", no.join(" || "))
        })
    } else if yes.is_empty() {
        None
    } else {
        Some(yes.join(" || "))
    }
}

/// A double-quoted word of lb's test syntax (`\"` and `\\` escaped).
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}
