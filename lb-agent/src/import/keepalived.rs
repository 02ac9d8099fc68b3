//! keepalived's IPVS configuration into lb services: each `virtual_server` (and each
//! address of a `virtual_server_group`) becomes a service, its `real_server`s servers,
//! `sorry_server` a backup server, the checks of the first real server the service's
//! probes (`HTTP_GET`, `SSL_GET`, `TCP_CHECK`, `UDP_CHECK`, `PING_CHECK`, `SMTP_CHECK`);
//! everything else becomes a note on what lb does instead.

use std::{collections::BTreeMap, net::IpAddr};

use super::{
    ImportError, arg, bad,
    draft::{Draft, Service, Table, Value},
    secs, service_name, socket,
    syntax::Directive,
};

/// keepalived's defaults: `delay_loop` and `connect_timeout`, in seconds.
const DELAY_LOOP: u64 = 60;
const CONNECT_TIMEOUT: u64 = 5;

const NO_SCRIPTS: &str = "lb runs no scripts or notifications; it reports every transition \
     in `lb-agent events`, the API (/api/v1/events) and the metrics (lb_transitions_total, \
     lb_server_state)";
const NO_QUORUM: &str = "lb has no quorum: max_unhealthy_percent caps how many servers \
     health removes at once, fail_open spreads traffic over all servers when none is usable, \
     and with announce_interface a VIP is withdrawn when no server can serve \
     (docs/membership.md, docs/multi-node.md)";

pub fn convert(tree: &[Directive]) -> Result<Draft, ImportError> {
    let groups: BTreeMap<&str, &Directive> = tree
        .iter()
        .filter(|d| d.name == "virtual_server_group")
        .filter_map(|d| Some((d.args.first()?.as_str(), d)))
        .collect();
    let mut draft = Draft::default();
    for d in tree {
        match d.name.as_str() {
            "virtual_server" => virtual_server(d, &groups, &mut draft)?,
            "virtual_server_group" => {}
            "global_defs" => draft.note(
                d.line,
                format!(
                    "global_defs (router_id, notification e-mail, SMTP): no equivalent; {NO_SCRIPTS}"
                ),
            ),
            "vrrp_instance" | "vrrp_sync_group" | "vrrp_script" | "vrrp_track_process"
            | "vrrp_track_file" => draft.note(
                d.line,
                format!(
                    "{} {}: VRRP is not lb's: lb announces VIPs to routers with BGP through \
                     BIRD (announce_interface, docs/multi-node.md); VRRP may keep moving the \
                     VIP address beside lb",
                    d.name,
                    d.args.join(" ")
                ),
            ),
            "static_ipaddress" | "static_routes" | "static_rules" => draft.note(
                d.line,
                format!(
                    "{}: lb configures no addresses or routes; keep them in the host's \
                     network configuration",
                    d.name
                ),
            ),
            "include" => draft.note(
                d.line,
                format!(
                    "{}: not followed; convert the included file on its own",
                    d.text()
                ),
            ),
            _ => draft.note(d.line, format!("{}: no equivalent in lb", d.text())),
        }
    }
    Ok(draft)
}

/// The VIPs a `virtual_server` stands for: its own address, or each address of its group.
fn vips(
    d: &Directive,
    groups: &BTreeMap<&str, &Directive>,
    draft: &mut Draft,
) -> Result<Vec<(IpAddr, u16)>, ImportError> {
    match d.args.as_slice() {
        [ip, port] if ip != "fwmark" && ip != "group" => {
            Ok(vec![(ip_of(d, ip)?, port_of(d, port)?)])
        }
        [kw, mark] if kw == "fwmark" => {
            draft.note(
                d.line,
                format!(
                    "virtual_server fwmark {mark}: lb balances VIP:port services, not firewall \
                     marks; not converted (write one service per VIP and port the mark covers)"
                ),
            );
            Ok(Vec::new())
        }
        [kw, name] if kw == "group" => {
            let Some(group) = groups.get(name.as_str()) else {
                return Err(bad(d, &format!("no virtual_server_group {name}")));
            };
            let mut out = Vec::new();
            for entry in group.children() {
                if entry.name == "fwmark" {
                    draft.note(
                        entry.line,
                        format!(
                            "virtual_server_group {name}: {}: firewall marks are not \
                             converted",
                            entry.text()
                        ),
                    );
                    continue;
                }
                let [port] = entry.args.as_slice() else {
                    return Err(bad(entry, "expects an address (or a range) and a port"));
                };
                let port = port_of(entry, port)?;
                out.extend(range(entry)?.into_iter().map(|ip| (ip, port)));
            }
            Ok(out)
        }
        _ => Err(bad(d, "expects IP PORT, fwmark N or group NAME")),
    }
}

