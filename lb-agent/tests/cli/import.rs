//! `lb-agent import`, as an operator runs it: every keepalived sample configuration that
//! Debian's `keepalived` package ships with a `virtual_server` (`cargo xtask test`
//! installs it) and the upstream examples of the nginx and Angie ADC documentation are
//! converted, and each output passes the real `lb-agent check-config`; the notes name
//! what lb does instead of the directives it has no equivalent for, and a file that does
//! not parse is refused with its line.

use std::{
    io::Write,
    path::Path,
    process::{Command, Output, Stdio},
};

const SAMPLES: &str = "/usr/share/doc/keepalived/samples";

fn lb_agent(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lb-agent"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lb-agent runs");
    let mut input = child.stdin.take().expect("piped");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("writing stdin");
    }
    drop(input);
    child.wait_with_output().expect("lb-agent exits")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `lb-agent import FORMAT FILE`, then `check-config` on its output; the output.
fn import_and_check(format: &str, file: &Path) -> String {
    let out = lb_agent(&["import", format, &file.to_string_lossy()], None);
    assert!(
        out.status.success(),
        "import {format} {}: {}\n{}",
        file.display(),
        out.status,
        text(&out.stderr)
    );
    let converted = text(&out.stdout);
    let check = lb_agent(&["check-config", "/dev/stdin"], Some(&converted));
    assert!(
        check.status.success() && text(&check.stdout).starts_with("/dev/stdin: valid"),
        "check-config refuses the conversion of {}:\n{}{}\n--- converted:\n{converted}",
        file.display(),
        text(&check.stdout),
        text(&check.stderr)
    );
    converted
}

/// The output with each wrapped note on one line, to search notes in.
fn unwrapped(converted: &str) -> String {
    converted.replace("\n#   ", " ")
}

fn services(converted: &str) -> usize {
    converted.matches("\n[[service]]\n").count()
}

#[test]
fn keepalived_samples_convert_into_configs_check_config_accepts() {
    let dir = Path::new(SAMPLES);
    let mut samples: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| {
            panic!("{SAMPLES}: {e}: Debian's keepalived package (`cargo xtask test` installs it)")
        })
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            std::fs::read_to_string(p).is_ok_and(|t| {
                t.lines()
                    .any(|l| l.trim_start().starts_with("virtual_server "))
            })
        })
        .collect();
    samples.sort();
    assert!(samples.len() >= 10, "too few samples: {samples:?}");
    let mut converted = std::collections::BTreeMap::new();
    for sample in &samples {
        let out = import_and_check("keepalived", sample);
        let name = sample.file_name().unwrap().to_string_lossy().into_owned();
        eprintln!("{name}: {} services", services(&out));
        converted.insert(name, out);
    }
    let with_services = converted.values().filter(|c| services(c) > 0).count();
    assert!(
        with_services >= samples.len() - 1,
        "only the fwmark sample may convert to no service"
    );
    // What each sample shows, as the output says it.
    for (sample, wants) in [
        (
            "keepalived.conf.sample",
            &[
                "sorry_server: a backup server",
                "backup = 1",
                "uri = \"/testurl3/test.jsp\"",
                "fails = 4",
                "digest: lb does not hash the body",
                "vrrp_instance VI_1: VRRP is not lb's",
            ][..],
        ),
        (
            "keepalived.conf.quorum",
            &[
                "quorum 7: lb has no quorum",
                "hysteresis 2: lb has no quorum",
                "alpha: a server takes traffic only once its checks pass",
                "essential = true",
                "port = 80",
            ],
        ),
        (
            "keepalived.conf.inhibit",
            &["inhibit_on_failure: lb takes a failed server out"],
        ),
        (
            "keepalived.conf.misc_check",
            &["MISC_CHECK: no equivalent: lb runs no check scripts"],
        ),
        ("keepalived.conf.SSL_GET", &["tls = true", "verify = false"]),
        (
            "keepalived.conf.status_code",
            &[
                "expect_status = [\"200-299\", \"400-499\", \"503\", \"505\"]",
                "name = \"http-2\"",
            ],
        ),
        (
            "keepalived.conf.fwmark",
            &["virtual_server fwmark 1: lb balances VIP:port services"],
        ),
        ("keepalived.conf.PING_CHECK", &["type = \"icmp\""]),
        (
            "keepalived.conf.UDP_CHECK",
            &["protocol = \"udp\"", "type = \"udp\""],
        ),
        (
            "keepalived.conf.SMTP_CHECK",
            &["expect = \"^220\"", "SMTP_CHECK: a tcp probe"],
        ),
        (
            "keepalived.conf.virtual_server_group",
            &[
                "virtual_server_group VSG_1: fwmark 1",
                "vip = \"192.168.200.10:80\"",
                "the VIP's own address: lb cannot forward to it",
            ],
        ),
        (
            "keepalived.conf.IPv6",
            &["vip = \"[ae00::1]:80\"", "snat_ip = \"ae00::1\""],
        ),
    ] {
        let out = converted
            .get(sample)
            .unwrap_or_else(|| panic!("{sample} is not among the samples"));
        for want in wants {
            assert!(
                unwrapped(out).contains(want),
                "{sample}: {want:?} not in:\n{out}"
            );
        }
    }
}

