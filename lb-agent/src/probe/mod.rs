//! Active probes: one execution of a probe against a server ([`execute`]) and the
//! per-(server, probe) scheduler ([`spawn`]), DESIGN.md §5.
//!
//! Every probe is bounded by its `timeout` as a whole (connect, request, response),
//! reads at most `max_body` / `max_response` bytes, and never follows redirects, so a
//! peer that never answers, streams forever or answers garbage costs one timeout
//! and a bounded buffer.
//!
//! Layout: [`http`] (HTTP/1.1 over hyper, optionally TLS through [`tls`]), [`stream`]
//! (tcp connect), [`syn`] (tcp SYN check, for plain tcp probes), [`datagram`] (udp), [`icmp`] (echo), [`schedule`] (the tasks).

pub mod condition;
mod datagram;
mod http;
mod icmp;
mod lag;
mod local;
mod reply_prefix;
mod schedule;
mod stamps;
mod stream;
pub mod syn;
mod tls;
mod tunnel_echo;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{ProbeConfig, ProbeKind};

pub use local::on_time_slack;
pub use schedule::{
    MIN_INTERVAL, NetProber, OVERDUE, PROMPT_SPREAD, ProbeReport, ProbeTask, Prober, ServerKey,
    ServerSignals, SharedSignals, first_run_offset, spawn, spawn_spread, spawn_with,
};

/// The verdict of one probe execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOutcome {
    /// The probe passed.
    pub ok: bool,
    /// From the start of the probe to its verdict (the timeout when it timed out); for a
    /// pass judged by kernel stamps (SYN check, icmp), the answer's receive stamp minus
    /// the request's earliest send.
    pub duration: Duration,
    /// Short reason for logs and the API: "status 200", "status 500", "connection refused",
    /// "timeout", "body did not match".
    pub detail: String,
    /// It failed without waiting for the timeout (refused, bad status, ICMP unreachable…):
    /// the failure is known at once, which is what makes a refusing server leave traffic
    /// faster than a silent one (DESIGN.md §5, detection bound). Always false when `ok`.
    pub immediate: bool,
    /// It failed for a local reason (descriptors, buffers, memory, ports, no route, a
    /// starved agent): no verdict about the server ([`local`](self) module).
    pub local: bool,
}

impl ProbeOutcome {
    /// A passing outcome.
    pub fn pass(duration: Duration, detail: impl Into<String>) -> Self {
        ProbeOutcome {
            ok: true,
            duration,
            detail: detail.into(),
            immediate: false,
            local: false,
        }
    }

    /// A failure known before the timeout.
    pub fn fail(duration: Duration, detail: impl Into<String>) -> Self {
        ProbeOutcome {
            ok: false,
            duration,
            detail: detail.into(),
            immediate: true,
            local: false,
        }
    }

    /// No verdict: the probe could not run properly for a local reason.
    pub fn local_fault(duration: Duration, detail: impl Into<String>) -> Self {
        ProbeOutcome {
            ok: false,
            duration,
            detail: detail.into(),
            immediate: true,
            local: true,
        }
    }

    /// A failure because the timeout elapsed.
    pub fn timed_out(timeout: Duration) -> Self {
        ProbeOutcome {
            ok: false,
            duration: timeout,
            detail: "timeout".into(),
            immediate: false,
            local: false,
        }
    }
}

