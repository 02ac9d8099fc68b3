//! Probe keys after Angie's: `test` (conditions over status, headers and body), the
//! `send = "data:…"` form, an http request `body`, and header values read from a file or
//! an environment variable, never printed. A binary of its
//! own, apart from the config binary: it sets an environment variable, which no thread
//! of another test may read meanwhile.

#[path = "config/util.rs"]
mod config_util;

use std::path::Path;

use config_util::{check, error, probe};
use lb_agent::config::{ProbeConfig, parse};
use lb_agent::probe::condition::Response;

fn one_probe(lines: &str) -> ProbeConfig {
    let c = parse(&probe(lines), Path::new("lb.toml")).unwrap_or_else(|e| panic!("{e}"));
    c.services[0].probes[0].clone()
}

#[test]
fn http_test_condition_is_parsed_and_evaluated() {
    let p = one_probe(
        "type = \"http\"\ntest = '$upstream_status ~ ^2 && ($upstream_http_x_role == primary || !$upstream_http_x_readonly)'",
    );
    let t = p.test.expect("test is set");
    let ok = |status, headers: &[(&str, &str)]| {
        let h: Vec<(String, Vec<u8>)> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
        t.holds(&Response {
            status: Some(status),
            headers: &h,
            body: b"",
        })
    };
    assert!(ok(200, &[("x-role", "primary"), ("x-readonly", "1")]));
    assert!(ok(204, &[]));
    assert!(!ok(200, &[("x-readonly", "yes")]));
    assert!(!ok(503, &[("x-role", "primary")]));
}

#[test]
fn stream_test_sees_the_reply() {
    let p = one_probe(
        "type = \"tcp\"\nsend = \"PING\\r\\n\"\ntest = '$upstream_probe_response ~ \"^\\\\+PONG\"'",
    );
    let t = p.test.expect("test is set");
    let reply = |body: &[u8]| {
        t.holds(&Response {
            body,
            ..Response::default()
        })
    };
    assert!(reply(b"+PONG\r\n"));
    assert!(!reply(b"-ERR\r\n"));
}

#[test]
fn test_errors_name_file_line_key_and_column() {
    check(
        &probe("type = \"http\"\ntest = '$upstream_status == 200 &&' # here"),
        "# here",
        "service[0].probe[0].test",
        &["is not a valid test: at column 27: expected a variable"],
    );
    check(
        &probe("type = \"udp\"\ntest = '$upstream_http_server' # here"),
        "# here",
        "service[0].probe[0].test",
        &["is an http variable"],
    );
    check(
        &probe("type = \"icmp\"\ntest = '$upstream_probe_response' # here"),
        "# here",
        "service[0].probe[0].test",
        &["http, tcp and udp probes only"],
    );
    check(
        &probe("type = \"http\"\nexpect_status = 200\ntest = '$upstream_status == 200' # here"),
        "# here",
        "service[0].probe[0].test",
        &["replaces expect_status", "$upstream_status ~ ^2"],
    );
    check(
        &probe("type = \"tcp\"\nexpect = \"OK\"\ntest = '$upstream_probe_response' # here"),
        "# here",
        "service[0].probe[0].test",
        &["replaces expect"],
    );
    check(
        &probe("type = \"tcp\"\nmax_response = 0 # here\ntest = '$upstream_probe_response'"),
        "# here",
        "service[0].probe[0].max_response",
        &["more than 0 when test is set"],
    );
}

#[test]
fn send_data_prefix_is_angie_syntax_not_payload() {
    let p = one_probe("type = \"tcp\"\nsend = 'data:GET / HTTP/1.0\\r\\n\\r\\n'");
    assert_eq!(p.send.as_deref(), Some(&b"GET / HTTP/1.0\r\n\r\n"[..]));
    let p = one_probe("type = \"udp\"\nsend = 'data:data:x'");
    assert_eq!(
        p.send.as_deref(),
        Some(&b"data:x"[..]),
        "only one prefix is dropped: a payload starting with data: is written data:data:"
    );
    let p = one_probe("type = \"tcp\"\nsend = 'PING'");
    assert_eq!(p.send.as_deref(), Some(&b"PING"[..]));
}

