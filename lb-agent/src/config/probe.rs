//! `[[service.probe]]` tables: the common keys, the http keys and the tcp/udp keys, each
//! allowed only for its probe type.

use super::fields::{
    HEADER_SOURCE_KEYS, PROBE_HTTP_KEYS, PROBE_STREAM_KEYS, PROBE_TCP_CHECK_KEY, R, duration,
    misplaced, opt, positive_duration, probe_keys,
};
use super::secret;
use super::spanned::{Field, Table};
use super::values;
use super::*;
use crate::probe::condition::{Condition, Scope};

/// RFC 9110's methods, for the case hint.
const HTTP_METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];
const PROBE_TCP_CHECKS: &[(&str, TcpCheck)] = &[
    ("auto", TcpCheck::Auto),
    ("syn", TcpCheck::Syn),
    ("connect", TcpCheck::Connect),
];
const PROBE_KINDS: &[(&str, ProbeKind)] = &[
    ("http", ProbeKind::Http),
    ("tcp", ProbeKind::Tcp),
    ("udp", ProbeKind::Udp),
    ("icmp", ProbeKind::Icmp),
];
const PROBE_MODES: &[(&str, ProbeMode)] = &[
    ("always", ProbeMode::Always),
    ("idle", ProbeMode::Idle),
    ("onfail", ProbeMode::Onfail),
];

fn size(f: &Field<'_>) -> R<usize> {
    if let Some(n) = f.as_int_opt() {
        return usize::try_from(n).map_err(|_| f.err(format!("must be at least 0 (got {n})")));
    }
    if f.as_str_opt().is_none() {
        return Err(f.err("must be a size: an integer or a string such as \"256k\""));
    }
    f.parse(values::size)
}

fn regex(f: &Field<'_>) -> R<regex::Regex> {
    f.parse(|s| {
        regex::Regex::new(s).map_err(|e| {
            // The regex crate's message draws a caret diagram over several lines; keep its verdict.
            let text = e.to_string();
            let verdict = text
                .lines()
                .find_map(|l| l.strip_prefix("error: "))
                .unwrap_or(&text)
                .trim()
                .to_string();
            format!("is not a valid regular expression: {verdict}")
        })
    })
}

/// Angie's `upstream_probe` parameters that lb spells differently.
fn angie_name(key: &str) -> Option<String> {
    let lb = match key {
        "ping" => "type = \"icmp\"",
        "ping_timeout" => "timeout",
        "upstream_probe_timeout" => "timeout",
        "header" => "headers = { \"Name\" = \"value\" }",
        _ => return None,
    };
    Some(format!("`{key}` is Angie's; lb writes {lb}"))
}

