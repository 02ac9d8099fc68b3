//! Config files that are rejected (agent, services, servers): each error names the file,
//! the line, the key path and what is allowed. Probe errors: `probe_errors.rs`.

use std::path::Path;

use crate::util::{check, error, probe, service};
use lb_agent::config::load;

#[test]
fn display_names_file_line_key_and_rule() {
    let text = "\
[agent]
interface = \"eth0\"

[[service]]
name = \"web\"
vip = \"10.0.0.100:80\"
snat_ip = \"10.0.0.2\"

[[service.server]]
address = \"10.0.1.11:8080\"
[[service.server]]
weight = 0
address = \"10.0.1.12:8080\"
";
    let e = error(text);
    assert_eq!(
        e.to_string(),
        "lb.toml:12: service[0].server[1].weight: must be at least 1 (got 0)"
    );
    assert_eq!(e.io_kind, None);
}

#[test]
fn unreadable_file() {
    let e = load(Path::new("/nonexistent/lb.toml")).expect_err("a missing file is an error");
    assert_eq!(e.io_kind, Some(std::io::ErrorKind::NotFound));
    assert_eq!(e.line, None);
    assert_eq!(e.key, None);
    assert!(
        e.to_string()
            .starts_with("/nonexistent/lb.toml: cannot read: "),
        "{e}"
    );
}

#[test]
fn toml_syntax() {
    let text = "[agent]\ninterface = \"eth0\"\nxdp_mode = auto # bare word\n";
    let e = error(text);
    assert_eq!(e.line, Some(3), "{e}");
    assert_eq!(e.key, None);
    assert!(e.message.starts_with("invalid TOML"), "{e}");
    let e = error("[[service]]\nname = \"a\"\nname = \"b\" # dup\n");
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("duplicate key"), "{e}");
}

#[test]
fn unknown_keys_list_the_allowed_ones() {
    check(
        "services = 1 # here\n",
        "# here",
        "services",
        &["unknown key", "did you mean `service`?", "agent, service"],
    );
    check(
        "[agent]\niface = \"eth0\" # here\n",
        "# here",
        "agent.iface",
        &["allowed here: interface, resolver, xdp_mode, api_listen, pin_path"],
    );
    check(
        &service("weight = 2 # here", ""),
        "# here",
        "service[0].weight",
        &["unknown key", "snat_ports", "backup_switch"],
    );
    check(
        &service("", "weigth = 2 # here"),
        "# here",
        "service[0].server[0].weigth",
        &[
            "did you mean `weight`?",
            "allowed here: address, weight, spare, backup, resolve, service",
        ],
    );
    check(
        &probe("type = \"http\"\nintervall = \"2s\" # here"),
        "# here",
        "service[0].probe[0].intervall",
        &["did you mean `interval`?", "expect_status", "max_response"],
    );
    check(
        &service("backup_switch = { permanant = true } # here", ""),
        "# here",
        "service[0].backup_switch.permanant",
        &["did you mean `permanent`?", "allowed here: permanent"],
    );
}

#[test]
fn wrong_types() {
    check(
        &service("", "weight = \"2\" # here"),
        "# here",
        "service[0].server[0].weight",
        &["must be an integer (got a string)"],
    );
    check(
        &service("fail_open = \"yes\" # here", ""),
        "# here",
        "service[0].fail_open",
        &["must be true or false (got a string)"],
    );
    check(
        &probe("type = \"tcp\"\ninterval = 5 # here"),
        "# here",
        "service[0].probe[0].interval",
        &["must be a string (got an integer)"],
    );
    check(
        "agent = 1 # here\n",
        "# here",
        "agent",
        &["must be a table (got an integer)"],
    );
    check(
        "service = \"web\" # here\n",
        "# here",
        "service",
        &["must be an array of tables (got a string)"],
    );
    check(
        "service = [1] # here\n",
        "# here",
        "service[0]",
        &["must be a table (got an integer)"],
    );
    check(
        &service("vip = 80", "").replace("vip = \"10.0.0.100:80\"\n", ""),
        "vip = 80",
        "service[0].vip",
        &["must be a string"],
    );
    check(
        &service("max_fails = 1.5 # here", ""),
        "# here",
        "service[0].max_fails",
        &["must be an integer (got a float)"],
    );
    check(
        &probe("type = \"http\"\nheaders = \"X: y\" # here"),
        "# here",
        "service[0].probe[0].headers",
        &["must be a table"],
    );
    check(
        &probe("type = \"http\"\nheaders = { X-A = 1 } # here"),
        "# here",
        "service[0].probe[0].headers.X-A",
        &["must be a string"],
    );
    check(
        &probe("type = \"http\"\nmax_body = true # here"),
        "# here",
        "service[0].probe[0].max_body",
        &["must be a size"],
    );
    check(
        &service("backup_switch = \"2m\" # here", ""),
        "# here",
        "service[0].backup_switch",
        &["{ permanent = \"2m\" }"],
    );
    check(
        &service("backup_switch = { permanent = 5 } # here", ""),
        "# here",
        "service[0].backup_switch.permanent",
        &["true, false or a duration"],
    );
    check(
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n[service.server] # here\naddress = \"10.0.1.11:80\"\n",
        "# here",
        "service[0].server",
        &["write [[service.server]] with double brackets"],
    );
    check(
        &service("", "backup = 1.0 # here"),
        "# here",
        "service[0].server[0].backup",
        &["\"prio\""],
    );
}

