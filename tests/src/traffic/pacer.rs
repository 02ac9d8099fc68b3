//! Steady client traffic with a timeline: one new TCP connection every `every`, started
//! on its own thread so a connection that hangs never delays the next one, each recorded
//! with its wall-clock start and end and what came of it (the greeting backend's name,
//! a refusal, a timeout…). The health scenarios line these records up with the agent's
//! transition times.
//!
//! Bounded: at most `count` connections, none started after `limit`, each connect and
//! read bounded by `connect_timeout`; [`Pacer::finish`] (or drop) stops it early.

use std::{
    fmt,
    io::{self, Read},
    net::{IpAddr, SocketAddr, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{net::netns::NetNs, util::error::Error};

/// Seconds since the Unix epoch, now (the clock the agent's event times use).
pub fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What one connection came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Greeted by the backend of this name.
    Answered(String),
    /// The SYN was answered with RST: a backend whose port is closed.
    Refused,
    /// No handshake or no greeting within the connect timeout.
    TimedOut,
    /// Anything else (reset after the handshake, closed before the greeting…).
    Failed(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Answered(name) => write!(f, "answered by {name}"),
            Outcome::Refused => f.write_str("refused"),
            Outcome::TimedOut => f.write_str("timed out"),
            Outcome::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

/// One connection of the timeline.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// Its client source port.
    pub port: u16,
    /// Wall-clock seconds just before `connect`.
    pub start: f64,
    /// Wall-clock seconds when the outcome was known.
    pub end: f64,
    pub outcome: Outcome,
}

impl Attempt {
    /// Greeted by `name`.
    pub fn answered_by(&self, name: &str) -> bool {
        matches!(&self.outcome, Outcome::Answered(n) if n == name)
    }

    pub fn refused(&self) -> bool {
        self.outcome == Outcome::Refused
    }
}

/// What to send.
#[derive(Clone, Copy, Debug)]
pub struct PaceConfig {
    /// Client address; connections bind `src:first_port + i`.
    pub src: IpAddr,
    pub first_port: u16,
    pub dst: SocketAddr,
    /// One new connection this often.
    pub every: Duration,
    /// At most this many connections.
    pub count: usize,
    /// No connection starts later than this after the first.
    pub limit: Duration,
    /// Bound of the connect and of the greeting read.
    pub connect_timeout: Duration,
}

/// A running timeline; stopped and joined by [`finish`](Self::finish) or on drop.
pub struct Pacer {
    stop: Arc<AtomicBool>,
    attempts: Arc<Mutex<Vec<Attempt>>>,
    handle: Option<JoinHandle<Result<(), Error>>>,
}

impl Pacer {
    /// Starts sending from namespace `ns` in the background.
    pub fn start(ns: &NetNs, cfg: PaceConfig) -> Pacer {
        let stop = Arc::new(AtomicBool::new(false));
        let attempts = Arc::new(Mutex::new(Vec::with_capacity(cfg.count)));
        let (ns, thread_stop, thread_attempts) = (ns.clone(), stop.clone(), attempts.clone());
        let handle = thread::Builder::new()
            .name("pacer".into())
            .spawn(move || ns.run(|| pace(cfg, &thread_stop, &thread_attempts)))
            .expect("spawning the pacer thread");
        Pacer {
            stop,
            attempts,
            handle: Some(handle),
        }
    }

    /// The connections whose outcome is known so far, in start order.
    pub fn attempts(&self) -> Vec<Attempt> {
        let mut v = self
            .attempts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        v.sort_by(|a, b| a.start.total_cmp(&b.start));
        v
    }

    /// Stops starting connections, waits for those in flight, returns all in start order.
    pub fn finish(mut self) -> Vec<Attempt> {
        self.join();
        self.attempts()
    }

    fn join(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(err)) => panic!("the pacer could not enter the client namespace: {err}"),
                Err(payload) => std::panic::resume_unwind(payload),
            }
        }
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        if thread::panicking() {
            // Do not panic again while unwinding; still wait for the threads.
            self.stop.store(true, Ordering::SeqCst);
            if let Some(h) = self.handle.take() {
                let _ = h.join();
            }
        } else {
            self.join();
        }
    }
}

/// Runs on a thread inside the client namespace; threads it spawns inherit it.
fn pace(cfg: PaceConfig, stop: &AtomicBool, out: &Mutex<Vec<Attempt>>) {
    let begin = Instant::now();
    thread::scope(|scope| {
        for i in 0..cfg.count {
            let due = begin + cfg.every * i as u32;
            while let Some(left) = due.checked_duration_since(Instant::now()) {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                thread::sleep(left.min(Duration::from_millis(5)));
            }
            if stop.load(Ordering::SeqCst)
                || begin.elapsed() > cfg.limit
                || crate::util::interrupt::requested()
            {
                return;
            }
            let Some(port) = u16::try_from(i)
                .ok()
                .and_then(|i| cfg.first_port.checked_add(i))
            else {
                return;
            };
            scope.spawn(move || {
                let start = wall_now();
                let outcome =
                    connect_once(SocketAddr::new(cfg.src, port), cfg.dst, cfg.connect_timeout);
                let attempt = Attempt {
                    port,
                    start,
                    end: wall_now(),
                    outcome,
                };
                out.lock().unwrap_or_else(|e| e.into_inner()).push(attempt);
            });
        }
    });
}

fn connect_once(src: SocketAddr, dst: SocketAddr, timeout: Duration) -> Outcome {
    match greet(src, dst, timeout) {
        Ok(name) => Outcome::Answered(name),
        Err(err) => match err.kind() {
            io::ErrorKind::ConnectionRefused => Outcome::Refused,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Outcome::TimedOut,
            _ => Outcome::Failed(err.to_string()),
        },
    }
}

/// Connects from `src` to `dst` and reads the greeting line (the backend's name).
pub(crate) fn greet(src: SocketAddr, dst: SocketAddr, timeout: Duration) -> io::Result<String> {
    let socket = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&SockAddr::from(src))?;
    socket.connect_timeout(&SockAddr::from(dst), timeout)?;
    let mut stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(timeout))?;
    let mut line = Vec::new();
    let mut buf = [0u8; 256];
    while !line.contains(&b'\n') && line.len() < 4096 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        line.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&line);
    let name = text.lines().next().unwrap_or("").trim().to_owned();
    if name.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed before the backend's name",
        ));
    }
    Ok(name)
}

/// Per-outcome counts of `attempts`, one line (`b1 120, b3 118, refused 4, …`).
pub fn summary(attempts: &[Attempt]) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for a in attempts {
        let key = match &a.outcome {
            Outcome::Answered(n) => n.clone(),
            Outcome::Refused => "refused".into(),
            Outcome::TimedOut => "timed out".into(),
            Outcome::Failed(_) => "failed".into(),
        };
        *counts.entry(key).or_default() += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    format!("{} connections: {}", attempts.len(), parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: f64, outcome: Outcome) -> Attempt {
        Attempt {
            port: 1,
            start,
            end: start,
            outcome,
        }
    }

    #[test]
    fn summary_counts_outcomes() {
        let v = [
            at(1.0, Outcome::Answered("b1".into())),
            at(2.0, Outcome::Answered("b1".into())),
            at(3.0, Outcome::Refused),
            at(4.0, Outcome::TimedOut),
        ];
        assert_eq!(summary(&v), "4 connections: b1 2, refused 1, timed out 1");
        assert!(v[0].answered_by("b1") && !v[0].answered_by("b2") && v[2].refused());
    }
}