pub(super) fn probe(t: &Table<'_>) -> R<ProbeConfig> {
    t.check_keys_hinted(&probe_keys(), |key| {
        angie_name(key).or_else(|| misplaced(key, "[[service.probe]]"))
    })?;
    let type_field = t.require("type", "\"http\" (or \"tcp\", \"udp\", \"icmp\")")?;
    if type_field.as_str_opt() == Some("ping") {
        return Err(type_field.err(
            "must be one of \"http\", \"tcp\", \"udp\", \"icmp\" (got \"ping\"): Angie's `ping` \
             probe is type = \"icmp\" here (and its ping_timeout is timeout)",
        ));
    }
    let kind = type_field.choice(PROBE_KINDS)?;
    for (key, f) in t.entries() {
        if key == PROBE_TCP_CHECK_KEY && kind != ProbeKind::Tcp {
            return Err(f.err(format!(
                "applies to tcp probes only (this probe is type = \"{kind}\")"
            )));
        }
        if key == "test" && kind == ProbeKind::Icmp {
            return Err(f.err(
                "applies to http, tcp and udp probes only (an icmp probe passes on an echo reply)",
            ));
        }
        let wrong = match kind {
            ProbeKind::Http => PROBE_STREAM_KEYS.contains(&key).then_some("tcp and udp"),
            ProbeKind::Tcp | ProbeKind::Udp => PROBE_HTTP_KEYS.contains(&key).then_some("http"),
            ProbeKind::Icmp => (PROBE_HTTP_KEYS.contains(&key) || PROBE_STREAM_KEYS.contains(&key))
                .then_some(if PROBE_HTTP_KEYS.contains(&key) {
                    "http"
                } else {
                    "tcp and udp"
                }),
        };
        if let Some(kinds) = wrong {
            return Err(f.err(format!(
                "applies to {kinds} probes only (this probe is type = \"{kind}\")"
            )));
        }
    }
    let mut p = ProbeConfig::new(kind.as_str(), kind);
    if let Some(f) = t.get("name") {
        let name = f.str()?;
        if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
            return Err(f.err(format!(
                "{name:?} is not a probe name: 1..64 characters, no control characters"
            )));
        }
        p.name = name.to_string();
    }
    p.port = opt(t, "port", |f| f.int_in(1, 65535))?.map(|n| n as u16);
    if let Some(d) = opt(t, "interval", positive_duration)? {
        p.interval = d;
    }
    if let Some(d) = opt(t, "timeout", positive_duration)? {
        p.timeout = d;
    }
    if let Some(n) = opt(t, "fails", |f| f.int_in(1, u32::MAX.into()))? {
        p.fails = n as u32;
    }
    if let Some(n) = opt(t, "passes", |f| f.int_in(1, u32::MAX.into()))? {
        p.passes = n as u32;
    }
    p.essential = opt(t, "essential", Field::bool)?.unwrap_or(false);
    if let Some(f) = t.get("persistent") {
        p.persistent = f.bool()?;
        if p.persistent && !p.essential {
            return Err(f.err("persistent applies only with essential = true (it skips an essential probe after a reload)"));
        }
    }
    p.mode = opt(t, "mode", |f| f.choice(PROBE_MODES))?.unwrap_or_default();
    if let Some(d) = opt(t, "jitter", duration)? {
        p.jitter = d;
    }
    match kind {
        ProbeKind::Http => http(t, &mut p.http)?,
        ProbeKind::Tcp | ProbeKind::Udp => {
            // Angie's form `send=data:…`: the prefix names the encoding, it is not sent.
            p.send = opt(t, "send", |f| {
                f.parse(|s| values::unescape(s.strip_prefix("data:").unwrap_or(s)))
            })?;
            p.expect = opt(t, "expect", regex)?;
            if let Some(n) = opt(t, "max_response", size)? {
                p.max_response = n;
            }
            if p.expect.is_some() && p.max_response == 0 {
                let f = t.get("max_response").expect("0 came from the field");
                return Err(
                    f.err("must be more than 0 when expect is set (0 means: don't read a reply)")
                );
            }
        }
        ProbeKind::Icmp => {}
    }
    if let Some(f) = t.get("test") {
        let scope = if kind == ProbeKind::Http {
            Scope::Http
        } else {
            Scope::Stream
        };
        p.test = Some(f.parse(|s| {
            Condition::parse(s, scope).map_err(|e| format!("is not a valid test: {e}"))
        })?);
        if kind == ProbeKind::Http
            && p.http.method == "HEAD"
            && p.test.as_ref().is_some_and(|c| c.reads_response())
        {
            return Err(f.err(
                "reads $upstream_probe_response, which is always empty with method = \"HEAD\": \
                 a HEAD response has no body (use GET, or test the status and headers only)",
            ));
        }
        let replaced: &[&str] = if kind == ProbeKind::Http {
            &["expect_status", "expect_body"]
        } else {
            &["expect"]
        };
        if let Some(key) = replaced.iter().find(|k| t.get(k).is_some()) {
            return Err(f.err(format!(
                "replaces {key}: write that check into the test, e.g. {}",
                match *key {
                    "expect_status" => "$upstream_status ~ ^2",
                    _ => "$upstream_probe_response ~ \"^OK\"",
                }
            )));
        }
        let (size_key, size) = if kind == ProbeKind::Http {
            ("max_body", p.http.max_body)
        } else {
            ("max_response", p.max_response)
        };
        if size == 0 {
            let why = "must be more than 0 when test is set (the test reads the response)";
            return Err(match t.get(size_key) {
                Some(f) => f.err(why),
                None => t.err_key(size_key, why),
            });
        }
    }
    if let Some(f) = t.get(PROBE_TCP_CHECK_KEY) {
        p.tcp_check = f.choice(PROBE_TCP_CHECKS)?;
        let data = ["send", "expect", "test"];
        if p.tcp_check == TcpCheck::Syn
            && let Some(key) = data.iter().find(|k| t.get(k).is_some())
        {
            return Err(f.err(format!(
                "\"syn\" only checks that the port accepts connections; with {key} the probe must connect (remove tcp_check or set it to \"connect\")"
            )));
        }
    }
    Ok(p)
}

/// A header value: a string, or `{ file = "/path" }` / `{ env = "NAME" }` read now.
fn header_value(v: &Field<'_>) -> R<HeaderValue> {
    if let Some(value) = v.as_str_opt() {
        if !values::http_text(value) {
            return Err(v.err("a header value cannot contain control characters (CR, LF, ...)"));
        }
        return Ok(HeaderValue::Plain(value.to_string()));
    }
    let shape = "must be a string, { file = \"/path\" } or { env = \"NAME\" }";
    let table = v.table().map_err(|_| v.err(shape))?;
    table.check_keys(HEADER_SOURCE_KEYS)?;
    let read = match (table.get("file"), table.get("env")) {
        (Some(f), None) => f.parse(secret::from_file)?,
        (None, Some(e)) => e.parse(secret::from_env)?,
        _ => return Err(v.err(format!("{shape}: exactly one of file, env"))),
    };
    Ok(HeaderValue::Secret(read))
}