#[test]
fn bad_enum_values_list_the_allowed_ones() {
    check(
        "[agent]\nxdp_mode = \"fast\" # here\n",
        "# here",
        "agent.xdp_mode",
        &["one of \"auto\", \"native\", \"generic\" (got \"fast\")"],
    );
    check(
        &service("protocol = \"sctp\" # here", ""),
        "# here",
        "service[0].protocol",
        &["one of \"tcp\", \"udp\""],
    );
    check(
        &service("forwarding = \"dnat\" # here", ""),
        "# here",
        "service[0].forwarding",
        &["\"nat\", \"dsr\"", "did you mean \"nat\"?"],
    );
    check(
        &probe("type = \"https\" # here"),
        "# here",
        "service[0].probe[0].type",
        &["\"http\", \"tcp\", \"udp\", \"icmp\""],
    );
    check(
        &probe("type = \"tcp\"\nmode = \"sometimes\" # here"),
        "# here",
        "service[0].probe[0].mode",
        &["\"always\", \"idle\", \"onfail\""],
    );
    check(
        &service("protocol = 6 # here", ""),
        "# here",
        "service[0].protocol",
        &["must be one of \"tcp\", \"udp\" (got an integer)"],
    );
}

#[test]
fn missing_required_keys_point_at_the_table() {
    check(
        "[[service]] # here\nvip = \"10.0.0.100:80\"\n",
        "# here",
        "service[0].name",
        &["required key is missing"],
    );
    check(
        "[[service]] # here\nname = \"web\"\n",
        "# here",
        "service[0].vip",
        &["required key is missing", "10.0.0.100:80"],
    );
    check(
        &service("", "[[service.server]] # here\nweight = 2"),
        "# here",
        "service[0].server[1].address",
        &["required key is missing"],
    );
    check(
        &probe("name = \"x\""),
        "# probe0",
        "service[0].probe[0].type",
        &["required key is missing", "\"http\""],
    );
}

#[test]
fn services_need_servers() {
    check(
        "[[service]] # here\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n",
        "# here",
        "service[0].server",
        &["at least one [[service.server]]"],
    );
    check(
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\nserver = [] # here\n",
        "# here",
        "service[0].server",
        &["at least one server"],
    );
}

#[test]
fn duplicate_services() {
    let two = |second: &str| {
        format!(
            "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n\
             [[service.server]]\naddress = \"10.0.1.11:80\"\n\
             [[service]]\n{second}\nsnat_ip = \"10.0.0.2\"\n[[service.server]]\naddress = \"10.0.1.11:80\"\n"
        )
    };
    check(
        &two("name = \"web\" # here\nvip = \"10.0.0.101:80\""),
        "# here",
        "service[1].name",
        &["duplicate service name \"web\" (also service[0])"],
    );
    check(
        &two("name = \"web2\"\nvip = \"10.0.0.100:80\" # here"),
        "# here",
        "service[1].vip",
        &["10.0.0.100:80 tcp is already the VIP of service[0] (\"web\")"],
    );
}

#[test]
fn vip_rules() {
    let with_vip =
        |v: &str| service("", "").replace("vip = \"10.0.0.100:80\"", &format!("vip = {v} # here"));
    check(
        &with_vip("\"10.0.0.100\""),
        "# here",
        "service[0].vip",
        &["has no port", "\"IP:PORT\""],
    );
    check(
        &with_vip("\"10.0.0.100:0\""),
        "# here",
        "service[0].vip",
        &["port 0 is not allowed"],
    );
    check(
        &with_vip("\"10.0.0.100:65536\""),
        "# here",
        "service[0].vip",
        &["port 65536 is out of range (ports are 1..65535)"],
    );
    check(
        &with_vip("\"0.0.0.0:80\""),
        "# here",
        "service[0].vip",
        &["unicast"],
    );
    check(
        &with_vip("\"vip.example:80\""),
        "# here",
        "service[0].vip",
        &["is not an address"],
    );
}

