//! The SYN check: a tcp probe without `send`/`expect`/`test` ("does the port accept
//! connections") done with one SYN and its answer instead of a socket and a `connect`
//! per probe, as large-scale checkers do (docs/probes.md, "SYN check").
//!
//! One raw socket per address family (`SOCK_RAW`/`IPPROTO_TCP`, needs `CAP_NET_RAW`) is
//! shared by every probe of the process, owned by one thread, the SYN engine
//! ([`engine`]): it keeps the schedule of every scheduled SYN check on a timing wheel
//! ([`plan`], [`wheel`]) instead of a task per target, writes the SYNs that are due in
//! batches (`sendmmsg`), reads replies in batches (`recvmmsg`) that a classic BPF filter
//! ([`filter`]) has narrowed to SYN-ACKs and RSTs to our claimed source ports ([`ports`]),
//! and hands the agent its reports in batches. One-off checks ([`super::execute`]) go
//! through the same engine. Each probe's ISN is a keyed hash of its 4-tuple and a round number
//! ([`packet::isn`]); a reply counts only if it acknowledges exactly that ISN + 1, so a
//! forged or stale SYN-ACK/RST can neither pass nor fail a target (it is counted in
//! [`Stats`], never logged per packet). SYN-ACK passes, RST+ACK is a refusal, an ICMP
//! error quoting our SYN (its ports and ISN) fails at once with the error a connect gets
//! ([`icmp`]), silence runs into the probe's timeout, exactly as the connect probe.

pub(super) mod engine;
mod filter;
mod icmp;
mod packet;
mod plan;
mod ports;
mod source;
mod wheel;
mod wire;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::oneshot;

use super::{ProbeError, Verdict};
use crate::config::{ProbeConfig, ProbeKind, TcpCheck};
use packet::Answer;

/// What the SYN check's replies and sends came to since the process started.
#[derive(Debug, Default)]
pub struct Stats {
    /// SYNs handed to the kernel.
    pub sent: AtomicU64,
    /// Verified SYN-ACKs (passes).
    pub accepted: AtomicU64,
    /// Verified RSTs (refusals).
    pub refused: AtomicU64,
    /// Replies to a probe in flight whose acknowledgement number is not its ISN + 1
    /// (forged, or a late answer to an earlier round): ignored.
    pub rejected: AtomicU64,
    /// Replies for no probe in flight (after its timeout, or never ours): ignored.
    pub unmatched: AtomicU64,
    /// Packets that passed the socket filter, or queued ICMP errors, that did not
    /// parse: ignored.
    pub malformed: AtomicU64,
    /// Verified ICMP errors (their quote is a SYN in flight with its ISN): the probe
    /// failed at once.
    pub unreachable: AtomicU64,
    /// ICMP errors quoting a probe in flight with a sequence number that is not its ISN
    /// (forged, or about an earlier round): ignored.
    pub icmp_rejected: AtomicU64,
    /// ICMP errors quoting no probe in flight (after its timeout, another program's TCP,
    /// or forged), or of a type a connect ignores (path MTU): ignored.
    pub icmp_unmatched: AtomicU64,
    /// SYNs the engine sent only after their probe's timeout (it could not keep up, or
    /// did not get a CPU): sent anyway, their probe failed.
    pub sent_late: AtomicU64,
    /// Sum and maximum of the time SYNs waited from their run's start (the engine's
    /// round that started it, or a one-off check's call) to their send, in microseconds.
    pub queue_us_sum: AtomicU64,
    pub queue_us_max: AtomicU64,
}

/// The process's SYN-check counters.
pub fn stats() -> &'static Stats {
    static STATS: OnceLock<Stats> = OnceLock::new();
    STATS.get_or_init(Stats::default)
}

/// Whether this process can run SYN checks: `Ok` with the claimed ports, or why not
/// (tcp probes without data then connect). Sets the checker up on first call and logs the
/// outcome once.
pub fn availability() -> Result<&'static [u16], &'static str> {
    checker().map(|c| c.ports.ports.as_slice())
}