enum HeaderValue {
    Plain(String),
    Secret(Secret),
}

fn http(t: &Table<'_>, h: &mut HttpProbe) -> R<()> {
    if let Some(f) = t.get("uri") {
        h.uri = f.parse(|s| {
            if s.starts_with('/') && !s.contains(|c: char| c.is_whitespace() || c.is_control()) {
                Ok(s.to_string())
            } else {
                Err(format!("{s:?} is not a request URI: it starts with '/' and has no spaces, e.g. \"/health\""))
            }
        })?;
    }
    if let Some(f) = t.get("method") {
        h.method = f.parse(|s| {
            let upper = s.to_ascii_uppercase();
            if upper != s && HTTP_METHODS.contains(&upper.as_str()) {
                // Methods are case-sensitive (RFC 9110 §9.1): servers answer "get" with 400
                // or 501, a probe that could never pass.
                Err(format!(
                    "{s:?}: HTTP methods are case-sensitive; write \"{upper}\""
                ))
            } else if values::http_token(s) {
                Ok(s.to_string())
            } else {
                Err(format!(
                    "{s:?} is not an HTTP method, e.g. \"GET\" or \"HEAD\""
                ))
            }
        })?;
    }
    if let Some(f) = t.get("headers") {
        let table = f.table().map_err(|_| {
            f.err("must be a table, e.g. headers = { \"X-Probe\" = \"lb\", \"X-Key\" = { env = \"PROBE_KEY\" } }")
        })?;
        for (name, v) in table.entries() {
            if !values::http_token(name) {
                return Err(v.err(format!("{name:?} is not an HTTP header name")));
            }
            if name.eq_ignore_ascii_case("host") {
                return Err(v.err("set the Host header with the probe's `host` key"));
            }
            if let Some((prev, _)) = h.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
                return Err(v.err(format!("header {name:?} is set twice (also {prev:?})")));
            }
            if let Some((prev, _)) = h
                .secret_headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                return Err(v.err(format!("header {name:?} is set twice (also {prev:?})")));
            }
            match header_value(&v)? {
                HeaderValue::Plain(value) => h.headers.push((name.to_string(), value)),
                HeaderValue::Secret(value) => h.secret_headers.push((name.to_string(), value)),
            }
        }
    }
    h.body = opt(t, "body", |f| f.str().map(|s| s.as_bytes().to_vec()))?;
    h.host = opt(t, "host", |f| {
        f.parse(|s| {
            if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c.is_control()) {
                Err(format!(
                    "{s:?} is not a Host header value (non-empty, no spaces)"
                ))
            } else {
                Ok(s.to_string())
            }
        })
    })?;
    h.tls = opt(t, "tls", Field::bool)?.unwrap_or(false);
    h.sni = opt(t, "sni", |f| {
        f.parse(|s| {
            values::dns_name(s).map(|()| s.to_string()).map_err(|e| {
                format!(
                    "{e} (sni is a DNS name, never an IP address; without sni and a Host \
                         header the certificate is checked against the server's address)"
                )
            })
        })
    })?;
    h.verify = opt(t, "verify", Field::bool)?.unwrap_or(true);
    if let Some(f) = t.get("expect_status") {
        let items = if f.is_array() {
            f.array()?
        } else {
            vec![f.clone()]
        };
        if items.is_empty() {
            return Err(f.err("must list at least one status, e.g. [\"200-299\"]"));
        }
        h.expect_status = items
            .iter()
            .map(|e| match e.as_int_opt() {
                Some(n) => values::status_code(n).map_err(|m| e.err(m)),
                None if e.as_str_opt().is_some() => e.parse(values::status_range),
                None => {
                    Err(e.err("must be a status code such as 200 or a range such as \"200-299\""))
                }
            })
            .collect::<R<_>>()?;
    }
    h.expect_body = opt(t, "expect_body", regex)?;
    if h.method == "HEAD"
        && let Some(f) = t.get("expect_body")
    {
        return Err(f.err(
            "can never match with method = \"HEAD\": a HEAD response has no body \
             (use GET, or check the status only)",
        ));
    }
    if let Some(n) = opt(t, "max_body", size)? {
        h.max_body = n;
    }
    if h.expect_body.is_some() && h.max_body == 0 {
        let f = t.get("max_body").expect("0 came from the field");
        return Err(f.err("must be more than 0 when expect_body is set"));
    }
    Ok(())
}