#[test]
fn http_method_and_body() {
    let p = one_probe("type = \"http\"\nmethod = \"POST\"\nbody = '{\"probe\":true}'");
    assert_eq!(p.http.method, "POST");
    assert_eq!(p.http.body.as_deref(), Some(&br#"{"probe":true}"#[..]));
    check(
        &probe("type = \"tcp\"\nbody = \"x\" # here"),
        "# here",
        "service[0].probe[0].body",
        &["applies to http probes only"],
    );
}

/// A temporary directory of one test, removed when dropped (also on failure).
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("lb-config-secret-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Scratch(dir)
    }

    /// A file `name` holding `content`.
    fn file(&self, name: &str, content: &str) -> std::path::PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, content).expect("write the secret file");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn header_value_from_a_file_is_read_and_never_printed() {
    let scratch = Scratch::new("file");
    let path = scratch.file("token", "s3cr3t-from-file\n");
    let p = one_probe(&format!(
        "type = \"http\"\nheaders = {{ \"X-Plain\" = \"p\", \"X-Health-Key\" = {{ file = \"{}\" }} }}",
        path.display()
    ));
    assert_eq!(
        p.http.headers,
        vec![("X-Plain".to_string(), "p".to_string())]
    );
    let (name, value) = &p.http.secret_headers[0];
    assert_eq!(name, "X-Health-Key");
    assert_eq!(
        value.expose(),
        "s3cr3t-from-file",
        "one trailing newline dropped"
    );
    let shown = format!("{p:?}");
    assert!(
        !shown.contains("s3cr3t"),
        "Debug must not show the value: {shown}"
    );
    assert!(shown.contains(&format!("file {}", path.display())));

    // A reload reads the file again.
    std::fs::write(&path, "rotated\r\n").expect("rewrite");
    let p = one_probe(&format!(
        "type = \"http\"\nheaders = {{ \"X-Health-Key\" = {{ file = \"{}\" }} }}",
        path.display()
    ));
    assert_eq!(p.http.secret_headers[0].1.expose(), "rotated");
}

#[test]
fn header_value_from_the_environment() {
    // A name no other test uses; set once, before any read.
    // SAFETY: no other thread of this test binary reads or writes this variable.
    unsafe { std::env::set_var("LB_TEST_PROBE_KEY_7", "env-secret-value") };
    let p = one_probe(
        "type = \"http\"\nheaders = { Authorization = { env = \"LB_TEST_PROBE_KEY_7\" } }",
    );
    assert_eq!(p.http.secret_headers[0].1.expose(), "env-secret-value");
    assert!(!format!("{p:?}").contains("env-secret-value"));
}

#[test]
fn missing_or_bad_secret_sources_are_config_errors_naming_them() {
    check(
        &probe(
            "type = \"http\"\nheaders = { X-Key = { file = \"/nonexistent/lb-probe-key\" } } # here",
        ),
        "# here",
        "service[0].probe[0].headers.X-Key.file",
        &["cannot read /nonexistent/lb-probe-key"],
    );
    check(
        &probe(
            "type = \"http\"\nheaders = { X-Key = { env = \"LB_TEST_SURELY_UNSET_VAR\" } } # here",
        ),
        "# here",
        "service[0].probe[0].headers.X-Key.env",
        &["environment variable LB_TEST_SURELY_UNSET_VAR is not set"],
    );
    check(
        &probe("type = \"http\"\nheaders = { X-Key = { file = \"relative/key\" } } # here"),
        "# here",
        "service[0].probe[0].headers.X-Key.file",
        &["not an absolute path"],
    );
    check(
        &probe("type = \"http\"\nheaders = { X-Key = { file = \"/a\", env = \"B\" } } # here"),
        "# here",
        "service[0].probe[0].headers.X-Key",
        &["exactly one of file, env"],
    );
    check(
        &probe("type = \"http\"\nheaders = { X-Key = { path = \"/a\" } } # here"),
        "# here",
        "service[0].probe[0].headers.X-Key.path",
        &["file", "env"],
    );
    let scratch = Scratch::new("bad");
    let path = scratch.file("crlf", "line1\nline2-secret\n");
    let e = error(&probe(&format!(
        "type = \"http\"\nheaders = {{ X-Key = {{ file = \"{}\" }} }}",
        path.display()
    )));
    assert!(e.message.contains("control characters"), "{e}");
    assert!(
        !e.to_string().contains("line2-secret"),
        "the value is never in an error: {e}"
    );
    let empty = scratch.file("empty", "\n");
    let e = error(&probe(&format!(
        "type = \"http\"\nheaders = {{ X-Key = {{ file = \"{}\" }} }}",
        empty.display()
    )));
    assert!(e.message.contains("is empty"), "{e}");
    let dup = scratch.file("dup", "v");
    check(
        &probe(&format!(
            "type = \"http\"\nheaders = {{ X-Key = \"a\", x-key = {{ file = \"{}\" }} }} # here",
            dup.display()
        )),
        "# here",
        "service[0].probe[0].headers.x-key",
        &["set twice"],
    );
}

#[test]
fn check_config_reads_the_secret_sources_and_never_prints_the_values() {
    let scratch = Scratch::new("check");
    let key = scratch.file("check-key", "file-secret-4711\n");
    let text = probe(&format!(
        "type = \"http\"\nheaders = {{ X-File = {{ file = \"{}\" }}, X-Env = {{ env = \"LB_TEST_CHECK_KEY_7\" }} }}",
        key.display()
    ));
    let cfg = scratch.file("lb-check.toml", &text);
    let bin = env!("CARGO_BIN_EXE_lb-agent");
    let run = |env: Option<&str>| {
        let mut c = std::process::Command::new(bin);
        c.args(["check-config", "--config"]).arg(&cfg);
        match env {
            Some(v) => c.env("LB_TEST_CHECK_KEY_7", v),
            None => c.env_remove("LB_TEST_CHECK_KEY_7"),
        };
        let out = c.output().expect("running lb-agent check-config");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, out) = run(Some("env-secret-0815"));
    assert!(ok, "a config with readable secrets checks fine: {out}");
    assert!(
        !out.contains("file-secret-4711") && !out.contains("env-secret-0815"),
        "check-config must not print a secret: {out}"
    );
    let (ok, out) = run(None);
    assert!(!ok, "an unset variable is a config error: {out}");
    assert!(
        out.contains("headers.X-Env.env") && out.contains("LB_TEST_CHECK_KEY_7 is not set"),
        "the error names the key and the variable: {out}"
    );
    assert!(!out.contains("file-secret-4711"), "{out}");
}

#[test]
fn a_udp_probe_with_a_test_is_not_warned_about_passing_on_silence() {
    let warned = |lines: &str| {
        let cfg = parse(&probe(lines), Path::new("lb.toml")).unwrap_or_else(|e| panic!("{e}"));
        lb_agent::config::warnings(&cfg)
            .iter()
            .any(|w| w.contains("passes on silence"))
    };
    assert!(warned("type = \"udp\""), "setup: the warning exists");
    assert!(
        !warned("type = \"udp\"\ntest = '$upstream_probe_response'"),
        "a test needs a reply: silence fails it"
    );
}
