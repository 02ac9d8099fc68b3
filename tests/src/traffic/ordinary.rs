//! Ordinary client traffic, as real users make it: loops that open new TCP connections
//! one after the other (with a user's pause, [`ORDINARY_GAP`]) from OS-chosen ephemeral
//! ports (as a browser or curl does), each sending
//! one `GET /` and reading the answer until the backend closes; and keep-alive clients
//! that each hold one connection and send a request every ~100 ms on it (reconnecting
//! when the backend closes it cleanly after announcing `Connection: close`).
//!
//! Every request is recorded with its wall-clock start, latency, and the backend that
//! answered or why it failed (and, on a keep-alive connection, the backend it was
//! expected to reach). A [`Report`] answers "how many failed, and why", "after t, did a
//! new connection still go to b2?" and gives latency percentiles.
//!
//! Bounded: every loop stops at its duration, at its request cap, when told, or on
//! Ctrl-C; each connect and read is bounded by the request timeout.

use std::{
    collections::BTreeMap,
    fmt::{self, Write as _},
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::{net::netns::NetNs, traffic::pacer::wall_now};

/// Longest answer read (head and body); the testserver's are under 200 bytes.
const MAX_ANSWER: usize = 4096;

/// Pause between two connections of one loop: a user's pace, not a load generator's.
///
/// On this test network a connection takes well under a millisecond, so strictly back
/// to back three loops open 6,000–9,000 connections a second from one address. That is
/// a load test, and a nat balancer rightly refuses it: a backend that closes first holds
/// the backend-side 5-tuple in `TIME_WAIT` for 60 s, so 10,000 source ports toward four
/// backends carry at most about 40,000 / 60 s ≈ 650 such connections a second, and a
/// per-client rate limit applies before that. With 25 ms the three loops open about 115
/// connections a second (a busy browser user each), about 7,000 a minute.
pub const ORDINARY_GAP: Duration = Duration::from_millis(25);

/// What the clients do.
#[derive(Clone, Debug)]
pub struct OrdinaryConfig {
    /// The service's address (VIP:port).
    pub vip: SocketAddr,
    /// Loops opening one new connection per request, one after the other.
    pub new_loops: usize,
    /// Pause between two connections of one loop (0: strictly back to back).
    pub gap: Duration,
    /// Clients holding one keep-alive connection each.
    pub keepalive_clients: usize,
    /// Time between two requests of a keep-alive client.
    pub keepalive_every: Duration,
    /// Bound on each connect and each answer; past it the request failed.
    pub timeout: Duration,
    /// No request starts after this.
    pub duration: Duration,
    /// At most this many requests per loop or client.
    pub max_requests: usize,
}

impl OrdinaryConfig {
    /// Three loops of new connections, each the next as soon as the previous answer is
    /// in plus [`ORDINARY_GAP`], and two keep-alive clients at 100 ms; 3 s per request
    /// (a dropped SYN is retransmitted after 1 s: slow, not failed).
    pub fn new(vip: SocketAddr, duration: Duration) -> Self {
        OrdinaryConfig {
            vip,
            new_loops: 3,
            gap: ORDINARY_GAP,
            keepalive_clients: 2,
            keepalive_every: Duration::from_millis(100),
            timeout: Duration::from_secs(3),
            duration,
            max_requests: 1_000_000,
        }
    }
}

/// Who made a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Client {
    /// A new connection of loop `i`.
    NewConn(usize),
    /// A request of keep-alive client `i`.
    KeepAlive(usize),
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The SYN was answered with a reset (a closed port).
    Refused,
    /// Reset after the handshake (while sending or reading).
    Reset,
    /// No handshake or no complete answer within the timeout.
    TimedOut,
    /// Closed by the other side before a complete answer.
    Closed,
    /// An answer that is not the testserver's `200 <name>`.
    BadAnswer(String),
    /// Any other error.
    Other(String),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Refused => f.write_str("refused"),
            Cause::Reset => f.write_str("reset"),
            Cause::TimedOut => f.write_str("timed out"),
            Cause::Closed => f.write_str("closed before the answer"),
            Cause::BadAnswer(a) => write!(f, "bad answer {a:?}"),
            Cause::Other(e) => write!(f, "{e}"),
        }
    }
}

