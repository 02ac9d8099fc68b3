//! Config files that load: the DESIGN.md §7 example, every default, every accepted form.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lb_agent::config::*;

fn parse(text: &str) -> Config {
    match lb_agent::config::parse(text, Path::new("lb.toml")) {
        Ok(c) => c,
        Err(e) => panic!("expected the config to parse, got: {e}"),
    }
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A minimal valid service, with `extra` lines appended to `[[service]]` and `tail` after.
fn one_service(extra: &str, tail: &str) -> Config {
    parse(&format!(
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n{extra}\n\
         [[service.server]]\naddress = \"10.0.1.11:8080\"\n{tail}"
    ))
}

fn one_probe(lines: &str) -> ProbeConfig {
    let c = one_service("", &format!("[[service.probe]]\n{lines}"));
    c.services[0].probes[0].clone()
}

const DESIGN_EXAMPLE: &str = r#"
[agent]
interface = "eth0"             # NIC to attach to (CLI --interface overrides)
resolver = "10.0.0.53:53"      # DNS server for `resolve = true` servers (default: /etc/resolv.conf)
xdp_mode = "auto"              # auto | native | generic
api_listen = "127.0.0.1:9900"  # REST API and /metrics; "" disables
pin_path = "/sys/fs/bpf/lb"    # pinned maps: the agent restarts without dropping flows

[[service]]
name = "web"
vip = "10.0.0.100:80"
protocol = "tcp"               # tcp | udp
forwarding = "nat"             # nat | dsr
snat_ip = "10.0.0.2"           # nat: source address toward backends
max_fails = 1                  # passive; 0 turns passive checks off
fail_timeout = "10s"
max_unhealthy_percent = 100
fail_open = true
backup_switch = { permanent = "2m" }

[[service.server]]
address = "10.0.1.11:8080"
weight = 2

[[service.server]]
address = "10.0.1.12:8080"
spare = true

[[service.server]]
address = "10.0.2.21:8080"
backup = 1

[[service.server]]               # expands to the SRV records' targets
address = "backends.example"
service = "_http._tcp"
resolve = true
backup = "prio"                  # SRV priority = backup level

[[service.probe]]
name = "health"
type = "http"
uri = "/health"
interval = "2s"
timeout = "1s"
fails = 2
passes = 2
essential = true
"#;

#[test]
fn design_example_parses() {
    let c = parse(DESIGN_EXAMPLE);
    assert_eq!(
        c.agent,
        AgentConfig {
            interface: Some("eth0".into()),
            resolver: Some(sa("10.0.0.53:53")),
            xdp_mode: XdpMode::Auto,
            api_listen: Some(sa("127.0.0.1:9900")),
            pin_path: Some(PathBuf::from("/sys/fs/bpf/lb")),
            ..AgentConfig::default()
        }
    );
    assert_eq!(c.services.len(), 1);
    let s = &c.services[0];
    assert_eq!(s.name, "web");
    assert_eq!(s.vip, sa("10.0.0.100:80"));
    assert_eq!(s.protocol, Protocol::Tcp);
    assert_eq!(s.forwarding, Forwarding::Nat);
    assert_eq!(
        s.snat_ips,
        vec!["10.0.0.2".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(s.snat_ports, 1024..=32767);
    assert_eq!(
        (s.source_rate, s.source_burst),
        (
            lb_agent::config::DEFAULT_SOURCE_RATE,
            lb_agent::config::DEFAULT_SOURCE_BURST
        )
    );
    assert_eq!(s.max_fails, 1);
    assert_eq!(s.fail_timeout, Duration::from_secs(10));
    assert_eq!(s.max_unhealthy_percent, 100);
    assert!(s.fail_open);
    assert_eq!(
        s.backup_switch,
        BackupSwitch::RetryAfter(Duration::from_secs(120))
    );

    let expected_servers = vec![
        ServerConfig {
            weight: 2,
            ..ServerConfig::new(ServerAddress::Socket(sa("10.0.1.11:8080")))
        },
        ServerConfig {
            spare: true,
            ..ServerConfig::new(ServerAddress::Socket(sa("10.0.1.12:8080")))
        },
        ServerConfig {
            backup: BackupLevel::Level(1),
            ..ServerConfig::new(ServerAddress::Socket(sa("10.0.2.21:8080")))
        },
        ServerConfig {
            address: ServerAddress::Name {
                host: "backends.example".into(),
                port: None,
            },
            weight: 1,
            spare: false,
            backup: BackupLevel::Prio,
            resolve: true,
            service: Some("_http._tcp".into()),
        },
    ];
    assert_eq!(s.servers, expected_servers);

    let mut probe = ProbeConfig::new("health", ProbeKind::Http);
    probe.http.uri = "/health".into();
    probe.interval = Duration::from_secs(2);
    probe.timeout = Duration::from_secs(1);
    probe.fails = 2;
    probe.passes = 2;
    probe.essential = true;
    assert_eq!(s.probes, vec![probe]);

    let b = detection_bounds(&s.probes[0]);
    assert_eq!(
        b.detect_worst,
        Duration::from_secs(5),
        "2s + 2s + 1s: the second failing probe starts a tick after the first (TR7: 2 × (2s + 1s))"
    );
    assert_eq!(b.detect_fast, Duration::from_secs(4), "2 × 2s");
    assert_eq!(b.recover_min, Duration::from_secs(2), "(2 − 1) × 2s");
    assert_eq!(b.recover_max, Duration::from_secs(4), "2 × 2s");
    assert_eq!(warnings(&c), Vec::<String>::new());
}

#[test]
fn load_reads_a_file() {
    let dir = std::env::temp_dir().join(format!("lb-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lb.toml");
    std::fs::write(&path, DESIGN_EXAMPLE).unwrap();
    let loaded = load(&path).expect("the example loads from a file");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(loaded, parse(DESIGN_EXAMPLE));
}

#[test]
fn empty_file_has_agent_defaults_and_no_service() {
    let c = parse("");
    assert_eq!(c.agent, AgentConfig::default());
    assert_eq!(c.agent.interface, None);
    assert_eq!(c.agent.resolver, None);
    assert_eq!(c.agent.xdp_mode, XdpMode::Auto);
    assert_eq!(c.agent.api_listen, Some(sa("127.0.0.1:9900")));
    assert_eq!(c.agent.pin_path, Some(PathBuf::from("/sys/fs/bpf/lb")));
    assert!(c.services.is_empty());
    assert_eq!(
        warnings(&c),
        vec!["no [[service]] is configured: the agent will balance nothing".to_string()]
    );
}

#[test]
fn agent_forms() {
    let c = parse(
        "[agent]\napi_listen = \"\"\npin_path = \"\"\nxdp_mode = \"generic\"\nresolver = \"10.0.0.53\"",
    );
    assert_eq!(c.agent.api_listen, None);
    assert_eq!(c.agent.pin_path, None);
    assert_eq!(c.agent.xdp_mode, XdpMode::Generic);
    assert_eq!(
        c.agent.resolver,
        Some(sa("10.0.0.53:53")),
        "resolver port defaults to 53"
    );
    let c = parse(
        "[agent]\napi_listen = \"[::1]:0\"\nxdp_mode = \"native\"\nresolver = \"[fd00::53]:5353\"",
    );
    assert_eq!(
        c.agent.api_listen,
        Some(sa("[::1]:0")),
        "port 0 binds any free port"
    );
    assert_eq!(c.agent.xdp_mode, XdpMode::Native);
    assert_eq!(c.agent.resolver, Some(sa("[fd00::53]:5353")));
}

#[test]
fn service_defaults() {
    let c = one_service("", "");
    let s = &c.services[0];
    assert_eq!(s.protocol, Protocol::Tcp);
    assert_eq!(s.forwarding, Forwarding::Nat);
    assert_eq!(s.snat_ports, DEFAULT_SNAT_PORTS);
    assert_eq!(s.snat_ports, 1024..=32767);
    assert_eq!(s.max_fails, 3);
    assert_eq!(s.fail_timeout, Duration::from_secs(10));
    assert_eq!(s.max_unhealthy_percent, 100);
    assert!(s.fail_open);
    assert_eq!(s.backup_switch, BackupSwitch::TryPrimaryEachFlow);
    assert!(s.probes.is_empty());
    assert_eq!(
        s.servers,
        vec![ServerConfig::new(ServerAddress::Socket(sa(
            "10.0.1.11:8080"
        )))]
    );
}

#[test]
fn server_defaults() {
    let s = &one_service("", "").services[0].servers[0];
    assert_eq!(s.weight, 1);
    assert!(!s.spare);
    assert_eq!(s.backup, BackupLevel::Level(0));
    assert!(!s.resolve);
    assert_eq!(s.service, None);
}

#[test]
fn several_snat_addresses_and_the_source_limit() {
    let c = parse(
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\n\
         snat_ips = [\"10.0.0.2\", \"10.0.0.3\", \"10.0.0.4\"]\n\
         source_rate = 50\nsource_burst = 75\n\
         [[service.server]]\naddress = \"10.0.1.11:8080\"\n",
    );
    let s = &c.services[0];
    let ips: Vec<std::net::IpAddr> = ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    assert_eq!(s.snat_ips, ips);
    assert_eq!((s.source_rate, s.source_burst), (50, 75));
    let off = one_service("source_rate = 0", "");
    assert_eq!(off.services[0].source_rate, 0, "0 turns the limit off");
}

#[test]
fn maglev_size_is_chosen_by_default_or_configured() {
    let default = one_service("", "");
    assert_eq!(default.services[0].maglev_size, None, "by server count");
    let fixed = one_service("maglev_size = 262147", "");
    assert_eq!(fixed.services[0].maglev_size, Some(262147));
}

#[test]
fn service_forms() {
    let c = one_service(
        "protocol = \"udp\"\nsnat_ports = \"40000-40999\"\nmax_fails = 0\nfail_timeout = \"0\"\n\
         max_unhealthy_percent = 0\nfail_open = false\nbackup_switch = { permanent = true }",
        "",
    );
    let s = &c.services[0];
    assert_eq!(s.protocol, Protocol::Udp);
    assert_eq!(s.snat_ports, 40000..=40999);
    assert_eq!(s.max_fails, 0);
    assert_eq!(
        s.fail_timeout,
        Duration::ZERO,
        "0 is fine while passive checks are off"
    );
    assert_eq!(s.max_unhealthy_percent, 0);
    assert!(!s.fail_open);
    assert_eq!(s.backup_switch, BackupSwitch::Permanent);

    let c = one_service(
        "snat_ports = \"25000\"\nbackup_switch = { permanent = false }",
        "",
    );
    assert_eq!(c.services[0].snat_ports, 25000..=25000);
    assert_eq!(
        c.services[0].backup_switch,
        BackupSwitch::TryPrimaryEachFlow
    );
    let c = one_service("backup_switch = {}", "");
    assert_eq!(
        c.services[0].backup_switch,
        BackupSwitch::TryPrimaryEachFlow
    );
    let c = one_service("[service.backup_switch]\npermanent = \"1m30s\"", "");
    assert_eq!(
        c.services[0].backup_switch,
        BackupSwitch::RetryAfter(Duration::from_secs(90))
    );
}

#[test]
fn dsr_service() {
    let c = parse(
        "[[service]]\nname = \"dns\"\nvip = \"10.0.0.53:53\"\nprotocol = \"udp\"\nforwarding = \"dsr\"\n\
         [[service.server]]\naddress = \"10.0.1.1:53\"\n[[service.server]]\naddress = \"10.0.1.2\"\n\
         [[service.server]]\naddress = \"ns.example\"\n",
    );
    let s = &c.services[0];
    assert_eq!(s.forwarding, Forwarding::Dsr);
    assert!(s.snat_ips.is_empty());
    assert_eq!(
        s.servers[0].address,
        ServerAddress::Socket(sa("10.0.1.1:53"))
    );
    assert_eq!(
        s.servers[1].address,
        ServerAddress::Socket(sa("10.0.1.2:53")),
        "port omitted → VIP port"
    );
    assert_eq!(
        s.servers[2].address,
        ServerAddress::Name {
            host: "ns.example".into(),
            port: Some(53)
        }
    );
}

#[test]
fn ipv6_service() {
    let c = parse(
        "[[service]]\nname = \"v6\"\nvip = \"[fd00::100]:443\"\nsnat_ip = \"fd00::2\"\n\
         [[service.server]]\naddress = \"[fd00:1::11]:8443\"\n[[service.server]]\naddress = \"fd00:1::12\"\n",
    );
    let s = &c.services[0];
    assert_eq!(s.vip, sa("[fd00::100]:443"));
    assert_eq!(
        s.servers[0].address,
        ServerAddress::Socket(sa("[fd00:1::11]:8443"))
    );
    assert_eq!(
        s.servers[1].address,
        ServerAddress::Socket(sa("[fd00:1::12]:443"))
    );
}

#[test]
fn server_forms() {
    let c = one_service(
        "",
        "[[service.server]]\naddress = \"10.0.1.12\"\nweight = 10000\n\
         [[service.server]]\naddress = \"app.example:9000\"\nbackup = true\n\
         [[service.server]]\naddress = \"app.example\"\nbackup = 3\n\
         [[service.server]]\naddress = \"pool.example\"\nresolve = true\n\
         [[service.server]]\naddress = \"srv.example\"\nresolve = true\nservice = \"http\"\nbackup = 2\n\
         [[service.server]]\naddress = \"srv2.example\"\nresolve = true\nservice = \"_x._udp\"\nbackup = false\n",
    );
    let s = &c.services[0].servers;
    assert_eq!(
        s[1].address,
        ServerAddress::Socket(sa("10.0.1.12:80")),
        "port omitted → VIP port"
    );
    assert_eq!(s[1].weight, 10000);
    assert_eq!(
        s[2].address,
        ServerAddress::Name {
            host: "app.example".into(),
            port: Some(9000)
        }
    );
    assert_eq!(
        s[2].backup,
        BackupLevel::Level(1),
        "backup = true is level 1"
    );
    assert_eq!(
        s[3].address,
        ServerAddress::Name {
            host: "app.example".into(),
            port: Some(80)
        }
    );
    assert_eq!(s[3].backup, BackupLevel::Level(3));
    assert!(s[4].resolve);
    assert_eq!(s[4].service, None);
    assert_eq!(
        s[5].service.as_deref(),
        Some("_http._tcp"),
        "a bare SRV name gets _NAME._PROTO"
    );
    assert_eq!(
        s[5].address,
        ServerAddress::Name {
            host: "srv.example".into(),
            port: None
        },
        "SRV gives ports"
    );
    assert_eq!(s[5].backup, BackupLevel::Level(2));
    assert_eq!(s[6].service.as_deref(), Some("_x._udp"));
    assert_eq!(s[6].backup, BackupLevel::Level(0));
    assert_eq!(s[2].address.to_string(), "app.example:9000");
    assert_eq!(s[5].address.to_string(), "srv.example");
    assert_eq!(s[1].address.to_string(), "10.0.1.12:80");
}

#[test]
fn udp_srv_name_gets_udp() {
    let c = parse(
        "[[service]]\nname = \"dns\"\nvip = \"10.0.0.53:53\"\nprotocol = \"udp\"\nsnat_ip = \"10.0.0.2\"\n\
         [[service.server]]\naddress = \"ns.example\"\nresolve = true\nservice = \"dns\"\n",
    );
    assert_eq!(
        c.services[0].servers[0].service.as_deref(),
        Some("_dns._udp")
    );
}

#[test]
fn servers_and_probes_as_inline_arrays() {
    let c = parse(
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n\
         server = [{ address = \"10.0.1.11:8080\" }, { address = \"10.0.1.12:8080\", weight = 3 }]\n\
         probe = [{ type = \"tcp\" }]\n",
    );
    assert_eq!(c.services[0].servers.len(), 2);
    assert_eq!(c.services[0].servers[1].weight, 3);
    assert_eq!(c.services[0].probes[0].kind, ProbeKind::Tcp);
}

#[test]
fn probe_defaults() {
    let p = one_probe("type = \"http\"");
    assert_eq!(
        p,
        ProbeConfig::new("http", ProbeKind::Http),
        "the name defaults to the type"
    );
    assert_eq!(p.port, None);
    assert_eq!(p.interval, Duration::from_secs(5));
    assert_eq!(p.timeout, Duration::from_secs(1));
    assert_eq!(p.fails, 1);
    assert_eq!(p.passes, 1);
    assert!(!p.essential);
    assert!(!p.persistent);
    assert_eq!(p.mode, ProbeMode::Always);
    assert_eq!(p.jitter, Duration::ZERO);
    assert_eq!(p.send, None);
    assert!(p.expect.is_none());
    assert_eq!(p.max_response, 256 * 1024);
    let h = &p.http;
    assert_eq!(h.uri, "/");
    assert_eq!(h.method, "GET");
    assert!(h.headers.is_empty());
    assert_eq!(h.host, None);
    assert!(!h.tls);
    assert_eq!(h.sni, None);
    assert!(h.verify);
    assert_eq!(h.expect_status, vec![200..=299]);
    assert!(h.expect_body.is_none());
    assert_eq!(h.max_body, 256 * 1024);

    for (ty, kind) in [
        ("tcp", ProbeKind::Tcp),
        ("udp", ProbeKind::Udp),
        ("icmp", ProbeKind::Icmp),
    ] {
        assert_eq!(
            one_probe(&format!("type = \"{ty}\"")),
            ProbeConfig::new(ty, kind)
        );
    }
}

#[test]
fn http_probe_every_key() {
    let p = one_probe(
        r#"name = "deep"
type = "http"
port = 8081
interval = "500ms"
timeout = "250ms"
fails = 3
passes = 4
essential = true
persistent = true
mode = "idle"
jitter = "100ms"
uri = "/health?full=1"
method = "OPTIONS"
headers = { "X-Probe" = "lb", Authorization = "Bearer t" }
host = "app.example"
tls = true
sni = "app.example"
verify = false
expect_status = [200, "301-302", "2xx"]
expect_body = "^ok"
max_body = "1m"
"#,
    );
    assert_eq!(p.name, "deep");
    assert_eq!(p.port, Some(8081));
    assert_eq!(p.interval, Duration::from_millis(500));
    assert_eq!(p.timeout, Duration::from_millis(250));
    assert_eq!((p.fails, p.passes), (3, 4));
    assert!(p.essential && p.persistent);
    assert_eq!(p.mode, ProbeMode::Idle);
    assert_eq!(p.jitter, Duration::from_millis(100));
    let h = &p.http;
    assert_eq!(h.uri, "/health?full=1");
    assert_eq!(h.method, "OPTIONS");
    assert_eq!(
        h.headers,
        vec![
            ("X-Probe".to_string(), "lb".to_string()),
            ("Authorization".to_string(), "Bearer t".to_string())
        ]
    );
    assert_eq!(h.host.as_deref(), Some("app.example"));
    assert!(h.tls);
    assert_eq!(h.sni.as_deref(), Some("app.example"));
    assert!(!h.verify);
    assert_eq!(h.expect_status, vec![200..=200, 301..=302, 200..=299]);
    assert!(h.expect_body.as_ref().unwrap().is_match("ok then"));
    assert_eq!(h.max_body, 1 << 20);

    let p = one_probe("type = \"http\"\nexpect_status = 204\nmax_body = 4096");
    assert_eq!(p.http.expect_status, vec![204..=204]);
    assert_eq!(p.http.max_body, 4096);
    let p = one_probe("type = \"http\"\nexpect_status = \"2xx\"\nmode = \"onfail\"");
    assert_eq!(p.http.expect_status, vec![200..=299]);
    assert_eq!(p.mode, ProbeMode::Onfail);
}

#[test]
fn stream_probe_keys_and_escapes() {
    let p = one_probe(
        "type = \"tcp\"\nsend = 'GET / HTTP/1.0\\r\\n\\r\\n'\nexpect = \"^HTTP/1\\\\.[01] 200\"\nmax_response = \"512k\"",
    );
    assert_eq!(p.send.as_deref(), Some(&b"GET / HTTP/1.0\r\n\r\n"[..]));
    assert!(p.expect.as_ref().unwrap().is_match("HTTP/1.0 200 OK"));
    assert_eq!(p.max_response, 512 * 1024);

    let p = one_probe("type = \"udp\"\nsend = '\\x00\\x01ping\\t\\\\'\nmax_response = 0");
    assert_eq!(p.send.as_deref(), Some(&b"\x00\x01ping\t\\"[..]));
    assert_eq!(p.max_response, 0);

    // A TOML basic string has already decoded \r\n; the bytes pass through.
    let p = one_probe("type = \"tcp\"\nsend = \"PING\\r\\n\"");
    assert_eq!(p.send.as_deref(), Some(&b"PING\r\n"[..]));
}

#[test]
fn several_services_and_probes() {
    let c = parse(
        "[[service]]\nname = \"a\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n\
         [[service.server]]\naddress = \"10.0.1.11:80\"\n\
         [[service.probe]]\ntype = \"http\"\n[[service.probe]]\ntype = \"tcp\"\n\
         [[service]]\nname = \"b\"\nvip = \"10.0.0.100:80\"\nprotocol = \"udp\"\nsnat_ip = \"10.0.0.2\"\nsnat_ports = \"30000-39999\"\n\
         [[service.server]]\naddress = \"10.0.1.11:80\"\n",
    );
    assert_eq!(c.services.len(), 2);
    assert_eq!(
        c.services[0]
            .probes
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        ["http", "tcp"]
    );
    assert_eq!(
        c.services[1].protocol,
        Protocol::Udp,
        "same VIP, another protocol"
    );
    assert_eq!(
        c.services[1].servers[0].address,
        ServerAddress::Socket(sa("10.0.1.11:80"))
    );
}

#[test]
fn enum_names_round_trip() {
    assert_eq!(XdpMode::Generic.to_string(), "generic");
    assert_eq!(Protocol::Udp.as_str(), "udp");
    assert_eq!(Protocol::Tcp.ip_proto(), 6);
    assert_eq!(Protocol::Udp.ip_proto(), 17);
    assert_eq!(Forwarding::Dsr.to_string(), "dsr");
    assert_eq!(ProbeKind::Icmp.to_string(), "icmp");
    assert_eq!(ProbeMode::Onfail.to_string(), "onfail");
}

#[test]
fn detection_bounds_follow_tr7() {
    let mut p = ProbeConfig::new("p", ProbeKind::Tcp);
    let b = detection_bounds(&p);
    assert_eq!(b.detect_worst, Duration::from_secs(6), "1 × (5s + 1s)");
    assert_eq!(b.detect_fast, Duration::from_secs(5));
    assert_eq!(b.recover_min, Duration::ZERO, "(1 − 1) × 5s");
    assert_eq!(b.recover_max, Duration::from_secs(5));
    // TR7's "slow service" row: P=5, T=10, RF=3 gives 45 s there; as the scheduler runs
    // it, the first failing probe starts within 5s and each ends its 10s timeout before
    // the next starts: 5 + 2 × 10 + 10 = 35 s before propagation.
    p.fails = 3;
    p.passes = 3;
    p.timeout = Duration::from_secs(10);
    let b = detection_bounds(&p);
    assert_eq!(b.detect_worst, Duration::from_secs(35));
    assert_eq!(b.recover_min, Duration::from_secs(10));
    assert_eq!(
        b.recover_max,
        Duration::from_secs(20),
        "timeout > interval: the failing probe in flight at the recovery ends at its 10s \
         timeout, then 2 more passes 5s apart (TR7's 3 × 5s leaves it out)"
    );
    p.jitter = Duration::from_secs(1);
    let b = detection_bounds(&p);
    assert_eq!(
        b.detect_worst,
        Duration::from_secs(36),
        "jitter lengthens the wait for the first failing probe: 6 + 2 × 10 + 10"
    );
    // Long intervals: the probes keep their ticks, so the timeout counts once:
    // 60 + 9 × 60 + 59 s, where TR7's formula gives 10 × (60 + 59) s.
    let mut long = ProbeConfig::new("p", ProbeKind::Http);
    long.interval = Duration::from_secs(60);
    long.timeout = Duration::from_secs(59);
    long.fails = 10;
    assert_eq!(
        detection_bounds(&long).detect_worst,
        Duration::from_secs(659)
    );
    assert_eq!(
        b.recover_min,
        Duration::from_secs(10),
        "jitter never shortens a wait"
    );
    assert_eq!(
        b.recover_max,
        Duration::from_secs(22),
        "max(6s, 10s) + 2 × 6s"
    );
    // Below the scheduler's 1 ms, bounds use 1 ms.
    let mut p = ProbeConfig::new("p", ProbeKind::Icmp);
    p.interval = Duration::from_micros(100);
    p.timeout = Duration::from_micros(50);
    p.passes = 2;
    let b = detection_bounds(&p);
    assert_eq!(b.detect_fast, Duration::from_millis(1));
    assert_eq!(b.recover_min, Duration::from_millis(1));
    assert_eq!(b.recover_max, Duration::from_millis(2));
}

#[test]
fn max_fails_with_nothing_to_count_is_warned() {
    let w = warnings(&one_service("protocol = \"udp\"\nmax_fails = 3", ""));
    assert!(
        w.iter().any(|w| w.starts_with(
            "service[0] (\"web\"): max_fails = 3 counts only ICMP unreachables from the server"
        )),
        "udp + nat sees the server's ICMP unreachables, nothing else: {w:#?}"
    );
    let udp_dsr = parse(
        "[[service]]\nname = \"dns\"\nvip = \"10.0.0.100:53\"\nprotocol = \"udp\"\n\
         forwarding = \"dsr\"\nmax_fails = 2\n[[service.server]]\naddress = \"10.0.1.11:53\"\n",
    );
    assert!(
        warnings(&udp_dsr).iter().any(|w| w.starts_with(
            "service[0] (\"dns\"): max_fails = 2 has nothing to count: a udp service with forwarding = \"dsr\""
        )),
        "{:#?}",
        warnings(&udp_dsr)
    );
    let w = warnings(&one_service("protocol = \"udp\"\nmax_fails = 0", ""));
    assert!(
        !w.iter().any(|w| w.contains("max_fails = 3")),
        "max_fails = 0 asks for nothing: {w:#?}"
    );
    let dsr = |extra: &str| {
        parse(&format!(
            "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nforwarding = \"dsr\"\n{extra}\n\
             [[service.server]]\naddress = \"10.0.1.11:80\"\n"
        ))
    };
    let w = warnings(&dsr("max_fails = 3"));
    assert!(
        w.iter()
            .any(|w| w.contains("only client SYN retransmissions count")),
        "{w:#?}"
    );
    let w = warnings(&dsr(""));
    assert!(
        !w.iter().any(|w| w.contains("max_fails")),
        "the default max_fails is no warning (the passive line says what it counts): {w:#?}"
    );
    let w = warnings(&one_service("", ""));
    assert!(
        !w.iter().any(|w| w.contains("max_fails")),
        "tcp nat sees every passive signal: {w:#?}"
    );
}

#[test]
fn warnings_for_suspicious_configs() {
    let probes = "[[service.probe]]\nname = \"slow\"\ntype = \"tcp\"\ninterval = \"1s\"\ntimeout = \"2s\"\n\
                  [[service.probe]]\nname = \"ping\"\ntype = \"icmp\"\nport = 80\njitter = \"10s\"\n\
                  [[service.probe]]\nname = \"u\"\ntype = \"udp\"\n\
                  [[service.probe]]\nname = \"h\"\ntype = \"http\"\nsni = \"a.example\"\n";
    let w = warnings(&one_service("max_unhealthy_percent = 0", probes));
    let expect = [
        "service[0] (\"web\"): max_unhealthy_percent = 0",
        "service[0].probe[0] (\"slow\"): timeout 2s > interval 1s",
        "service[0].probe[1] (\"ping\"): jitter 10s >= interval 5s",
        "service[0].probe[1] (\"ping\"): port is ignored by icmp probes",
        "service[0].probe[2] (\"u\"): a udp probe without expect or test passes on silence",
        "service[0].probe[3] (\"h\"): sni is ignored without tls = true",
    ];
    assert_eq!(w.len(), expect.len(), "{w:#?}");
    for (got, want) in w.iter().zip(expect) {
        assert!(
            got.starts_with(want),
            "expected a warning starting with {want:?}, got {got:?}"
        );
    }

    let w = warnings(&one_service("max_fails = 0", ""));
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(w[0].contains("nothing checks the servers' health"), "{w:?}");

    let w = warnings(&one_service(
        "max_fails = 0",
        "[[service.probe]]\ntype = \"tcp\"\nmode = \"onfail\"",
    ));
    assert!(
        w.iter()
            .any(|w| w.contains("nothing notices a server failing")),
        "{w:?}"
    );

    let c = parse(
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n\
         [[service.server]]\naddress = \"10.0.1.11:80\"\nspare = true\n\
         [[service]]\nname = \"b\"\nvip = \"10.0.0.101:80\"\nsnat_ip = \"10.0.0.2\"\nsnat_ports = \"29000-30000\"\n\
         [[service.server]]\naddress = \"10.0.1.12:80\"\nbackup = 1\n",
    );
    let w = warnings(&c);
    assert!(
        w.iter()
            .any(|w| w.starts_with("service[0] (\"web\"): every primary server is a spare")),
        "{w:?}"
    );
    assert!(
        w.iter()
            .any(|w| w.starts_with("service[0] (\"web\"): shares snat_ip 10.0.0.2")),
        "{w:?}"
    );
    assert!(
        w.iter()
            .any(|w| w.starts_with("service[1] (\"b\"): no primary server")),
        "{w:?}"
    );
}

fn tunnel_service(forwarding: &str, agent: &str) -> Config {
    parse(&format!(
        "[agent]\n{agent}\n[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\n\
         forwarding = \"{forwarding}\"\n[[service.server]]\naddress = \"192.168.7.11\"\n"
    ))
}

#[test]
fn a_tunnel_service_is_warned_of_its_mtu_cost_and_keeps_the_vip_port() {
    for (forwarding, v4, v6) in [("ipip", 20, 40), ("gue", 28, 48)] {
        let c = tunnel_service(forwarding, "tunnel_source = \"10.0.0.2\"");
        assert_eq!(c.services[0].forwarding.to_string(), forwarding);
        assert!(c.services[0].forwarding.is_tunnel());
        assert!(c.services[0].snat_ips.is_empty(), "no source translation");
        assert_eq!(
            c.services[0].servers[0].address.port(),
            Some(80),
            "the VIP's port"
        );
        assert_eq!(c.agent.tunnel_source, Some("10.0.0.2".parse().unwrap()));
        assert!(
            c.services[0].probes.is_empty(),
            "{forwarding}: no probe configured"
        );
        let w = warnings(&c);
        assert!(
            w.iter().any(|l| l.contains(&format!("adds {v4} bytes"))
                && l.contains(&format!("({v6} toward IPv6)"))
                && l.contains("tx_icmp_too_big")),
            "{forwarding}: {w:?}"
        );
    }
}

#[test]
fn an_icmp_probe_of_a_tunnel_service_goes_through_the_tunnel_to_the_vip() {
    let text = |forwarding: &str| {
        format!(
            "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nforwarding = \"{forwarding}\"\n\
             [[service.server]]\naddress = \"192.168.7.11\"\n\
             [[service.probe]]\ntype = \"icmp\"\n[[service.probe]]\ntype = \"tcp\"\n"
        )
    };
    for (forwarding, gue) in [("ipip", false), ("gue", true)] {
        let c = parse(&text(forwarding));
        let probes = &c.services[0].probes;
        assert_eq!(
            probes[0].tunnel,
            Some(lb_agent::config::TunnelProbe {
                vip: "10.0.0.100".parse().unwrap(),
                gue
            }),
            "{forwarding}: the icmp probe"
        );
        assert_eq!(
            probes[1].tunnel, None,
            "{forwarding}: the tcp probe goes direct"
        );
    }
    let c = parse(&text("dsr"));
    assert_eq!(c.services[0].probes[0].tunnel, None, "dsr: direct");
}

/// Values a reference treats as a mistake (TR7 applies 1 s to a Period or Timeout of
/// 120 s or more), values the scheduler clamps, and probes that check less than they
/// seem: valid, each with a warning that names the probe and the consequence.
#[test]
fn absurd_and_hollow_values_are_warned() {
    let probes = "[[service.probe]]\nname = \"decade\"\ntype = \"icmp\"\ninterval = \"3650d\"\ntimeout = \"200d\"\nfails = 4294967295\n\
                  [[service.probe]]\nname = \"fast\"\ntype = \"icmp\"\ninterval = \"0.0001s\"\ntimeout = \"0.00005s\"\npasses = 11\n\
                  [[service.probe]]\nname = \"dns\"\ntype = \"udp\"\nexpect = \"ok\"\n";
    let w = warnings(&one_service("fail_timeout = \"365d\"", probes));
    let expect = [
        "service[0] (\"web\"): fail_timeout 8760h is 2m or more",
        "service[0].probe[0] (\"decade\"): interval 87600h is 2m or more, which TR7 takes for a mistake (it applies 1s)",
        "service[0].probe[0] (\"decade\"): timeout 4800h is 2m or more",
        "service[0].probe[0] (\"decade\"): fails = 4294967295 (Azure allows at most 10)",
        "service[0].probe[1] (\"fast\"): interval 100us is below 1ms: the scheduler probes at most every 1ms",
        "service[0].probe[1] (\"fast\"): timeout 50us is below 1ms",
        "service[0].probe[1] (\"fast\"): passes = 11: a recovered server waits at least 10ms",
        "service[0].probe[2] (\"dns\"): a udp probe with expect but no send sends an empty datagram",
    ];
    for (got, want) in w.iter().zip(expect) {
        assert!(
            got.starts_with(want),
            "expected a warning starting with {want:?}, got {got:?}\n{w:#?}"
        );
    }
    assert_eq!(w.len(), expect.len(), "{w:#?}");
    // Bounds use the clamped 1 ms, as the scheduler runs the probe.
    let c = one_service("", probes);
    let b = detection_bounds(&c.services[0].probes[1]);
    assert_eq!(b.detect_worst, Duration::from_millis(2));
    assert_eq!(b.recover_min, Duration::from_millis(10));
    // Ordinary values warn about nothing of this.
    let w = warnings(&one_service(
        "fail_timeout = \"119s\"",
        "[[service.probe]]\ntype = \"http\"\ninterval = \"119s\"\ntimeout = \"1s\"\nfails = 10\npasses = 10\n",
    ));
    assert!(w.is_empty(), "{w:#?}");
}
