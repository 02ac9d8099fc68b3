//! Probe tables that are rejected: each error names the file, the line, the key path and
//! what is allowed.

use crate::util::{check, probe};

#[test]
fn probe_timing_rules() {
    check(
        &probe("type = \"tcp\"\ntimeout = \"0s\" # here"),
        "# here",
        "service[0].probe[0].timeout",
        &["must be more than 0"],
    );
    check(
        &probe("type = \"tcp\"\ninterval = \"0\" # here"),
        "# here",
        "service[0].probe[0].interval",
        &["must be more than 0"],
    );
    check(
        &probe("type = \"tcp\"\nfails = 0 # here"),
        "# here",
        "service[0].probe[0].fails",
        &["at least 1 (got 0)"],
    );
    check(
        &probe("type = \"tcp\"\npasses = 0 # here"),
        "# here",
        "service[0].probe[0].passes",
        &["at least 1 (got 0)"],
    );
    check(
        &probe("type = \"tcp\"\njitter = \"-1s\" # here"),
        "# here",
        "service[0].probe[0].jitter",
        &["is not a duration"],
    );
    check(
        &probe("type = \"tcp\"\ninterval = \"5 sec\" # here"),
        "# here",
        "service[0].probe[0].interval",
        &["is not a duration"],
    );
    check(
        &probe("type = \"tcp\"\npersistent = true # here"),
        "# here",
        "service[0].probe[0].persistent",
        &["persistent applies only with essential = true"],
    );
}

#[test]
fn probe_ports() {
    check(
        &probe("type = \"tcp\"\nport = 0 # here"),
        "# here",
        "service[0].probe[0].port",
        &["at least 1 (got 0)"],
    );
    check(
        &probe("type = \"tcp\"\nport = 65536 # here"),
        "# here",
        "service[0].probe[0].port",
        &["at most 65535 (got 65536)"],
    );
}

#[test]
fn probe_names_unique_per_service() {
    check(
        &probe(
            "name = \"h\"\ntype = \"http\"\n[[service.probe]]\nname = \"h\" # here\ntype = \"tcp\"",
        ),
        "# here",
        "service[0].probe[1].name",
        &["duplicate probe name \"h\" (also service[0].probe[0])"],
    );
    // Two unnamed probes of one type share the default name; the error points at the table.
    check(
        &probe("type = \"tcp\"\n[[service.probe]] # here\ntype = \"tcp\""),
        "# here",
        "service[0].probe[1].name",
        &["duplicate probe name \"tcp\"", "give each probe a name"],
    );
    check(
        &probe("type = \"tcp\"\nname = \"\" # here"),
        "# here",
        "service[0].probe[0].name",
        &["not a probe name"],
    );
}

#[test]
fn keys_of_another_probe_type() {
    check(
        &probe("type = \"tcp\"\nuri = \"/\" # here"),
        "# here",
        "service[0].probe[0].uri",
        &["applies to http probes only (this probe is type = \"tcp\")"],
    );
    check(
        &probe("type = \"http\"\nsend = \"x\" # here"),
        "# here",
        "service[0].probe[0].send",
        &["applies to tcp and udp probes only"],
    );
    check(
        &probe("type = \"icmp\"\nexpect = \"x\" # here"),
        "# here",
        "service[0].probe[0].expect",
        &["tcp and udp probes only"],
    );
    check(
        &probe("type = \"icmp\"\ntls = true # here"),
        "# here",
        "service[0].probe[0].tls",
        &["http probes only"],
    );
}

#[test]
fn http_probe_rules() {
    let http = |line: &str| probe(&format!("type = \"http\"\n{line} # here"));
    check(
        &http("uri = \"health\""),
        "# here",
        "service[0].probe[0].uri",
        &["starts with '/'"],
    );
    check(
        &http("uri = \"/a b\""),
        "# here",
        "service[0].probe[0].uri",
        &["no spaces"],
    );
    check(
        &http("method = \"GE T\""),
        "# here",
        "service[0].probe[0].method",
        &["not an HTTP method"],
    );
    check(
        &http("headers = { Host = \"x\" }"),
        "# here",
        "service[0].probe[0].headers.Host",
        &["probe's `host` key"],
    );
    check(
        &http("headers = { \"Bad Name\" = \"x\" }"),
        "# here",
        "service[0].probe[0].headers.Bad Name",
        &["not an HTTP header name"],
    );
    check(
        &http("headers = { X-A = \"a\\r\\nEvil: 1\" }"),
        "# here",
        "service[0].probe[0].headers.X-A",
        &["control characters"],
    );
    check(
        &http("headers = { X-A = \"1\", x-a = \"2\" }"),
        "# here",
        "service[0].probe[0].headers.x-a",
        &["set twice"],
    );
    check(
        &http("host = \"a b\""),
        "# here",
        "service[0].probe[0].host",
        &["not a Host header value"],
    );
    check(
        &http("sni = \"a_b c\""),
        "# here",
        "service[0].probe[0].sni",
        &["sni is a DNS name"],
    );
    check(
        &http("expect_status = []"),
        "# here",
        "service[0].probe[0].expect_status",
        &["at least one status"],
    );
    check(
        &http("expect_status = [200, 99]"),
        "# here",
        "service[0].probe[0].expect_status[1]",
        &["not an HTTP status code (100..599)"],
    );
    check(
        &http("expect_status = [\"300-200\"]"),
        "# here",
        "service[0].probe[0].expect_status[0]",
        &["empty range"],
    );
    check(
        &http("expect_status = [\"ok\"]"),
        "# here",
        "service[0].probe[0].expect_status[0]",
        &["\"200-299\""],
    );
    check(
        &http("expect_status = [true]"),
        "# here",
        "service[0].probe[0].expect_status[0]",
        &["status code"],
    );
    check(
        &http("expect_body = \"(\""),
        "# here",
        "service[0].probe[0].expect_body",
        &["not a valid regular expression: unclosed group"],
    );
    check(
        &http("max_body = \"1x\""),
        "# here",
        "service[0].probe[0].max_body",
        &["is not a size", "\"256k\""],
    );
    check(
        &http("max_body = -1"),
        "# here",
        "service[0].probe[0].max_body",
        &["at least 0"],
    );
    check(
        &probe("type = \"http\"\nexpect_body = \"ok\"\nmax_body = 0 # here"),
        "# here",
        "service[0].probe[0].max_body",
        &["more than 0 when expect_body is set"],
    );
}

