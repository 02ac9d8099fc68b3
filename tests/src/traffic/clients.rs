//! Client-side traffic for the scenarios: many short TCP connections or UDP exchanges
//! that each learn which backend answered, long-lived echo connections, and the tally
//! of backend shares with its check against weights.
//!
//! Every loop is bounded by a count and a deadline. Source ports are chosen explicitly
//! (`first_port + i`), so a run's 5-tuples, and thus the balancer's hash choices, are the
//! same from run to run.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{self, BufRead, BufReader, Write},
    net::{IpAddr, SocketAddr, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{net::netns::NetNs, util::error::Error};

/// Time allowed for one connect, read or UDP answer.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(2);

/// What a batch of exchanges measured.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Answers per backend name.
    pub counts: BTreeMap<String, usize>,
    /// One line per failed exchange: source port and what went wrong.
    pub failures: Vec<String>,
    /// Exchanges attempted (answered + failed).
    pub attempted: usize,
    /// Wall time of the batch.
    pub elapsed: Duration,
}

impl Tally {
    /// Exchanges that got an answer.
    pub fn answered(&self) -> usize {
        self.counts.values().sum()
    }

    /// Share of `name` among answered exchanges, 0.0..=1.0.
    pub fn share(&self, name: &str) -> f64 {
        let answered = self.answered();
        if answered == 0 {
            return 0.0;
        }
        *self.counts.get(name).unwrap_or(&0) as f64 / answered as f64
    }