#[test]
fn service_name_rules() {
    let named = |n: &str| service("", "").replace("name = \"web\"", &format!("name = {n} # here"));
    check(
        &named("\"\""),
        "# here",
        "service[0].name",
        &["is not a service name"],
    );
    check(
        &named("\"web/1\""),
        "# here",
        "service[0].name",
        &["letters, digits"],
    );
    check(
        &named(&format!("\"{}\"", "a".repeat(65))),
        "# here",
        "service[0].name",
        &["1..64"],
    );
}

#[test]
fn nat_needs_snat_ip_of_the_vip_family() {
    let no_snat = service("", "").replace("snat_ip = \"10.0.0.2\"\n", "");
    check(
        &no_snat,
        "# svc0",
        "service[0].snat_ip",
        &["forwarding = \"nat\" needs snat_ip", "IPv4"],
    );
    let v6 = service("", "").replace("snat_ip = \"10.0.0.2\"", "snat_ip = \"fd00::2\" # here");
    check(
        &v6,
        "# here",
        "service[0].snat_ip",
        &["must be of the VIP's family (IPv4 for 10.0.0.100:80), got fd00::2"],
    );
    let with_port =
        service("", "").replace("snat_ip = \"10.0.0.2\"", "snat_ip = \"10.0.0.2:1\" # here");
    check(
        &with_port,
        "# here",
        "service[0].snat_ip",
        &["not an IP address (no port)"],
    );
}

#[test]
fn snat_ips_rules() {
    let many = |list: &str| {
        service("", "").replace("snat_ip = \"10.0.0.2\"", &format!("snat_ips = {list}"))
    };
    check(
        &many("[\"10.0.0.2\", \"fd00::2\"] # here"),
        "# here",
        "service[0].snat_ips[1]",
        &["must be of the VIP's family (IPv4 for 10.0.0.100:80), got fd00::2"],
    );
    check(
        &many("[\"10.0.0.2\", \"10.0.0.2\"] # here"),
        "# here",
        "service[0].snat_ips[1]",
        &["10.0.0.2 is listed twice"],
    );
    check(
        &many("[] # here"),
        "# here",
        "service[0].snat_ips",
        &["must list 1 to 4 addresses (got 0)"],
    );
    check(
        &many("[\"10.0.0.2\", \"10.0.0.3\", \"10.0.0.4\", \"10.0.0.5\", \"10.0.0.6\"] # here"),
        "# here",
        "service[0].snat_ips",
        &["must list 1 to 4 addresses (got 5)"],
    );
    check(
        &service("snat_ips = [\"10.0.0.3\"] # here", ""),
        "# here",
        "service[0].snat_ips",
        &["snat_ip and snat_ips both given"],
    );
    check(
        &service("source_burst = 0 # here", ""),
        "# here",
        "service[0].source_burst",
        &["at least 1"],
    );
}

#[test]
fn maglev_size_must_be_one_of_the_table_sizes() {
    for bad in ["4100", "0", "65536", "\"big\""] {
        check(
            &service(&format!("maglev_size = {bad} # here"), ""),
            "# here",
            "service[0].maglev_size",
            &[if bad.starts_with('"') {
                "integer"
            } else {
                "must be one of [4099, 16411, 65537, 262147]"
            }],
        );
    }
}

#[test]
fn snat_ports_rules() {
    check(
        &service("snat_ports = \"29999-20000\" # here", ""),
        "# here",
        "service[0].snat_ports",
        &["is empty"],
    );
    check(
        &service("snat_ports = \"0-100\" # here", ""),
        "# here",
        "service[0].snat_ports",
        &["ports 1..65535"],
    );
    check(
        &service("snat_ports = \"20000-70000\" # here", ""),
        "# here",
        "service[0].snat_ports",
        &["ports 1..65535"],
    );
    check(
        &service("snat_ports = \"20000:29999\" # here", ""),
        "# here",
        "service[0].snat_ports",
        &["\"LOW-HIGH\""],
    );
}