#[test]
fn stream_probe_rules() {
    check(
        &probe("type = \"tcp\"\nsend = 'a\\qb' # here"),
        "# here",
        "service[0].probe[0].send",
        &["unknown escape \\q", "\\xNN"],
    );
    check(
        &probe("type = \"udp\"\nsend = '\\x4' # here"),
        "# here",
        "service[0].probe[0].send",
        &["two hex digits"],
    );
    check(
        &probe("type = \"tcp\"\nexpect = \"[\" # here"),
        "# here",
        "service[0].probe[0].expect",
        &["not a valid regular expression"],
    );
    check(
        &probe("type = \"udp\"\nexpect = \"pong\"\nmax_response = 0 # here"),
        "# here",
        "service[0].probe[0].max_response",
        &["more than 0 when expect is set"],
    );
}

/// Probes that could never pass are refused, naming the file, the line and the key.
#[test]
fn probes_that_can_never_pass() {
    check(
        &probe("type = \"http\"\nmethod = \"HEAD\"\nexpect_body = \"ok\" # here"),
        "# here",
        "service[0].probe[0].expect_body",
        &["can never match with method = \"HEAD\"", "no body"],
    );
    check(
        &probe("type = \"http\"\nmethod = \"get\" # here"),
        "# here",
        "service[0].probe[0].method",
        &["case-sensitive", "write \"GET\""],
    );
    check(
        &probe("type = \"http\"\ntest = \"$upstream_status == 2xx\" # here"),
        "# here",
        "service[0].probe[0].test",
        &["three-digit code", "never holds", "$upstream_status ~ ^2"],
    );
}

/// Slips from Angie's syntax, from other languages and from TOML get the fix in the
/// message.
#[test]
fn mistakes_get_a_hint() {
    check(
        &probe("type = \"ping\" # here"),
        "# here",
        "service[0].probe[0].type",
        &["type = \"icmp\""],
    );
    check(
        &probe("type = \"icmp\"\nping_timeout = \"3s\" # here"),
        "# here",
        "service[0].probe[0].ping_timeout",
        &["Angie's", "timeout"],
    );
    check(
        &probe("type = \"http\"\ntest = \"$upstream_http_X-Foo ~ ok\" # here"),
        "# here",
        "service[0].probe[0].test",
        &["$upstream_http_x_foo"],
    );
    check(
        &probe("type = \"http\"\ntest = \"$upstream_status ~ 200|204\" # here"),
        "# here",
        "service[0].probe[0].test",
        &["quote a value with `|`", "\"^(200|204)$\"", "`||`"],
    );
    check(
        &probe("type = \"http\"\ntest = \"$upstream_status ~ ^2 & $upstream_http_a\" # here"),
        "# here",
        "service[0].probe[0].test",
        &["a single `&`: write `&&`"],
    );
    check(
        &probe("type = \"http\"\nmax_fails = 2 # here"),
        "# here",
        "service[0].probe[0].max_fails",
        &[
            "is a [[service]] key",
            "move it above the service's first [[service.server]]",
        ],
    );
    check(
        &crate::util::service("", "fail_timeout = \"5s\" # here"),
        "# here",
        "service[0].server[0].fail_timeout",
        &["is a [[service]] key", "after a [[service.server]] header"],
    );
    check(
        &crate::util::service("", "interval = \"5s\" # here"),
        "# here",
        "service[0].server[0].interval",
        &["is a [[service.probe]] key"],
    );
    // TOML itself refuses a bare `200|204`; the message says how to write it.
    let e = crate::util::error(&probe("type = \"http\"\nexpect_status = 200|204"));
    assert!(e.to_string().contains("expect_status = [200, 204]"), "{e}");
    let e = crate::util::error(&probe("type = \"http\"\ntest = $upstream_status ~ 200|204"));
    assert!(
        e.to_string()
            .contains("test = '$upstream_status ~ \"^(200|204)$\"'"),
        "{e}"
    );
}