impl Cause {
    fn of(err: &io::Error) -> Cause {
        match err.kind() {
            io::ErrorKind::ConnectionRefused => Cause::Refused,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Cause::Reset,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Cause::TimedOut,
            io::ErrorKind::UnexpectedEof => Cause::Closed,
            _ => Cause::Other(err.to_string()),
        }
    }
}

/// A failed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub cause: Cause,
    /// The backend the request should have reached, when known: the one that answered
    /// the previous request on the same keep-alive connection.
    pub expected: Option<String>,
}

/// One request.
#[derive(Clone, Debug)]
pub struct Request {
    pub client: Client,
    /// Wall-clock start, seconds since the Unix epoch (the agent's event clock).
    pub at: f64,
    /// From the start (connect included for a new connection) to the complete answer
    /// or the failure.
    pub latency: Duration,
    /// The backend that answered, or the failure.
    pub result: Result<String, Failure>,
}

/// The clients running in the background; [`finish`](Self::finish) stops them and
/// returns the [`Report`]. Dropping it stops them too.
pub struct Ordinary {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<Vec<Request>>>,
    started: f64,
}

impl Ordinary {
    /// Starts every loop and client in `ns` (each on its own thread inside the namespace).
    pub fn start(ns: &NetNs, cfg: &OrdinaryConfig) -> Ordinary {
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        let clients = (0..cfg.new_loops)
            .map(Client::NewConn)
            .chain((0..cfg.keepalive_clients).map(Client::KeepAlive));
        for client in clients {
            let (ns, cfg, stop) = (ns.clone(), cfg.clone(), Arc::clone(&stop));
            let handle = thread::Builder::new()
                .name(format!("ordinary-{client:?}"))
                .spawn(move || {
                    ns.run(|| match client {
                        Client::NewConn(_) => new_conn_loop(client, &cfg, &stop),
                        Client::KeepAlive(_) => keepalive_loop(client, &cfg, &stop),
                    })
                    .unwrap_or_else(|e| panic!("entering the client namespace: {e}"))
                })
                .expect("spawning a client thread");
            handles.push(handle);
        }
        Ordinary {
            stop,
            handles,
            started: wall_now(),
        }
    }

