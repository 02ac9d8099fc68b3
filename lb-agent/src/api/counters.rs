//! Requests and connections the API turned away, by reason (`/metrics`:
//! `lb_api_rejected_total{reason}`).

use std::{
    fmt::Write,
    sync::atomic::{AtomicU64, Ordering},
};

/// Why a connection or request was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// A connection beyond `max_connections` (closed at once).
    ConnectionCap,
    /// No complete request head within `header_timeout` (or an idle keep-alive).
    HeaderTimeout,
    /// Request line and headers beyond `max_header_bytes`/`max_headers`, or malformed.
    BadHead,
    BodyTooLarge,
    BodyTimeout,
    /// A change over TCP without a valid bearer token.
    Unauthorized,
    /// A change over TCP while no `api_token_file` is configured.
    ChangesNeedSocket,
}

const REASONS: [(Rejection, &str); 7] = [
    (Rejection::ConnectionCap, "connection_cap"),
    (Rejection::HeaderTimeout, "header_timeout"),
    (Rejection::BadHead, "bad_head"),
    (Rejection::BodyTooLarge, "body_too_large"),
    (Rejection::BodyTimeout, "body_timeout"),
    (Rejection::Unauthorized, "unauthorized"),
    (Rejection::ChangesNeedSocket, "changes_need_socket"),
];

/// Counts per [`Rejection`], shared by both listeners.
#[derive(Debug, Default)]
pub struct ApiCounters {
    counts: [AtomicU64; REASONS.len()],
}

impl ApiCounters {
    pub fn reject(&self, why: Rejection) {
        let i = REASONS.iter().position(|(r, _)| *r == why).expect("listed");
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, why: Rejection) -> u64 {
        let i = REASONS.iter().position(|(r, _)| *r == why).expect("listed");
        self.counts[i].load(Ordering::Relaxed)
    }

    /// The Prometheus lines.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP lb_api_rejected_total API connections and requests turned away, by reason"
        );
        let _ = writeln!(out, "# TYPE lb_api_rejected_total counter");
        for (i, (_, name)) in REASONS.iter().enumerate() {
            let _ = writeln!(
                out,
                "lb_api_rejected_total{{reason=\"{name}\"}} {}",
                self.counts[i].load(Ordering::Relaxed)
            );
        }
    }
}