/// Examples of the nginx and Angie ADC documentation's upstream pages, as written there
/// (a `listen ...;` placeholder of the docs kept as it is).
const DOC_EXAMPLES: &[(&str, &str, &[&str])] = &[
    (
        // https://nginx.org/en/docs/http/ngx_http_upstream_module.html, "Example
        // Configuration".
        "nginx http upstream",
        "upstream backend {
    server backend1.example.com       weight=5;
    server backend2.example.com:8080;
    server unix:/tmp/backend3;

    server backup1.example.com:8080   backup;
    server backup2.example.com:8080   backup;
}

server {
    location / {
        proxy_pass http://backend;
    }
}
",
        &[
            "address = \"backend1.example.com:80\"\nweight = 5\n",
            "address = \"backup1.example.com:8080\"\nbackup = 1\n",
            "server unix:/tmp/backend3: lb forwards to IP addresses only",
            "its server block has no listen; the VIP 192.0.2.1:80 is a placeholder",
            "max_fails = 1\nfail_timeout = \"10s\"\n",
        ],
    ),
    (
        // https://nginx.org/en/docs/stream/ngx_stream_upstream_module.html, "Example
        // Configuration".
        "nginx stream upstream",
        "stream {
upstream backend {
    hash $remote_addr consistent;

    server backend1.example.com:12345  weight=5;
    server backend2.example.com:12345;
    server unix:/tmp/backend3;

    server backup1.example.com:12345   backup;
    server backup2.example.com:12345   backup;
}

server {
    listen 12346;
    proxy_pass backend;
}
}
",
        &[
            "hash $remote_addr consistent: lb spreads new flows by weighted Maglev hashing",
            "vip = \"192.0.2.1:12346\"",
            "listen 12346: no address; the VIP 192.0.2.1 is a placeholder",
            "address = \"backend2.example.com:12345\"\n",
        ],
    ),
    (
        // Angie ADC, "Проверки работоспособности серверов" (health probes), the HTTP
        // example.
        "Angie http upstream_probe",
        "upstream backend {
    zone backend 1m;

    server backend1.example.com;
    server backend2.example.com;
}

map $upstream_status $good {
    200     \"1\";
}

