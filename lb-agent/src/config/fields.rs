//! The field readers that the service schema (`schema.rs`) and the probe tables
//! (`probe.rs`) share, and the keys every table accepts: the room below both, so that
//! `schema.rs` uses `probe.rs` and neither reads the other's lists.

use std::time::Duration;

use super::ConfigError;
use super::spanned::{Field, Table};
use super::values;

/// A config result: the error carries file, line and key.
pub(super) type R<T> = Result<T, ConfigError>;

/// The top-level keys.
pub(super) const TOP_KEYS: &[&str] = &["agent", "service", "cluster"];
/// Every key of `[agent]`.
pub(super) const AGENT_KEYS: &[&str] = &[
    "interface",
    "resolver",
    "xdp_mode",
    "api_listen",
    "pin_path",
    "api_socket",
    "api_socket_group",
    "api_token_file",
    "state_file",
    "announce_interface",
    "announce_lifetime",
    "bird_socket",
    "max_backends",
    "max_flows",
    "log_format",
    "tunnel_source",
];
/// The keys of `backup_switch`'s table.
pub(super) const BACKUP_SWITCH_KEYS: &[&str] = &["permanent"];
/// Every key a `[[service.server]]` table may have.
pub(super) const SERVER_KEYS: &[&str] =
    &["address", "weight", "spare", "backup", "resolve", "service"];

/// Every key a `[[service]]` table may have.
pub(super) const SERVICE_KEYS: &[&str] = &[
    "name",
    "vip",
    "protocol",
    "forwarding",
    "snat_ip",
    "snat_ips",
    "snat_ports",
    "source_rate",
    "source_burst",
    "maglev_size",
    "max_fails",
    "fail_timeout",
    "max_unhealthy_percent",
    "fail_open",
    "backup_switch",
    "server",
    "probe",
];

/// The keys every probe table may have.
pub(super) const PROBE_COMMON_KEYS: &[&str] = &[
    "name",
    "type",
    "port",
    "interval",
    "timeout",
    "fails",
    "passes",
    "essential",
    "persistent",
    "mode",
    "jitter",
    "test",
];
/// The keys of an http probe.
pub(super) const PROBE_HTTP_KEYS: &[&str] = &[
    "uri",
    "method",
    "headers",
    "body",
    "host",
    "tls",
    "sni",
    "verify",
    "expect_status",
    "expect_body",
    "max_body",
];
/// The keys of a tcp or udp probe's exchange.
pub(super) const PROBE_STREAM_KEYS: &[&str] = &["send", "expect", "max_response"];
/// The key of a tcp probe's check.
pub(super) const PROBE_TCP_CHECK_KEY: &str = "tcp_check";
/// The keys of a header value read at load (`{ file = "/path" }`, `{ env = "NAME" }`).
pub(super) const HEADER_SOURCE_KEYS: &[&str] = &["file", "env"];

/// Every key the parser accepts, table by table: `(path, keys)`, the path being the
/// table's (`""` the top level, `agent`, `service`, `service.server`, `service.probe`)
/// or, for a key whose value may be an inline table, the key's
/// (`service.backup_switch`, `service.probe.headers`). docs/configuration.md documents
/// each (`lb-agent/tests/docs/config_keys_documented.rs` holds the two to each other).
pub fn accepted_keys() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        ("", TOP_KEYS.to_vec()),
        ("agent", AGENT_KEYS.to_vec()),
        ("service", SERVICE_KEYS.to_vec()),
        ("service.backup_switch", BACKUP_SWITCH_KEYS.to_vec()),
        ("service.server", SERVER_KEYS.to_vec()),
        ("service.probe", probe_keys()),
        ("service.probe.headers", HEADER_SOURCE_KEYS.to_vec()),
        ("cluster", super::cluster::CLUSTER_KEYS.to_vec()),
        ("cluster.peer", super::cluster::PEER_KEYS.to_vec()),
    ]
}

/// Every key a probe table may have (of some type).
pub(super) fn probe_keys() -> Vec<&'static str> {
    [
        PROBE_COMMON_KEYS,
        PROBE_HTTP_KEYS,
        PROBE_STREAM_KEYS,
        &[PROBE_TCP_CHECK_KEY],
    ]
    .concat()
}

/// `Some(f(field))` when `key` is present.
pub(super) fn opt<'a, T>(
    t: &Table<'a>,
    key: &str,
    f: impl FnOnce(&Field<'a>) -> R<T>,
) -> R<Option<T>> {
    t.get(key).map(|field| f(&field)).transpose()
}

pub(super) fn duration(f: &Field<'_>) -> R<Duration> {
    f.parse(values::duration)
}

pub(super) fn positive_duration(f: &Field<'_>) -> R<Duration> {
    let d = duration(f)?;
    if d.is_zero() {
        return Err(f.err("must be more than 0"));
    }
    Ok(d)
}

/// Why a `[[service]]` (or probe) key is not allowed in a `table` (`[[service.server]]`,
/// `[[service.probe]]`): TOML gives every key after such a header to that table, so a
/// service key written below a server or probe belongs to it there.
pub(super) fn misplaced(key: &str, table: &str) -> Option<String> {
    if SERVICE_KEYS.contains(&key) && !matches!(key, "server" | "probe") {
        return Some(format!(
            "`{key}` is a [[service]] key, but it comes after a {table} header, so TOML \
             gives it to that {table}; move it above the service's first [[service.server]] \
             or [[service.probe]] header"
        ));
    }
    if table == "[[service.server]]" && key == "port" {
        return Some(
            "a server's port is part of its address, e.g. address = \"10.0.1.11:8080\"".into(),
        );
    }
    if table == "[[service.server]]" && probe_keys().contains(&key) {
        return Some(format!(
            "`{key}` is a [[service.probe]] key: put it in a [[service.probe]] table"
        ));
    }
    None
}
