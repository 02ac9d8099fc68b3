//! The tcp probe's `tcp_check` key: its values, its probe type, and that a forced SYN
//! check cannot carry data; errors name the file, the line and the key.

use crate::util::{check, probe};
use std::path::Path;

use lb_agent::config::{TcpCheck, parse};

#[test]
fn tcp_check_values_parse() {
    for (value, want) in [
        ("auto", TcpCheck::Auto),
        ("syn", TcpCheck::Syn),
        ("connect", TcpCheck::Connect),
    ] {
        let text = probe(&format!("type = \"tcp\"\ntcp_check = \"{value}\""));
        let cfg = parse(&text, Path::new("lb.toml")).unwrap();
        assert_eq!(cfg.services[0].probes[0].tcp_check, want, "{value}");
    }
    let cfg = parse(&probe("type = \"tcp\""), Path::new("lb.toml")).unwrap();
    assert_eq!(
        cfg.services[0].probes[0].tcp_check,
        TcpCheck::Auto,
        "default"
    );
}

#[test]
fn tcp_check_errors() {
    check(
        &probe("type = \"tcp\"\ntcp_check = \"raw\" # here"),
        "# here",
        "service[0].probe[0].tcp_check",
        &["\"auto\"", "\"syn\"", "\"connect\""],
    );
    check(
        &probe("type = \"http\"\ntcp_check = \"syn\" # here"),
        "# here",
        "service[0].probe[0].tcp_check",
        &["applies to tcp probes only (this probe is type = \"http\")"],
    );
    check(
        &probe("type = \"udp\"\ntcp_check = \"connect\" # here"),
        "# here",
        "service[0].probe[0].tcp_check",
        &["applies to tcp probes only"],
    );
    check(
        &probe("type = \"tcp\"\nsend = \"PING\"\ntcp_check = \"syn\" # here"),
        "# here",
        "service[0].probe[0].tcp_check",
        &["with send the probe must connect"],
    );
}