    /// Waits until every loop reached its duration or cap (or `stop_now`), and returns
    /// every request.
    pub fn finish(mut self, stop_now: bool) -> Report {
        if stop_now {
            self.stop.store(true, Ordering::Relaxed);
        }
        let mut requests = Vec::new();
        for h in self.handles.drain(..) {
            match h.join() {
                Ok(r) => requests.extend(r),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        requests.sort_by(|a, b| a.at.total_cmp(&b.at));
        Report {
            started: self.started,
            ended: wall_now(),
            requests,
        }
    }
}

impl Drop for Ordinary {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn should_stop(start: Instant, cfg: &OrdinaryConfig, stop: &AtomicBool, done: usize) -> bool {
    stop.load(Ordering::Relaxed)
        || start.elapsed() >= cfg.duration
        || done >= cfg.max_requests
        || crate::util::interrupt::requested()
}

fn new_conn_loop(client: Client, cfg: &OrdinaryConfig, stop: &AtomicBool) -> Vec<Request> {
    let start = Instant::now();
    let mut out = Vec::new();
    while !should_stop(start, cfg, stop, out.len()) {
        let (at, t0) = (wall_now(), Instant::now());
        let result = one_shot(cfg.vip, cfg.timeout).map_err(|cause| Failure {
            cause,
            expected: None,
        });
        out.push(Request {
            client,
            at,
            latency: t0.elapsed(),
            result,
        });
        if !cfg.gap.is_zero() {
            thread::sleep(cfg.gap);
        }
    }
    out
}

/// One new connection (ephemeral source port), one `GET /`, the answer read until the
/// backend closes.
fn one_shot(vip: SocketAddr, timeout: Duration) -> Result<String, Cause> {
    let mut stream = connect(vip, timeout)?;
    let request = format!("GET / HTTP/1.1\r\nHost: {vip}\r\nUser-Agent: lb-tests\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| Cause::of(&e))?;
    let mut raw = Vec::new();
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).map_err(|e| Cause::of(&e))?;
        if n == 0 {
            break; // the backend closed, as it does after every answer
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.len() > MAX_ANSWER {
            return Err(Cause::BadAnswer(
                String::from_utf8_lossy(&raw[..80]).into_owned(),
            ));
        }
        if Instant::now() > deadline {
            return Err(Cause::TimedOut);
        }
    }
    let (name, _) = parse_answer(&raw)?;
    Ok(name)
}

fn connect(vip: SocketAddr, timeout: Duration) -> Result<TcpStream, Cause> {
    let stream = TcpStream::connect_timeout(&vip, timeout).map_err(|e| Cause::of(&e))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .and_then(|()| stream.set_nodelay(true))
        .map_err(|e| Cause::of(&e))?;
    Ok(stream)
}

/// The backend's name and whether it keeps the connection open, from a complete answer;
/// `Closed` when it is incomplete.
fn parse_answer(raw: &[u8]) -> Result<(String, bool), Cause> {
    let text = String::from_utf8_lossy(raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(if raw.is_empty() {
            Cause::Closed
        } else {
            Cause::BadAnswer(text.chars().take(80).collect())
        });
    };
    let mut lines = head.lines();
    if lines.next().is_none_or(|l| !l.starts_with("HTTP/1.1 200")) {
        return Err(Cause::BadAnswer(head.chars().take(80).collect()));
    }
    let mut length = None;
    let mut keep = false;
    for l in lines {
        let lower = l.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse::<usize>().ok();
        } else if let Some(v) = lower.strip_prefix("connection:") {
            keep = v.contains("keep-alive");
        }
    }
    match length {
        Some(n) if body.len() == n && body.ends_with('\n') && n > 1 => {
            Ok((body.trim_end().to_owned(), keep))
        }
        Some(n) if body.len() < n => Err(Cause::Closed),
        _ => Err(Cause::BadAnswer(text.chars().take(80).collect())),
    }
}

/// A keep-alive connection and the backend that last answered on it.
struct Held {
    stream: TcpStream,
    backend: Option<String>,
}

fn keepalive_loop(client: Client, cfg: &OrdinaryConfig, stop: &AtomicBool) -> Vec<Request> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut held: Option<Held> = None;
    while !should_stop(start, cfg, stop, out.len()) {
        let (at, t0) = (wall_now(), Instant::now());
        let expected = held.as_ref().and_then(|h| h.backend.clone());
        let result = keepalive_request(cfg, &mut held);
        let result = result.map_err(|cause| {
            held = None; // a broken connection is not used again
            Failure { cause, expected }
        });
        out.push(Request {
            client,
            at,
            latency: t0.elapsed(),
            result,
        });
        let spent = t0.elapsed();
        if spent < cfg.keepalive_every {
            thread::sleep(cfg.keepalive_every - spent);
        }
    }
    out
}

/// One request on the held connection (opened first when there is none); drops the
/// connection after an answer that announced `Connection: close`.
fn keepalive_request(cfg: &OrdinaryConfig, held: &mut Option<Held>) -> Result<String, Cause> {
    if held.is_none() {
        *held = Some(Held {
            stream: connect(cfg.vip, cfg.timeout)?,
            backend: None,
        });
    }
    let h = held.as_mut().expect("just opened");
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {}\r\nUser-Agent: lb-tests\r\nConnection: keep-alive\r\n\r\n",
        cfg.vip
    );
    h.stream
        .write_all(request.as_bytes())
        .map_err(|e| Cause::of(&e))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 1024];
    let (name, keep) = loop {
        match parse_answer(&raw) {
            Ok(done) => break done,
            Err(Cause::Closed) if raw.len() > MAX_ANSWER => {
                return Err(Cause::BadAnswer(
                    String::from_utf8_lossy(&raw[..80]).into_owned(),
                ));
            }
            Err(Cause::Closed) => {} // incomplete: read on
            Err(other) => return Err(other),
        }
        let n = h.stream.read(&mut buf).map_err(|e| Cause::of(&e))?;
        if n == 0 {
            return Err(Cause::Closed);
        }
        raw.extend_from_slice(&buf[..n]);
    };
    if keep {
        h.backend = Some(name.clone());
    } else {
        *held = None; // announced close: the next request reconnects
    }
    Ok(name)
}