#[test]
fn dsr_rules() {
    let dsr = |svc: &str, server: &str| {
        format!(
            "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nforwarding = \"dsr\"\n{svc}\n\
             [[service.server]]\naddress = {server}\n"
        )
    };
    check(
        &dsr("", "\"10.0.1.11:8080\" # here"),
        "# here",
        "service[0].server[0].address",
        &["server port must be the VIP's (80), got 8080"],
    );
    check(
        &dsr("", "\"app.example:8080\" # here"),
        "# here",
        "service[0].server[0].address",
        &["must be the VIP's (80)"],
    );
    check(
        &dsr("snat_ip = \"10.0.0.2\" # here", "\"10.0.1.11\""),
        "# here",
        "service[0].snat_ip",
        &["forwarding = \"nat\" only"],
    );
    check(
        &dsr("snat_ips = [\"10.0.0.2\"] # here", "\"10.0.1.11\""),
        "# here",
        "service[0].snat_ips",
        &["forwarding = \"nat\" only"],
    );
    check(
        &dsr("source_rate = 10 # here", "\"10.0.1.11\""),
        "# here",
        "service[0].source_rate",
        &["forwarding = \"nat\" only"],
    );
    check(
        &dsr("snat_ports = \"1-2\" # here", "\"10.0.1.11\""),
        "# here",
        "service[0].snat_ports",
        &["forwarding = \"nat\" only"],
    );
}

#[test]
fn tunnel_rules() {
    for forwarding in ["ipip", "gue"] {
        let tunnel = |svc: &str, server: &str| {
            format!(
                "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nforwarding = \"{forwarding}\"\n\
                 {svc}\n[[service.server]]\naddress = {server}\n"
            )
        };
        check(
            &tunnel("", "\"192.168.7.11:8080\" # here"),
            "# here",
            "service[0].server[0].address",
            &[
                &format!("forwarding = \"{forwarding}\" keeps the destination port"),
                "(80), got 8080",
            ],
        );
        check(
            &tunnel("snat_ip = \"10.0.0.2\" # here", "\"192.168.7.11\""),
            "# here",
            "service[0].snat_ip",
            &[
                "forwarding = \"nat\" only",
                &format!("{forwarding} keeps the client's source"),
            ],
        );
        check(
            &tunnel("snat_ports = \"1-2\" # here", "\"192.168.7.11\""),
            "# here",
            "service[0].snat_ports",
            &["forwarding = \"nat\" only"],
        );
    }
    for (bad, says) in [
        (
            "\"0.0.0.0\"",
            "0.0.0.0 is not a unicast address of this host",
        ),
        ("\"127.0.0.1\"", "127.0.0.1 is not a unicast address"),
        ("\"10.0.0.2:80\"", "not an IP address (no port)"),
    ] {
        check(
            &format!("[agent]\ntunnel_source = {bad} # here\n"),
            "# here",
            "agent.tunnel_source",
            &[says],
        );
    }
}

#[test]
fn mixed_families_rejected() {
    check(
        &service(
            "",
            "[[service.server]]\naddress = \"[fd00::11]:8080\" # here",
        ),
        "# here",
        "service[0].server[1].address",
        &[
            "an IPv6 server in a service whose VIP is IPv4",
            "mixed families",
        ],
    );
}

#[test]
fn server_address_rules() {
    let addr = |a: &str| service("", &format!("[[service.server]]\naddress = {a} # here"));
    check(
        &addr("\"10.0.1.12:0\""),
        "# here",
        "service[0].server[1].address",
        &["port 0 is not allowed"],
    );
    check(
        &addr("\"10.0.1.12:70000\""),
        "# here",
        "service[0].server[1].address",
        &["is not a port (1..65535)"],
    );
    check(
        &addr("\"10.0.1.300\""),
        "# here",
        "service[0].server[1].address",
        &["neither an IP address nor a host name"],
    );
    check(
        &addr("\"bad name\""),
        "# here",
        "service[0].server[1].address",
        &["is not allowed"],
    );
    check(
        &addr("\"10.0.1.11:8080\""),
        "# here",
        "service[0].server[1].address",
        &["duplicate server 10.0.1.11:8080 (also service[0].server[0])"],
    );
}

#[test]
fn weight_rules() {
    check(
        &service("", "weight = 0 # here"),
        "# here",
        "service[0].server[0].weight",
        &["must be at least 1 (got 0)"],
    );
    check(
        &service("", "weight = -3 # here"),
        "# here",
        "service[0].server[0].weight",
        &["must be at least 1 (got -3)"],
    );
    check(
        &service("", "weight = 10001 # here"),
        "# here",
        "service[0].server[0].weight",
        &["must be at most 10000 (got 10001)"],
    );
}