/// `10.0.0.3-10` or `ae00::2-9`: the last part ranges to the number after the dash.
fn range(entry: &Directive) -> Result<Vec<IpAddr>, ImportError> {
    let Some((first, last)) = entry.name.rsplit_once('-') else {
        return Ok(vec![ip_of(entry, &entry.name)?]);
    };
    let first = ip_of(entry, first)?;
    let out_of_range = || bad(entry, &format!("cannot read the range {:?}", entry.name));
    match first {
        IpAddr::V4(v4) => {
            let last: u8 = last.parse().map_err(|_| out_of_range())?;
            let o = v4.octets();
            Ok((o[3]..=last)
                .map(|x| IpAddr::from([o[0], o[1], o[2], x]))
                .collect())
        }
        IpAddr::V6(v6) => {
            let last = u16::from_str_radix(last, 16).map_err(|_| out_of_range())?;
            let s = v6.segments();
            Ok((s[7]..=last)
                .map(|x| IpAddr::from([s[0], s[1], s[2], s[3], s[4], s[5], s[6], x]))
                .collect())
        }
    }
}

fn ip_of(d: &Directive, s: &str) -> Result<IpAddr, ImportError> {
    s.parse()
        .map_err(|_| bad(d, &format!("{s:?} is not an IP address")))
}

fn port_of(d: &Directive, s: &str) -> Result<u16, ImportError> {
    s.parse()
        .map_err(|_| bad(d, &format!("{s:?} is not a port")))
}

/// What a `virtual_server` block says, before it is written once per VIP.
struct Block {
    service: Table,
    forwarding: &'static str,
    delay_loop: u64,
    alpha: bool,
    servers: Vec<(Directive, Table)>,
    probes: Vec<Table>,
    virtualhost: Option<String>,
}