/// Whether this process may open a raw TCP socket (what the SYN check needs), without
/// setting the check up: `Err` says why not.
pub fn raw_socket_opens() -> Result<(), String> {
    match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::TCP)) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err("no CAP_NET_RAW".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A tcp probe that may use the SYN check (`tcp_check` other than `connect`).
pub fn wanted(cfg: &ProbeConfig) -> bool {
    cfg.kind == ProbeKind::Tcp && plain(cfg) && cfg.tcp_check != TcpCheck::Connect
}

/// A tcp probe that only asks whether the port accepts connections.
pub fn plain(cfg: &ProbeConfig) -> bool {
    cfg.send.is_none() && cfg.expect.is_none() && cfg.test.is_none()
}

/// How [`super::execute`] runs tcp probe `cfg` against `addr`: `None` = connect.
pub(super) fn route(
    cfg: &ProbeConfig,
    addr: SocketAddr,
) -> Option<Result<&'static Checker, ProbeError>> {
    if !plain(cfg) {
        return None;
    }
    match cfg.tcp_check {
        TcpCheck::Connect => None,
        TcpCheck::Auto => checker().ok().filter(|c| c.family(addr)).map(Ok),
        TcpCheck::Syn => Some(match checker() {
            Ok(c) if c.family(addr) => Ok(c),
            Ok(_) => Err(ProbeError::SynUnavailable {
                why: "no raw IPv6 socket",
            }),
            Err(why) => Err(ProbeError::SynUnavailable { why }),
        }),
    }
}

/// The checker, once set up: `Err` says why it could not be.
static CHECKER: OnceLock<Result<Checker, &'static str>> = OnceLock::new();

/// Whether SYN checks run, without setting them up: `None` until a tcp probe or
/// [`availability`] asked; `Some(false)` when they could not be set up (connect instead).
pub fn in_use() -> Option<bool> {
    CHECKER.get().map(Result::is_ok)
}

fn checker() -> Result<&'static Checker, &'static str> {
    CHECKER
        .get_or_init(|| match Checker::start() {
            Ok(c) => {
                tracing::info!(
                    ports = ?c.ports.ports,
                    ipv6 = c.v6,
                    "tcp probes without send/expect/test use SYN checks (raw socket)"
                );
                Ok(c)
            }
            Err(e) => {
                let why = if e.kind() == io::ErrorKind::PermissionDenied {
                    "no CAP_NET_RAW"
                } else {
                    "raw socket unavailable"
                };
                tracing::warn!(
                    error = %e,
                    "SYN checks unavailable ({why}): tcp probes connect instead"
                );
                Err(why)
            }
        })
        .as_ref()
        .map_err(|why| *why)
}

/// How a probe in flight ended, other than by its timeout.
enum Settled {
    /// A verified SYN-ACK or RST.
    Answer(Answer),
    /// A verified ICMP error about the SYN: the error a connect gets from it.
    Unreachable(io::Error),
    /// The SYN could not be sent.
    NotSent(io::Error),
    /// No source address for the target (the route lookup's error).
    NoSource(io::Error),
    /// Every claimed source port has a probe of the target in flight.
    NoPort,
}

/// What a probe's end means, as the connect probe would say it.
fn verdict(settled: Settled) -> Verdict {
    match settled {
        Settled::Answer(Answer::Accepts) => Ok("connected (SYN-ACK)".into()),
        Settled::Answer(Answer::Refuses) => Err(ProbeError::Refused),
        // As a connect fails on the same ICMP error: a port unreachable is a refusal,
        // the others "connect: <errno>" (No route to host…).
        Settled::Unreachable(source) => Err(ProbeError::connect(source)),
        Settled::NotSent(source) => Err(ProbeError::Io {
            what: "syn send",
            source,
        }),
        Settled::NoSource(source) => Err(ProbeError::Connect { source }),
        Settled::NoPort => Err(ProbeError::Io {
            what: "syn",
            source: io::Error::from_raw_os_error(libc::EADDRNOTAVAIL),
        }),
    }
}

/// Who waits for a SYN in flight: a scheduled entry's run, or a one-off probe.
enum Owner {
    Entry { id: u32, stamp: u32 },
    Once(oneshot::Sender<Settled>),
}

/// A SYN in flight: its ISN and who waits for it.
struct Flight {
    isn: u32,
    owner: Owner,
}

/// (target, our source port) → the SYN in flight.
type Flights = HashMap<plan::FlightKey, Flight>;

/// One SYN to send.
struct Outgoing {
    /// When the probe started, and when it gives up.
    queued: std::time::Instant,
    timeout: std::time::Duration,
    dst: SocketAddr,
    sport: u16,
    isn: u32,
    segment: [u8; packet::SYN_LEN],
}

/// The shared SYN checker: the claimed ports and the way to the engine that owns the
/// sockets.
pub(super) struct Checker {
    v6: bool,
    ports: ports::Claimed,
    engine: engine::Handle,
}