#[test]
fn resolve_and_backup_rules() {
    let srv = |lines: &str| service("", &format!("[[service.server]]\n{lines}"));
    check(
        &srv("address = \"10.0.1.12:80\"\nresolve = true # here"),
        "# here",
        "service[0].server[1].resolve",
        &["resolve = true needs a host name", "is an IP address"],
    );
    check(
        &srv("address = \"b.example\"\nbackup = \"prio\" # here"),
        "# here",
        "service[0].server[1].backup",
        &["backup = \"prio\" needs resolve = true and an SRV service"],
    );
    check(
        &srv("address = \"b.example\"\nresolve = true\nbackup = \"prio\" # here"),
        "# here",
        "service[0].server[1].backup",
        &["needs resolve = true and an SRV service"],
    );
    check(
        &srv("address = \"b.example\"\nservice = \"http\" # here"),
        "# here",
        "service[0].server[1].service",
        &["an SRV service needs resolve = true"],
    );
    check(
        &srv("address = \"b.example:80\" # here\nservice = \"http\"\nresolve = true"),
        "# here",
        "service[0].server[1].address",
        &["a port cannot be combined with service"],
    );
    check(
        &srv("address = \"b.example\"\nservice = \"bad name\" # here\nresolve = true"),
        "# here",
        "service[0].server[1].service",
        &["is not an SRV service"],
    );
    check(
        &srv("address = \"b.example\"\nbackup = \"first\" # here"),
        "# here",
        "service[0].server[1].backup",
        &["0 = primary", "\"prio\""],
    );
    check(
        &srv("address = \"b.example\"\nbackup = -1 # here"),
        "# here",
        "service[0].server[1].backup",
        &["at least 0"],
    );
    check(
        &srv("address = \"10.0.1.12:80\"\nbackup = 1\nspare = true # here"),
        "# here",
        "service[0].server[1].spare",
        &["spare servers belong to the primary group"],
    );
}

#[test]
fn passive_check_rules() {
    check(
        &service("max_unhealthy_percent = 101 # here", ""),
        "# here",
        "service[0].max_unhealthy_percent",
        &["at most 100 (got 101)"],
    );
    check(
        &service("max_unhealthy_percent = -1 # here", ""),
        "# here",
        "service[0].max_unhealthy_percent",
        &["at least 0"],
    );
    check(
        &service("max_fails = -1 # here", ""),
        "# here",
        "service[0].max_fails",
        &["at least 0 (got -1)"],
    );
    check(
        &service("fail_timeout = \"0s\" # here", ""),
        "# here",
        "service[0].fail_timeout",
        &["more than 0 while max_fails > 0"],
    );
    check(
        &service("fail_timeout = \"10\" # here", ""),
        "# here",
        "service[0].fail_timeout",
        &["is not a duration", "\"1m30s\""],
    );
    check(
        &service("backup_switch = { permanent = \"0s\" } # here", ""),
        "# here",
        "service[0].backup_switch.permanent",
        &["more than 0"],
    );
}

#[test]
fn agent_rules() {
    check(
        "[agent]\ninterface = \"a-very-long-interface-name\" # here\n",
        "# here",
        "agent.interface",
        &["1..15 bytes"],
    );
    check(
        "[agent]\ninterface = \"\" # here\n",
        "# here",
        "agent.interface",
        &["not an interface name"],
    );
    check(
        "[agent]\nresolver = \"dns.example\" # here\n",
        "# here",
        "agent.resolver",
        &["\"IP:PORT\""],
    );
    check(
        "[agent]\nresolver = \"10.0.0.53:0\" # here\n",
        "# here",
        "agent.resolver",
        &["port 0"],
    );
    check(
        "[agent]\napi_listen = \"127.0.0.1\" # here\n",
        "# here",
        "agent.api_listen",
        &["\"IP:PORT\"", "\"\" to disable"],
    );
    check(
        "[agent]\npin_path = \"bpf/lb\" # here\n",
        "# here",
        "agent.pin_path",
        &["absolute path"],
    );
}

#[test]
fn too_many_services() {
    let mut text = String::new();
    let max = lb_common::MAX_SERVICES;
    for i in 0..=max {
        text += &format!(
            "[[service]]\nname = \"s{i}\"\nvip = \"10.0.0.100:{}\"\nsnat_ip = \"10.0.0.2\"\n\
             [[service.server]]\naddress = \"10.0.1.11:80\"\n",
            1000 + i
        );
    }
    let e = error(&text);
    assert_eq!(e.key.as_deref(), Some("service"), "{e}");
    assert!(
        e.message.contains(&format!("at most {max} services")),
        "{e}"
    );
}