fn virtual_server(
    d: &Directive,
    groups: &BTreeMap<&str, &Directive>,
    draft: &mut Draft,
) -> Result<(), ImportError> {
    let vips = vips(d, groups, draft)?;
    if vips.is_empty() {
        return Ok(());
    }
    let mut b = Block {
        service: Table::default(),
        forwarding: "nat",
        delay_loop: DELAY_LOOP,
        alpha: false,
        servers: Vec::new(),
        probes: Vec::new(),
        virtualhost: None,
    };
    let mut protocol = "tcp";
    let mut sorry = None;
    let mut real_servers = Vec::new();
    for c in d.children() {
        let t = c.text();
        match c.name.as_str() {
            "delay_loop" => b.delay_loop = arg(c)?,
            "lb_kind" | "lvs_method" => {
                b.forwarding = match c.args.first().map(|a| a.to_ascii_uppercase()).as_deref() {
                    Some("NAT") => "nat",
                    Some("DR") => "dsr",
                    Some("TUN") => "ipip",
                    _ => return Err(bad(c, "expects NAT, DR or TUN")),
                }
            }
            "protocol" => {
                protocol = match c.args.first().map(|a| a.to_ascii_uppercase()).as_deref() {
                    Some("TCP") => "tcp",
                    Some("UDP") => "udp",
                    _ => {
                        draft.note(
                            c.line,
                            format!(
                                "virtual_server {}: {t}: lb balances tcp and udp only; not \
                                 converted",
                                d.args.join(" ")
                            ),
                        );
                        return Ok(());
                    }
                }
            }
            "lb_algo" | "lvs_sched" => b.service.note(
                c.line,
                format!(
                    "{t}: lb spreads new flows by weighted Maglev hashing and pins each flow \
                     to its server in a flow table (docs/internals/fast-path.md); the weights \
                     are kept"
                ),
            ),
            "persistence_timeout" | "persistence_granularity" | "persistence_engine" => {
                b.service.note(
                    c.line,
                    format!(
                        "{t}: no equivalent: lb keeps each connection on its server for its \
                         life, but a client's next connection may go to another server"
                    ),
                )
            }
            "sorry_server" => sorry = Some(c),
            "alpha" => {
                b.alpha = true;
                b.service.note(
                    c.line,
                    "alpha: a server takes traffic only once its checks pass: the probes \
                     are essential",
                );
            }
            "quorum" | "quorum_up" | "quorum_down" | "hysteresis" => {
                b.service.note(c.line, format!("{t}: {NO_QUORUM}"))
            }
            "omega" | "notify_up" | "notify_down" | "smtp_alert" => {
                b.service.note(c.line, format!("{t}: {NO_SCRIPTS}"))
            }
            "inhibit_on_failure" => b.service.note(c.line, inhibit(&t)),
            "virtualhost" => b.virtualhost = c.args.first().cloned(),
            "real_server" => real_servers.push(c),
            _ => b.service.note(c.line, format!("{t}: no equivalent in lb")),
        }
    }
    for rs in real_servers {
        real_server(rs, &mut b)?;
    }
    if let Some(s) = sorry {
        let mut t = Table::default();
        t.note(
            s.line,
            "sorry_server: a backup server, used only while no real server is usable",
        );
        let [ip, rest @ ..] = s.args.as_slice() else {
            return Err(bad(s, "expects an address and a port"));
        };
        let ip = ip_of(s, ip)?;
        t.set(
            "address",
            Value::str(match rest.first() {
                Some(port) => socket(ip, port_of(s, port)?),
                None => ip.to_string(),
            }),
        );
        t.set("backup", Value::Int(1));
        b.servers.push((s.clone(), t));
    }
    if b.forwarding == "nat" {
        b.service.note(
            d.line,
            "lb's nat is full NAT: the servers answer the balancer, not the client, so they \
             need no route back through it. snat_ip is the balancer's source address toward \
             them: it is set to the VIP here; set an address of this host on their network",
        );
    }
    for (ip, port) in vips {
        let mut service = Service::default();
        let vip = socket(ip, port);
        let mut table = Table::with_notes(b.service.notes.clone());
        table.set("name", Value::str(service_name(&vip, &draft.services)));
        table.set("vip", Value::str(&vip));
        table.set("protocol", Value::str(protocol));
        table.set("forwarding", Value::str(b.forwarding));
        if b.forwarding == "nat" {
            table.set("snat_ip", Value::str(ip.to_string()));
        }
        for (rs, t) in &b.servers {
            if rs.args.first().and_then(|a| a.parse::<IpAddr>().ok()) == Some(ip) {
                table.note(
                    rs.line,
                    format!(
                        "{}: the VIP's own address: lb cannot forward to it; left out",
                        rs.text()
                    ),
                );
                continue;
            }
            let mut t = t.clone();
            if b.forwarding != "nat" {
                same_port(rs, &mut t, ip, port)?;
            }
            service.servers.push(t);
        }
        if service.servers.is_empty() {
            draft.note(
                d.line,
                format!("virtual_server for {vip}: no real server lb can use; not converted"),
            );
            continue;
        }
        service.table = table;
        service.probes = b.probes.clone();
        draft.services.push(service);
    }
    Ok(())
}