/// One keep-alive connection held on purpose on a chosen backend (the keep-alive
/// scenarios watch it while that backend's probe fails).
pub struct PinnedConn {
    held: Option<Held>,
    cfg: OrdinaryConfig,
    backend: String,
}

impl PinnedConn {
    /// Opens keep-alive connections from `ns` to `vip` (one request each) until one is
    /// answered by `backend`, at most `tries`; the others are closed.
    pub fn open_on(
        ns: &NetNs,
        vip: SocketAddr,
        backend: &str,
        tries: usize,
    ) -> Result<PinnedConn, String> {
        let cfg = OrdinaryConfig::new(vip, Duration::from_secs(3600));
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..tries {
            let mut held = None;
            let name = ns
                .run(|| keepalive_request(&cfg, &mut held))
                .map_err(|e| e.to_string())?
                .map_err(|cause| format!("a keep-alive request to {vip}: {cause}"))?;
            if name == backend && held.is_some() {
                return Ok(PinnedConn {
                    held,
                    cfg,
                    backend: name,
                });
            }
            *seen.entry(name).or_default() += 1;
        }
        Err(format!(
            "none of {tries} keep-alive connections to {vip} reached {backend}: {seen:?}"
        ))
    }

    /// One request on the held connection; `Err` when it fails or when the backend
    /// closed it (the scenarios send fewer requests than the server's keep-alive cap).
    pub fn request(&mut self) -> Result<String, Cause> {
        if self.held.is_none() {
            return Err(Cause::Other(format!(
                "the connection to {} is gone",
                self.backend
            )));
        }
        let name = keepalive_request(&self.cfg, &mut self.held).inspect_err(|_| {
            self.held = None; // a broken connection is not used again
        })?;
        if self.held.is_none() {
            return Err(Cause::Other(format!(
                "{} closed the connection after answering",
                self.backend
            )));
        }
        Ok(name)
    }
}

impl PinnedConn {
    /// A request every `every` for `span` (bounded by both); every answer in order.
    pub fn requests_for(&mut self, span: Duration, every: Duration) -> Vec<Result<String, Cause>> {
        let start = Instant::now();
        let mut out = Vec::new();
        while start.elapsed() < span && !crate::util::interrupt::requested() {
            out.push(self.request());
            thread::sleep(every);
        }
        out
    }
}

/// `n of m answered by NAME, first failure: …` for a pinned connection's answers.
pub fn held_summary(answers: &[Result<String, Cause>], name: &str) -> String {
    let ok = answers.iter().filter(|a| a.as_deref() == Ok(name)).count();
    format!(
        "{ok} of {} answered by {name}, first other: {:?}",
        answers.len(),
        answers.iter().find(|a| a.as_deref() != Ok(name))
    )
}

/// Every request of a run.
#[derive(Clone, Debug)]
pub struct Report {
    /// Wall-clock start and end of the run.
    pub started: f64,
    pub ended: f64,
    /// In order of their start.
    pub requests: Vec<Request>,
}

impl Report {
    /// The failed requests.
    pub fn failures(&self) -> impl Iterator<Item = (&Request, &Failure)> {
        self.requests
            .iter()
            .filter_map(|r| r.result.as_ref().err().map(|f| (r, f)))
    }

    /// Requests per answering backend.
    pub fn per_backend(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for r in &self.requests {
            if let Ok(name) = &r.result {
                *out.entry(name.clone()).or_default() += 1;
            }
        }
        out
    }

