//! Helpers shared by the config error tests: parse, find the line of a marker, assert
//! line + key + message, and build small valid configs to break.
#![allow(dead_code)]

use std::path::Path;

use lb_agent::config::{ConfigError, parse};

/// The error for `text`; panics if it parses.
pub fn error(text: &str) -> ConfigError {
    match parse(text, Path::new("lb.toml")) {
        Ok(c) => panic!("expected an error, but the config parsed: {c:#?}\n--- text ---\n{text}"),
        Err(e) => e,
    }
}

/// 1-based number of the one line of `text` that contains `marker`.
pub fn line_with(text: &str, marker: &str) -> usize {
    let hits: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "marker {marker:?} must be on exactly one line of:\n{text}"
    );
    hits[0]
}

/// Asserts the error of `text` is on the line holding `marker`, at `key`, and that its
/// message contains every one of `needles`.
#[track_caller]
pub fn check(text: &str, marker: &str, key: &str, needles: &[&str]) {
    let e = error(text);
    let want_line = line_with(text, marker);
    assert_eq!(e.file, Path::new("lb.toml"), "{e}");
    assert_eq!(
        e.line,
        Some(want_line),
        "expected line {want_line} ({marker:?}), got: {e}"
    );
    assert_eq!(e.key.as_deref(), Some(key), "expected key {key}, got: {e}");
    for n in needles {
        assert!(
            e.message.contains(n),
            "expected the message to contain {n:?}, got: {e}"
        );
    }
}

/// A valid nat service; `svc` lines go into `[[service]]`, `rest` follows the first server.
pub fn service(svc: &str, rest: &str) -> String {
    format!(
        "[[service]] # svc0\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n{svc}\n\
         [[service.server]] # srv0\naddress = \"10.0.1.11:8080\"\n{rest}"
    )
}

/// `service("", ..)` plus one probe with `lines`.
pub fn probe(lines: &str) -> String {
    service("", &format!("[[service.probe]] # probe0\n{lines}"))
}