/// Why a probe failed before its timeout. Its `Display` is the outcome's `detail`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("connection refused")]
    Refused,
    #[error("connect: {source}")]
    Connect {
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("tls: {source}")]
    Tls {
        #[source]
        source: std::io::Error,
    },
    #[error("invalid request: {reason}")]
    Request { reason: String },
    #[error("invalid response: {source}")]
    Http {
        #[source]
        source: hyper::Error,
    },
    #[error("status {code}")]
    Status { code: u16 },
    #[error("body did not match")]
    BodyMismatch,
    #[error("response did not match ({got} bytes, {why})")]
    ResponseMismatch { got: usize, why: &'static str },
    #[error("reply did not match")]
    ReplyMismatch,
    #[error("test failed ({got})")]
    TestFailed { got: String },
    #[error("port unreachable")]
    PortUnreachable,
    #[error("icmp: {source}")]
    Icmp {
        #[source]
        source: std::io::Error,
    },
    #[error("SYN check unavailable ({why})")]
    SynUnavailable { why: &'static str },
    #[error("invalid expect pattern: {source}")]
    Pattern {
        #[source]
        source: regex::Error,
    },
    /// Judged by kernel stamps: the server had its whole timeout and did not answer.
    #[error("timeout")]
    TimedOut,
    /// Judged by kernel stamps: the agent was too late to tell (a local fault).
    #[error("{detail}")]
    Late { detail: String },
}

impl ProbeError {
    /// Why this error is a local fault (the agent's host, not the server), if it is.
    fn local_cause(&self, target: SocketAddr) -> Option<String> {
        let io = match self {
            ProbeError::Connect { source }
            | ProbeError::Io { source, .. }
            | ProbeError::Tls { source }
            | ProbeError::Icmp { source } => source,
            ProbeError::Http { source } => std::error::Error::source(source)?.downcast_ref()?,
            // tcp_check = "syn" on a host that cannot: the server is not to blame.
            ProbeError::SynUnavailable { .. } => return Some(format!("local fault: {self}")),
            _ => return None,
        };
        local::cause(io, target)
    }

    /// What kernel stamps that did not pass a probe say.
    fn judged(judged: stamps::Judged) -> Self {
        match judged {
            stamps::Judged::Unknowable(detail) => ProbeError::Late { detail },
            stamps::Judged::TimedOut | stamps::Judged::InTime(_) => ProbeError::TimedOut,
        }
    }

    /// Maps a connect error: a refusal is its own, common, verdict.
    fn connect(source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::ConnectionRefused {
            ProbeError::Refused
        } else {
            ProbeError::Connect { source }
        }
    }
}

/// What a kind-specific probe returns: the passing detail, or why it failed.
type Verdict = Result<String, ProbeError>;

/// A pass judged by kernel stamps: its detail and the measured round trip.
#[derive(Debug)]
pub(crate) struct Passed {
    pub detail: String,
    /// The answer's receive stamp minus the request's send stamp (`None`: no stamps).
    pub rtt: Option<Duration>,
}

/// Runs `cfg` once against `target` (the server's address; `cfg.port` replaces its port),
/// bounded by `cfg.timeout` as a whole. The SYN check and icmp are judged by the kernel's
/// stamps of their packets; the others by the agent's timer, whose lateness beyond
/// [`on_time_slack`] makes a timeout a local fault (docs/local-faults.md).
pub async fn execute(cfg: &ProbeConfig, target: SocketAddr) -> ProbeOutcome {
    let addr = SocketAddr::new(target.ip(), cfg.port.unwrap_or(target.port()));
    let start = Instant::now();
    let stamped = match cfg.kind {
        ProbeKind::Tcp => match syn::route(cfg, addr) {
            Some(Ok(checker)) => Some(syn::probe(checker, addr, cfg.timeout).await),
            Some(Err(e)) => Some(Err(e)),
            None => None,
        },
        ProbeKind::Icmp => match cfg.tunnel {
            // Through the tunnel when the inner packet can be of the server's family.
            Some(t) if t.vip.is_ipv4() == addr.ip().is_ipv4() => {
                Some(Box::pin(tunnel_echo::probe(t, addr.ip(), cfg.timeout)).await)
            }
            _ => Some(Box::pin(icmp::probe(addr.ip(), cfg.timeout)).await),
        },
        _ => None,
    };
    if let Some(result) = stamped {
        return match result {
            Ok(p) => ProbeOutcome::pass(p.rtt.unwrap_or_else(|| start.elapsed()), p.detail),
            Err(ProbeError::TimedOut) => ProbeOutcome::timed_out(cfg.timeout),
            Err(e) => failed(e, addr, start),
        };
    }
    // The large futures (http with TLS, tcp and udp with their buffers) are boxed for the
    // length of one probe, so that every idle probe task stays small: at 100,000 tasks
    // the task's future is most of the agent's memory.
    // The SYN check's future is small and runs unboxed.
    let run = async {
        match cfg.kind {
            ProbeKind::Http => Box::pin(http::probe(cfg, addr)).await,
            ProbeKind::Tcp => Box::pin(stream::probe(cfg, addr)).await,
            ProbeKind::Udp => Box::pin(datagram::probe(cfg, addr)).await,
            ProbeKind::Icmp => unreachable!("icmp is judged by stamps"),
        }
    };
    let deadline = start + cfg.timeout;
    match tokio::time::timeout_at(deadline, run).await {
        Ok(Ok(detail)) => ProbeOutcome::pass(start.elapsed(), detail),
        Ok(Err(e)) => failed(e, addr, start),
        // udp: silence is the answer when no reply is expected (only an ICMP
        // port-unreachable would have failed it).
        Err(_) if cfg.kind == ProbeKind::Udp && cfg.expect.is_none() && cfg.test.is_none() => {
            ProbeOutcome::pass(cfg.timeout, "no reply (none expected)")
        }
        Err(_) => {
            let late = Instant::now().saturating_duration_since(deadline);
            match local::late_timeout(cfg.timeout, late) {
                Some(detail) => ProbeOutcome::local_fault(start.elapsed(), detail),
                None => ProbeOutcome::timed_out(cfg.timeout),
            }
        }
    }
}

/// The outcome of a probe that failed with `e` before its timeout.
fn failed(e: ProbeError, addr: SocketAddr, start: Instant) -> ProbeOutcome {
    if let ProbeError::Late { detail } = e {
        return ProbeOutcome::local_fault(start.elapsed(), detail);
    }
    match e.local_cause(addr) {
        Some(cause) => ProbeOutcome::local_fault(start.elapsed(), format!("{cause}: {e}")),
        None => ProbeOutcome::fail(start.elapsed(), e.to_string()),
    }
}

/// Whether a tcp probe's `expect` fails a wrong reply as soon as its first bytes show it
/// (a pattern anchored at the start); otherwise a wrong reply fails only at the close,
/// at `max_response` or at the timeout.
pub fn expect_decides_early(expect: &regex::Regex) -> bool {
    reply_prefix::ReplyPrefix::new(expect.as_str()).is_some_and(|p| p.decides_early())
}

/// `re` for matching raw bytes (replies need not be UTF-8).
fn bytes_regex(re: &regex::Regex) -> Result<regex::bytes::Regex, ProbeError> {
    regex::bytes::Regex::new(re.as_str()).map_err(|source| ProbeError::Pattern { source })
}