    /// New connections started at or after `t` (wall clock) that `backend` answered.
    pub fn new_conns_to_since(&self, backend: &str, t: f64) -> Vec<&Request> {
        self.requests
            .iter()
            .filter(|r| matches!(r.client, Client::NewConn(_)) && r.at >= t)
            .filter(|r| r.result.as_ref().is_ok_and(|n| n == backend))
            .collect()
    }

    /// The requests of keep-alive client `i`.
    pub fn keepalive(&self, i: usize) -> impl Iterator<Item = &Request> {
        self.requests
            .iter()
            .filter(move |r| r.client == Client::KeepAlive(i))
    }

    /// The `q`-quantile (0..=1) of the latency of answered requests.
    pub fn latency(&self, q: f64) -> Duration {
        let mut all: Vec<Duration> = self
            .requests
            .iter()
            .filter(|r| r.result.is_ok())
            .map(|r| r.latency)
            .collect();
        if all.is_empty() {
            return Duration::ZERO;
        }
        all.sort();
        let i = ((all.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        all[i]
    }

    /// One paragraph: counts, rate, per backend, latency, and the failures (first 20),
    /// times relative to the run's start.
    pub fn summary(&self) -> String {
        let secs = (self.ended - self.started).max(0.001);
        let failed = self.failures().count();
        let new = self
            .requests
            .iter()
            .filter(|r| matches!(r.client, Client::NewConn(_)))
            .count();
        let mut out = format!(
            "{} requests in {secs:.1} s ({:.0}/s; {new} new connections, {} on keep-alive), \
             {failed} failed; latency p50 {:?} p99 {:?} max {:?}\n  per backend: {:?}\n",
            self.requests.len(),
            self.requests.len() as f64 / secs,
            self.requests.len() - new,
            self.latency(0.5),
            self.latency(0.99),
            self.latency(1.0),
            self.per_backend(),
        );
        let mut causes: BTreeMap<String, usize> = BTreeMap::new();
        for (_, f) in self.failures() {
            *causes.entry(f.cause.to_string()).or_default() += 1;
        }
        if !causes.is_empty() {
            let _ = writeln!(out, "  failures by cause: {causes:?}");
        }
        for (r, f) in self.failures().take(20) {
            let _ = writeln!(
                out,
                "  failed at +{:.2} s ({:?}, after {:?}): {}{}",
                r.at - self.started,
                r.client,
                r.latency,
                f.cause,
                f.expected
                    .as_ref()
                    .map(|b| format!(", expected {b}"))
                    .unwrap_or_default()
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_or_say_why_not() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nb1\n";
        assert_eq!(parse_answer(ok), Ok(("b1".to_owned(), false)));
        let keep = b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nb2\n";
        assert_eq!(parse_answer(keep), Ok(("b2".to_owned(), true)));
        assert_eq!(parse_answer(b""), Err(Cause::Closed));
        assert_eq!(
            parse_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nb"),
            Err(Cause::Closed)
        );
        assert!(matches!(
            parse_answer(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"),
            Err(Cause::BadAnswer(_))
        ));
    }

    #[test]
    fn report_counts_and_filters() {
        let req = |client, at, result: Result<&str, Cause>| Request {
            client,
            at,
            latency: Duration::from_millis(at as u64),
            result: result.map(str::to_owned).map_err(|cause| Failure {
                cause,
                expected: None,
            }),
        };
        let r = Report {
            started: 0.0,
            ended: 10.0,
            requests: vec![
                req(Client::NewConn(0), 1.0, Ok("b1")),
                req(Client::NewConn(1), 2.0, Ok("b2")),
                req(Client::KeepAlive(0), 3.0, Ok("b2")),
                req(Client::NewConn(0), 4.0, Err(Cause::Refused)),
                req(Client::NewConn(0), 5.0, Ok("b2")),
            ],
        };
        assert_eq!(r.failures().count(), 1);
        assert_eq!(r.per_backend().get("b2"), Some(&3));
        assert_eq!(r.new_conns_to_since("b2", 2.5).len(), 1);
        assert_eq!(r.keepalive(0).count(), 1);
        assert_eq!(r.latency(1.0), Duration::from_millis(5));
        assert!(r.summary().contains("refused"), "{}", r.summary());
    }
}