    /// A small table: backend, weight, expected share, answers, measured share.
    pub fn table(&self, expected: &[(&str, u32)]) -> String {
        let total_weight: u32 = expected.iter().map(|(_, w)| w).sum();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "  {:<8} {:>6} {:>9} {:>8} {:>9}",
            "backend", "weight", "expected", "answers", "measured"
        );
        for (name, weight) in expected {
            let _ = writeln!(
                out,
                "  {:<8} {:>6} {:>8.1}% {:>8} {:>8.1}%",
                name,
                weight,
                100.0 * f64::from(*weight) / f64::from(total_weight.max(1)),
                self.counts.get(*name).unwrap_or(&0),
                100.0 * self.share(name)
            );
        }
        for (name, n) in &self.counts {
            if !expected.iter().any(|(e, _)| e == name) {
                let _ = writeln!(out, "  {name:<8} {:>6} {:>9} {n:>8}", "-", "-");
            }
        }
        let _ = write!(
            out,
            "  {} of {} answered in {:.2?}, {} failed",
            self.answered(),
            self.attempted,
            self.elapsed,
            self.failures.len()
        );
        out
    }

    /// Checks every exchange was answered by a listed backend and each backend's share is
    /// within `tolerance` (relative, e.g. 0.15 for ±15 %) of its weight's share.
    /// The error says what was expected and shows the measured table.
    pub fn check_shares(&self, expected: &[(&str, u32)], tolerance: f64) -> Result<(), String> {
        let mut problems = Vec::new();
        if !self.failures.is_empty() {
            problems.push(format!(
                "{} of {} exchanges failed (expected none), first: {}",
                self.failures.len(),
                self.attempted,
                self.failures
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        let total_weight: u32 = expected.iter().map(|(_, w)| w).sum();
        for (name, weight) in expected {
            let want = f64::from(*weight) / f64::from(total_weight.max(1));
            let got = self.share(name);
            if (got - want).abs() > tolerance * want {
                problems.push(format!(
                    "{name}: share {:.1}% is outside {:.1}% ± {:.0}% (relative)",
                    100.0 * got,
                    100.0 * want,
                    100.0 * tolerance
                ));
            }
        }
        for name in self.counts.keys() {
            if !expected.iter().any(|(e, _)| e == name) {
                problems.push(format!("answers from unexpected backend {name:?}"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!("{}\n{}", problems.join("\n"), self.table(expected)))
        }
    }
}

/// Opens `count` TCP connections from `src:first_port+i` to `dst` inside `ns`, one after
/// the other; each reads the first line (the backend's name) and closes.
pub fn tcp_names(
    ns: &NetNs,
    src: IpAddr,
    first_port: u16,
    dst: SocketAddr,
    count: usize,
    deadline: Duration,
) -> Result<Tally, Error> {
    ns.run(|| {
        batch(first_port, count, deadline, |port| {
            let (name, _) = tcp_hello(SocketAddr::new(src, port), dst)?;
            Ok(name)
        })
    })
}

/// Sends one datagram from each of `count` sockets bound to `src:first_port+i` to `dst`
/// inside `ns`, and waits for each answer (the backend's name).
pub fn udp_names(
    ns: &NetNs,
    src: IpAddr,
    first_port: u16,
    dst: SocketAddr,
    count: usize,
    deadline: Duration,
) -> Result<Tally, Error> {
    ns.run(|| {
        batch(first_port, count, deadline, |port| {
            let socket = UdpSocket::bind(SocketAddr::new(src, port))?;
            socket.connect(dst)?;
            socket.set_read_timeout(Some(STEP_TIMEOUT))?;
            socket.send(format!("hello from port {port}").as_bytes())?;
            let mut buf = [0u8; 512];
            // A connected socket only receives from `dst`: an answer proves the reply was
            // translated back to the VIP.
            let n = socket
                .recv(&mut buf)
                .map_err(|e| context(e, "waiting for the answer"))?;
            Ok(String::from_utf8_lossy(&buf[..n]).trim().to_owned())
        })
    })
}

fn batch(
    first_port: u16,
    count: usize,
    deadline: Duration,
    mut exchange: impl FnMut(u16) -> io::Result<String>,
) -> Tally {
    let start = Instant::now();
    let mut tally = Tally::default();
    for i in 0..count {
        let Some(port) = u16::try_from(i)
            .ok()
            .and_then(|i| first_port.checked_add(i))
        else {
            tally
                .failures
                .push(format!("exchange {i}: source ports exhausted"));
            break;
        };
        if start.elapsed() > deadline || crate::util::interrupt::requested() {
            tally.failures.push(format!(
                "stopped after {i} of {count} exchanges: deadline {deadline:?} passed or interrupted"
            ));
            break;
        }
        tally.attempted += 1;
        match exchange(port) {
            Ok(name) => *tally.counts.entry(name).or_default() += 1,
            Err(err) => tally.failures.push(format!("port {port}: {err}")),
        }
    }
    tally.elapsed = start.elapsed();
    tally
}

/// Connects from `src` (port 0: any) to `dst` and reads the greeting line.
fn tcp_hello(src: SocketAddr, dst: SocketAddr) -> io::Result<(String, TcpStream)> {
    let socket = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
    socket.bind(&SockAddr::from(src))?;
    socket
        .connect_timeout(&SockAddr::from(dst), STEP_TIMEOUT)
        .map_err(|e| context(e, "connect"))?;
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(STEP_TIMEOUT))?;
    stream.set_write_timeout(Some(STEP_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new(&stream)
        .take_line(&mut line)
        .map_err(|e| context(e, "reading the greeting"))?;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before the backend's name",
        ));
    }
    Ok((line, stream))
}

/// `err` with what was being done, same kind.
fn context(err: io::Error, doing: &str) -> io::Error {
    io::Error::new(err.kind(), format!("{doing}: {err}"))
}

/// Reads one line of at most 4 KiB, without the newline.
trait TakeLine {
    fn take_line(self, line: &mut String) -> io::Result<()>;
}

impl<R: BufRead> TakeLine for R {
    fn take_line(self, line: &mut String) -> io::Result<()> {
        let mut limited = io::Read::take(self, 4096);
        limited.read_line(line)?;
        let trimmed = line.trim_end_matches(['\n', '\r']).len();
        line.truncate(trimmed);
        Ok(())
    }
}

/// A long-lived connection to an echo testserver through the balancer.
#[derive(Debug)]
pub struct EchoConn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    backend: String,
}

impl EchoConn {
    /// Connects from inside `ns` (`src` with an ephemeral port) to `dst` and reads the
    /// greeting. The socket stays in `ns` for its life and may be used from any thread.
    pub fn connect(ns: &NetNs, src: IpAddr, dst: SocketAddr) -> Result<io::Result<Self>, Error> {
        ns.run(|| {
            let (backend, stream) = tcp_hello(SocketAddr::new(src, 0), dst)?;
            let reader = BufReader::new(stream.try_clone()?);
            Ok(EchoConn {
                stream,
                reader,
                backend,
            })
        })
    }

    /// The backend that greeted this connection.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// The connection's socket, for a scenario that speaks more than echo lines on it
    /// (nothing was read past the greeting).
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }

    /// The local (client) address of the connection.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// Sends `text` and returns the echoed line (`<backend> <text>`).
    pub fn echo(&mut self, text: &str) -> io::Result<String> {
        self.stream.write_all(format!("{text}\n").as_bytes())?;
        let mut line = String::new();
        (&mut self.reader).take_line(&mut line)?;
        if line.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed instead of an echo",
            ));
        }
        Ok(line)
    }

    /// Sends `text` and checks the echo is `<backend> <text>`; the error says what came back.
    pub fn check_echo(&mut self, text: &str) -> Result<(), String> {
        let want = format!("{} {text}", self.backend);
        match self.echo(text) {
            Ok(got) if got == want => Ok(()),
            Ok(got) => Err(format!("echo of {text:?}: expected {want:?}, got {got:?}")),
            Err(err) => Err(format!(
                "echo of {text:?}: expected {want:?}, got error {err}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(counts: &[(&str, usize)]) -> Tally {
        Tally {
            counts: counts.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect(),
            attempted: counts.iter().map(|(_, c)| c).sum(),
            ..Tally::default()
        }
    }

    #[test]
    fn shares_within_tolerance_pass() {
        let t = tally(&[("b1", 150), ("b2", 140), ("b3", 310)]);
        t.check_shares(&[("b1", 1), ("b2", 1), ("b3", 2)], 0.15)
            .unwrap();
    }

    #[test]
    fn shares_outside_tolerance_or_failures_fail_with_the_table() {
        let t = tally(&[("b1", 100), ("b2", 200), ("b3", 300)]);
        let err = t
            .check_shares(&[("b1", 1), ("b2", 1), ("b3", 2)], 0.15)
            .unwrap_err();
        assert!(err.contains("b1: share 16.7%"), "{err}");
        assert!(err.contains("b2: share 33.3%"), "{err}");
        assert!(err.contains("measured"), "{err}");

        let mut t = tally(&[("b1", 1)]);
        t.failures.push("port 1: refused".into());
        t.attempted += 1;
        let err = t.check_shares(&[("b1", 1)], 0.15).unwrap_err();
        assert!(err.contains("1 of 2 exchanges failed"), "{err}");
    }

    #[test]
    fn unexpected_backends_are_reported() {
        let t = tally(&[("b1", 10), ("zz", 1)]);
        let err = t.check_shares(&[("b1", 1)], 0.5).unwrap_err();
        assert!(err.contains("unexpected backend \"zz\""), "{err}");
    }
}