server {
    listen ...;

    location /backend {
        proxy_pass http://backend;

        upstream_probe backend_probe
            uri=/probe
            port=10004
            interval=5s
            test=$good
            essential
            persistent
            fails=3
            passes=3
            max_body=10m
            mode=idle;
    }
}
",
        &[
            "listen ...: not an address lb can serve",
            "[[service.probe]]\nname = \"backend_probe\"\ntype = \"http\"\nuri = \"/probe\"\nport = 10004\ninterval = \"5s\"\ntest = '$upstream_status == \"200\"'\nessential = true\npersistent = true\nfails = 3\npasses = 3\nmax_body = \"10m\"\nmode = \"idle\"\n",
            "zone backend 1m: lb keeps its state in the agent",
        ],
    ),
    (
        // Angie ADC, health probes, the TCP/UDP example.
        "Angie stream upstream_probe",
        "stream {
upstream backend {
    zone backend 1m;

    server a.example.com;
    server b.example.com;
}

map $upstream_probe_response $good {
    ~200    \"1\";
    default  \"\";
}

server {
    listen 10.0.0.10:12345;

    proxy_pass backend;
    upstream_probe_timeout 1s;

    upstream_probe backend_probe
        port=12345
        interval=5s
        test=$good
        essential
        persistent
        fails=3
        passes=3
        max_response=512k
        mode=onfail
        \"send=data:GET / HTTP/1.0\\r\\n\\r\\n\";
}
}
",
        &[
            "vip = \"10.0.0.10:12345\"",
            "snat_ip = \"10.0.0.10\"",
            "type = \"tcp\"\ntimeout = \"1s\"\nport = 12345",
            "test = '$upstream_probe_response ~ \"200\"'",
            "send = 'data:GET / HTTP/1.0\\r\\n\\r\\n'",
            "address = \"a.example.com\"\n",
        ],
    ),
    (
        // Angie ADC, health probes, the ICMP example.
        "Angie ping probes",
        "http {
    upstream u {
        zone z 1k;

        server 127.0.0.1:8081;
        server 127.0.0.1:8082;
    }

    server {
        listen 10.0.0.10:80;

        location / {
            proxy_pass http://u/;

            upstream_probe simple1
                 interval=3s
                 ping;

            upstream_probe simple2
                 interval=3s
                 ping ping_timeout=3s;
        }
    }
}
",
        &[
            "name = \"simple1\"\ntype = \"icmp\"\ninterval = \"3s\"\n",
            "name = \"simple2\"\ntype = \"icmp\"\ninterval = \"3s\"\ntimeout = \"3s\"\n",
        ],
    ),
    (
        // Angie ADC, "Резервирование проксируемых серверов и групп" (spare servers and
        // backup groups): both examples, with server blocks of ours that proxy to them.
        "Angie spare and backup",
        "http {
    upstream u {
        zone z 1m;
        server 127.0.0.1:8081 max_fails=1 fail_timeout=2s weight=2;
        server 127.0.0.1:8082 spare;
        server 127.0.0.1:8083 spare;
    }

upstream my_backend {
    server primary1.example.com;
    server primary2.example.com;

    server backend.example.com service=http resolve backup=prio;

    server backup1a.example.com backup;
    server backup1b.example.com backup;

    server backup2a.example.com backup=2;
    server backup2b.example.com backup=2;

    backup_switch permanent=2m;
}
    server {
        listen 10.0.0.10:80;
        location /u { proxy_pass http://u; }
        location / { proxy_pass http://my_backend; }
    }
    server {
        listen 10.0.0.11:80;
        location / { proxy_pass http://my_backend; }
    }
}
",
        &[
            "max_fails = 1\nfail_timeout = \"2s\"\n",
            "address = \"127.0.0.1:8081\"\nweight = 2\n",
            "address = \"127.0.0.1:8082\"\nspare = true\n",
            "upstream my_backend on 10.0.0.10:80: the VIP of service \"u-10.0.0.10_80\" already",
            "address = \"backend.example.com\"\nbackup = \"prio\"\nresolve = true\nservice = \"http\"\n",
            "address = \"backup2a.example.com:80\"\nbackup = 2\n",
            "backup_switch = { permanent = \"2m\" }",
        ],
    ),
];

#[test]
fn nginx_and_angie_doc_examples_convert_into_configs_check_config_accepts() {
    let dir = std::env::temp_dir().join(format!("lb-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, (what, example, wants)) in DOC_EXAMPLES.iter().enumerate() {
        let file = dir.join(format!("example-{i}.conf"));
        std::fs::write(&file, example).unwrap();
        let out = import_and_check("angie", &file);
        assert!(services(&out) > 0, "{what}: no service:\n{out}");
        for want in *wants {
            assert!(
                unwrapped(&out).contains(want),
                "{what}: {want:?} not in:\n{out}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_that_does_not_parse_is_refused_with_its_line() {
    let dir = std::env::temp_dir().join(format!("lb-import-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("nginx.conf");
    std::fs::write(&file, "upstream u {\n    server 10.0.1.1:80\n}\n").unwrap();
    let out = lb_agent(&["import", "angie", &file.to_string_lossy()], None);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(
        text(&out.stderr),
        format!("{}: line 3: expected ';' before '}}'\n", file.display())
    );
}