/// dsr and ipip keep the VIP's port: a server on another port is written without one.
fn same_port(rs: &Directive, t: &mut Table, vip: IpAddr, port: u16) -> Result<(), ImportError> {
    let [ip, rest @ ..] = rs.args.as_slice() else {
        return Err(bad(rs, "expects an address"));
    };
    let ip = ip_of(rs, ip)?;
    if ip.is_ipv4() != vip.is_ipv4() {
        return Err(bad(rs, "the server and the VIP are of different families"));
    }
    if let Some(p) = rest.first().filter(|p| **p != port.to_string()) {
        t.note(
            rs.line,
            format!(
                "port {p}: dsr and tunnels keep the VIP's port {port} (the server receives \
                 the client's packet unchanged)"
            ),
        );
    }
    t.set("address", Value::str(ip.to_string()));
    Ok(())
}

fn inhibit(t: &str) -> String {
    format!(
        "{t}: lb takes a failed server out of the table and moves its flows; to keep a \
         server's established connections while it takes no new ones, drain it \
         (`lb-agent server drain`, docs/admin-state.md)"
    )
}

fn real_server(rs: &Directive, b: &mut Block) -> Result<(), ImportError> {
    let [ip, rest @ ..] = rs.args.as_slice() else {
        return Err(bad(rs, "expects an address and a port"));
    };
    let ip = ip_of(rs, ip)?;
    let mut t = Table::default();
    t.set(
        "address",
        Value::str(match rest.first() {
            Some(port) => socket(ip, port_of(rs, port)?),
            None => ip.to_string(),
        }),
    );
    let mut probes = Vec::new();
    let mut delay_loop = b.delay_loop;
    for c in rs.children() {
        let text = c.text();
        match c.name.as_str() {
            "weight" => {
                let (w, note) = super::weight(arg(c)?);
                if let Some(n) = note {
                    t.note(c.line, n);
                }
                t.set("weight", Value::Int(w));
            }
            "delay_loop" => delay_loop = arg(c)?,
            "inhibit_on_failure" => t.note(c.line, inhibit(&text)),
            "notify_up" | "notify_down" | "smtp_alert" => {
                t.note(c.line, format!("{text}: {NO_SCRIPTS}"))
            }
            "uthreshold" | "lthreshold" => t.note(
                c.line,
                format!("{text}: lb has no per-server connection limit"),
            ),
            "HTTP_GET" | "SSL_GET" | "TCP_CHECK" | "UDP_CHECK" | "PING_CHECK" | "SMTP_CHECK"
            | "DNS_CHECK" | "MISC_CHECK" | "FILE_CHECK" | "BFD_CHECK" => {
                probes.extend(check(c, delay_loop, b, &mut t)?)
            }
            _ => t.note(c.line, format!("{text}: no equivalent in lb")),
        }
    }
    if b.servers.is_empty() {
        b.probes = probes;
    } else if !same_checks(&probes, &b.probes) {
        t.note(
            rs.line,
            "its checks differ from the first real server's: lb probes every server of a \
             service alike, with the first real server's checks",
        );
    }
    b.servers.push((rs.clone(), t));
    Ok(())
}

/// Whether two servers' checks are the same probes (their notes aside).
fn same_checks(a: &[Table], b: &[Table]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.keys() == y.keys())
}