impl Checker {
    fn start() -> io::Result<Checker> {
        let ports = ports::claim()?;
        let v4 = raw(Domain::IPV4, &ports.ports)?;
        let v6 = raw(Domain::IPV6, &ports.ports).ok();
        let has_v6 = v6.is_some();
        let engine = engine::start(v4, v6, ports.ports.clone())?;
        Ok(Checker {
            v6: has_v6,
            ports,
            engine,
        })
    }

    /// Whether there is a raw socket for `addr`'s family.
    fn family(&self, addr: SocketAddr) -> bool {
        addr.is_ipv4() || self.v6
    }
}

/// A raw TCP socket of `domain` with the reply filter for `ports` and large buffers.
fn raw(domain: Domain, ports: &[u16]) -> io::Result<Socket> {
    let sock = Socket::new(domain, Type::RAW, Some(Protocol::TCP))?;
    filter::attach(&sock, domain == Domain::IPV4, ports)?;
    // Without it the kernel hides a SYN its own queue dropped (ENOBUFS) from a raw
    // socket, and the probe would time out against the target instead of failing locally.
    let (level, name) = if domain == Domain::IPV4 {
        (libc::SOL_IP, libc::IP_RECVERR)
    } else {
        (libc::SOL_IPV6, libc::IPV6_RECVERR)
    };
    let on: libc::c_int = 1;
    // SAFETY: an int option on our socket, `on` alive for the call.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            level,
            name,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // Bursts of replies at 100,000 probes/s; best effort (capped by net.core.*mem_max).
    let _ = sock.set_recv_buffer_size(8 << 20);
    let _ = sock.set_send_buffer_size(4 << 20);
    // Nothing to read for us in other packets until the filter was attached: drain.
    sock.set_nonblocking(true)?;
    let mut buf = [std::mem::MaybeUninit::new(0u8); 64];
    while sock.recv(&mut buf).is_ok() {}
    sock.set_nonblocking(false)?;
    Ok(sock)
}

/// Runs one SYN check of `dst` (the caller bounds it by the probe's timeout).
pub(super) async fn probe(
    checker: &'static Checker,
    dst: SocketAddr,
    timeout: std::time::Duration,
) -> Verdict {
    let (reply, settled) = oneshot::channel();
    checker
        .engine
        .submit(engine::Command::Once {
            dst,
            timeout,
            queued: std::time::Instant::now(),
            reply,
        })
        .map_err(|_| ProbeError::Io {
            what: "syn send",
            source: io::Error::other("SYN engine gone"),
        })?;
    match settled.await {
        Ok(settled) => verdict(settled),
        Err(_) => Err(ProbeError::Io {
            what: "syn",
            source: io::Error::other("probe dropped by the checker"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Duration;

    use super::*;
    use crate::probe::execute;

    fn syn_probe() -> ProbeConfig {
        let mut cfg = ProbeConfig::new("tcp", ProbeKind::Tcp);
        cfg.tcp_check = TcpCheck::Syn;
        cfg.timeout = Duration::from_millis(500);
        cfg
    }

    /// Over loopback on the real kernel (needs CAP_NET_RAW, as the root test crate).
    #[tokio::test]
    async fn open_port_passes_and_closed_port_is_refused() {
        if availability() == Err("no CAP_NET_RAW") {
            eprintln!("skipped: needs CAP_NET_RAW");
            return;
        }
        for host in ["127.0.0.1:0", "[::1]:0"] {
            refuses_and_passes(host).await;
        }
        assert!(stats().accepted.load(std::sync::atomic::Ordering::Relaxed) >= 2);
        assert!(stats().refused.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    }

    #[test]
    fn an_idle_probe_task_stays_small() {
        // The schedule holds one `execute` future per (server, probe): at 100,000
        // targets its size is most of the agent's memory. It was 4.4 KB before the large
        // kinds were boxed.
        let cfg = syn_probe();
        let fut = execute(&cfg, "127.0.0.1:1".parse().unwrap());
        let size = std::mem::size_of_val(&fut);
        assert!(size <= 1024, "execute's future is {size} bytes");
    }

    async fn refuses_and_passes(host: &str) {
        let open = TcpListener::bind(host).unwrap();
        let addr = open.local_addr().unwrap();
        let out = execute(&syn_probe(), addr).await;
        assert!(out.ok, "{out:?}");
        assert_eq!(out.detail, "connected (SYN-ACK)");
        drop(open);
        let out = execute(&syn_probe(), addr).await;
        assert!(!out.ok && out.immediate && !out.local, "{out:?}");
        assert_eq!(out.detail, "connection refused");
    }
}