/// One checker block as probes (`HTTP_GET` gives one per `url`); notes go on `server`.
fn check(
    c: &Directive,
    delay_loop: u64,
    b: &Block,
    server: &mut Table,
) -> Result<Vec<Table>, ImportError> {
    let kind = match c.name.as_str() {
        "HTTP_GET" | "SSL_GET" => "http",
        "TCP_CHECK" | "SMTP_CHECK" => "tcp",
        "UDP_CHECK" => "udp",
        "PING_CHECK" => "icmp",
        _ => {
            server.note(
                c.line,
                format!(
                    "{}: no equivalent: lb runs no check scripts or DNS/file/BFD checks, so \
                     this server gets no active check from it (passive checks still count); \
                     write the check as an http, tcp, udp or icmp probe (docs/probes.md)",
                    c.name
                ),
            );
            return Ok(Vec::new());
        }
    };
    let mut base = Table::default();
    base.set("type", Value::str(kind));
    base.set("interval", secs(delay_loop));
    base.set("timeout", secs(CONNECT_TIMEOUT));
    if b.alpha {
        base.set("essential", Value::Bool(true));
    }
    if let Some(host) = &b.virtualhost {
        base.set("host", Value::str(host));
    }
    if c.name == "SSL_GET" {
        base.set("tls", Value::Bool(true));
        base.set("verify", Value::Bool(false));
        base.note(
            c.line,
            "SSL_GET: an https probe; keepalived does not verify the certificate, so \
             neither does this probe (verify = false)",
        );
    }
    if c.name == "SMTP_CHECK" {
        base.set("expect", Value::str("^220"));
        base.note(
            c.line,
            "SMTP_CHECK: a tcp probe that expects the server's 220 greeting; it sends no HELO",
        );
    }
    let mut urls = Vec::new();
    for o in c.children() {
        let text = o.text();
        match o.name.as_str() {
            "connect_timeout" => base.set("timeout", secs(arg(o)?)),
            "connect_port" => base.set("port", Value::Int(i64::from(arg::<u16>(o)?))),
            "delay_loop" => base.set("interval", secs(arg(o)?)),
            "retry" | "nb_get_retry" => {
                let retry: i64 = arg(o)?;
                base.set("fails", Value::Int(retry + 1));
                base.note(
                    o.line,
                    format!(
                        "{text}: a failure and {retry} retries make {} consecutive \
                         failures (fails); lb probes at the interval, without \
                         delay_before_retry",
                        retry + 1
                    ),
                );
            }
            "delay_before_retry" => {}
            "virtualhost" => base.set("host", Value::str(o.args.join(" "))),
            "url" => urls.push(o),
            "helo_name" => {}
            "connect_ip" | "bindto" | "bind_port" | "bind_if" | "fwmark" | "host" => base.note(
                o.line,
                format!("{text}: lb probes the server's own address from this host"),
            ),
            "warmup" => base.note(
                o.line,
                format!("{text}: lb spreads the first probes over the first interval by itself"),
            ),
            "require_reply" => base.note(
                o.line,
                format!(
                    "{text}: an lb udp probe passes on silence unless expect or test is set: \
                     set expect to a regex the reply must match"
                ),
            ),
            _ => base.note(o.line, format!("{text}: no equivalent in lb")),
        }
    }
    if urls.is_empty() {
        if kind == "http" {
            base.set("uri", Value::str("/"));
        }
        base.set("name", Value::str(kind));
        return Ok(vec![named_first(base)]);
    }
    let mut probes = Vec::new();
    for (i, u) in urls.into_iter().enumerate() {
        let mut p = base.clone();
        if i > 0 {
            p.notes.clear();
        }
        p.set(
            "name",
            Value::str(if i == 0 {
                kind.to_owned()
            } else {
                format!("{kind}-{}", i + 1)
            }),
        );
        for o in u.children() {
            let text = o.text();
            match o.name.as_str() {
                "path" => p.set("uri", Value::str(o.args.join(" "))),
                "status_code" => {
                    let codes: Vec<String> = o
                        .args
                        .iter()
                        .map(|a| toml::Value::String(a.clone()).to_string())
                        .collect();
                    p.set(
                        "expect_status",
                        Value::Raw(format!("[{}]", codes.join(", "))),
                    );
                }
                "regex" => p.set("expect_body", Value::str(o.args.join(" "))),
                "virtualhost" => p.set("host", Value::str(o.args.join(" "))),
                "digest" => p.note(
                    o.line,
                    format!(
                        "{}: lb does not hash the body; match it with expect_body (a regex)",
                        o.name
                    ),
                ),
                _ => p.note(o.line, format!("{text}: no equivalent in lb")),
            }
        }
        if p.get("uri").is_none() {
            p.set("uri", Value::str("/"));
        }
        probes.push(named_first(p));
    }
    Ok(probes)
}

/// The same keys with `name` first, as lb's docs write probes.
fn named_first(t: Table) -> Table {
    let mut out = Table::with_notes(t.notes.clone());
    if let Some(name) = t.get("name") {
        out.set("name", name.clone());
    }
    for (k, v) in t.keys() {
        out.set(k, v.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{Format, convert};

    #[test]
    fn a_virtual_server_with_checks_sorry_server_and_quorum() {
        let text = "\
virtual_server 10.0.0.1 80 {
    delay_loop 6
    lb_algo wrr
    lb_kind NAT
    protocol TCP
    quorum 2
    sorry_server 10.0.9.9 80
    real_server 10.0.1.1 8080 {
        weight 3
        HTTP_GET {
            url {
              path /health
              status_code 200 301
              digest 640205b7b0fc66c1ea91c463fac6334d
            }
            connect_timeout 3
            retry 2
        }
    }
    real_server 10.0.1.2 8080 {
        weight 0
        MISC_CHECK {
            misc_path /bin/true
        }
    }
}
";
        let out = convert(Format::Keepalived, text, "k.conf").unwrap();
        for want in [
            "# line 3: lb_algo wrr: lb spreads new flows by weighted Maglev hashing",
            "# line 6: quorum 2: lb has no quorum",
            "name = \"10.0.0.1_80\"\nvip = \"10.0.0.1:80\"\nprotocol = \"tcp\"\nforwarding = \"nat\"\nsnat_ip = \"10.0.0.1\"\n",
            "[[service.server]]\naddress = \"10.0.1.1:8080\"\nweight = 3\n",
            "# line 21: weight 0 (no new connections)",
            "# line 22: MISC_CHECK: no equivalent",
            "# line 20: its checks differ",
            "# line 7: sorry_server: a backup server",
            "address = \"10.0.9.9:80\"\nbackup = 1\n",
            "[[service.probe]]\nname = \"http\"\ntype = \"http\"\ninterval = \"6s\"\ntimeout = \"3s\"\nfails = 3\nuri = \"/health\"\nexpect_status = [\"200\", \"301\"]\n",
            "# line 14: digest: lb does not hash the body",
        ] {
            // Notes wrap: search them as one line each.
            let notes_unwrapped = out.replace("\n#   ", " ");
            assert!(notes_unwrapped.contains(want), "{want:?} not in:\n{out}");
        }
    }

    #[test]
    fn groups_expand_fwmarks_are_noted_and_dr_keeps_the_vip_port() {
        let text = "\
virtual_server_group G {
    10.0.0.1 80
    10.0.0.5-6 80
    fwmark 1
}
virtual_server group G {
    lb_kind DR
    real_server 10.0.1.1 8080 {
        TCP_CHECK {
            connect_port 8080
        }
    }
}
virtual_server fwmark 7 {
    real_server 10.0.1.1 80 {
    }
}
";
        let out = convert(Format::Keepalived, text, "k.conf").unwrap();
        for vip in ["10.0.0.1:80", "10.0.0.5:80", "10.0.0.6:80"] {
            assert!(
                out.contains(&format!("vip = \"{vip}\"")),
                "{vip} in:\n{out}"
            );
        }
        assert!(
            out.contains("# line 4: virtual_server_group G: fwmark 1"),
            "{out}"
        );
        assert!(out.contains("# line 14: virtual_server fwmark 7"), "{out}");
        assert!(
            out.contains("# line 8: port 8080: dsr and tunnels keep"),
            "{out}"
        );
        assert!(out.contains("address = \"10.0.1.1\"\n"), "{out}");
        assert!(!out.contains("snat_ip"), "{out}");
    }

    #[test]
    fn errors_name_the_line() {
        let err = convert(
            Format::Keepalived,
            "virtual_server 10.0.0.1 80 {\n  lb_kind XX\n}\n",
            "k",
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "line 2: lb_kind: expects NAT, DR or TUN");
        let err = convert(
            Format::Keepalived,
            "virtual_server 10.0.0.1 80 {\n  real_server 10.0.1.x 80 {\n  }\n}\n",
            "k",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 2: real_server: \"10.0.1.x\" is not an IP address"
        );
    }
}
