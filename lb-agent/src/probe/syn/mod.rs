//! The SYN check: a tcp probe without `send`/`expect`/`test` ("does the port accept
//! connections") done with one SYN and its answer instead of a socket and a `connect`
//! per probe, as large-scale checkers do (docs/probes.md, "SYN check").
//!
//! One raw socket per address family (`SOCK_RAW`/`IPPROTO_TCP`, needs `CAP_NET_RAW`) is
//! shared by every probe of the process: a sender thread writes queued SYNs in batches
//! (`sendmmsg`), a receiver thread per family reads replies in batches (`recvmmsg`) that a
//! classic BPF filter ([`filter`]) has narrowed to SYN-ACKs and RSTs to our claimed source
//! ports ([`ports`]). Each probe's ISN is a keyed hash of its 4-tuple and a round number
//! ([`packet::isn`]); a reply counts only if it acknowledges exactly that ISN + 1, so a
//! forged or stale SYN-ACK/RST can neither pass nor fail a target (it is counted in
//! [`Stats`], never logged per packet). SYN-ACK passes, RST+ACK is a refusal, an ICMP
//! error quoting our SYN (its ports and ISN) fails at once with the error a connect gets
//! ([`icmp`]), silence runs into the probe's timeout, exactly as the connect probe —
//! all judged by the kernel's receive stamps against the SYN's send, not by when the
//! agent read the reply (`probe/stamps.rs`, docs/local-faults.md).

mod filter;
mod icmp;
mod packet;
mod ports;
mod sockname;
mod source;
mod wire;

use std::collections::HashMap;
use std::collections::hash_map::{Entry, RandomState};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::oneshot;

use super::stamps::{self, Judged, Sent, Stamp};
use super::{Passed, ProbeError};
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
    /// SYNs the sender thread took off its queue only after their probe's timeout (the
    /// thread could not keep up, or did not get a CPU): sent anyway, their probe failed.
    pub sent_late: AtomicU64,
    /// Sum and maximum of the time SYNs waited in the send queue, in microseconds.
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
        TcpCheck::Auto => checker().ok().filter(|c| c.family(addr).is_some()).map(Ok),
        TcpCheck::Syn => Some(match checker() {
            Ok(c) if c.family(addr).is_some() => Ok(c),
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
                    ipv6 = c.v6.is_some(),
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
    /// A verified SYN-ACK or RST, with the kernel's receive stamp and the SYN's send
    /// bracket (`None` where the kernel or the sender gave none).
    Answer {
        answer: Answer,
        rx: Option<Stamp>,
        sent: Option<Sent>,
    },
    /// A verified ICMP error about the SYN: the error a connect gets from it.
    Unreachable(io::Error),
    /// The SYN could not be sent.
    NotSent(io::Error),
}

/// A probe waiting for its reply.
struct Pending {
    isn: u32,
    reply: oneshot::Sender<Settled>,
    /// The realtime clock just before and just after the sender's send call (stamps).
    sent_lo: Option<Stamp>,
    sent_hi: Option<Stamp>,
}

/// (target, our source port) → the probe in flight.
type PendingMap = Mutex<HashMap<(SocketAddr, u16), Pending>>;

/// One SYN to send.
struct Outgoing {
    /// When the probe queued it, and when the probe gives up.
    queued: std::time::Instant,
    timeout: std::time::Duration,
    dst: SocketAddr,
    sport: u16,
    isn: u32,
    segment: [u8; packet::SYN_LEN],
}

/// The shared SYN checker: sockets, claimed ports, probes in flight, the send queue.
pub(super) struct Checker {
    v4: Arc<Socket>,
    v6: Option<Arc<Socket>>,
    /// Each socket's reader, shared by its receiver thread and probes at their deadline.
    rx4: Arc<Mutex<wire::Receiver>>,
    rx6: Option<Arc<Mutex<wire::Receiver>>>,
    ports: ports::Claimed,
    key: RandomState,
    round: AtomicU32,
    pending: Arc<PendingMap>,
    sources: source::Cache,
    queue: Mutex<mpsc::Sender<Outgoing>>,
}

impl Checker {
    fn start() -> io::Result<Checker> {
        let ports = ports::claim()?;
        let v4 = Arc::new(raw(Domain::IPV4, &ports.ports)?);
        let v6 = raw(Domain::IPV6, &ports.ports).ok().map(Arc::new);
        let pending: Arc<PendingMap> = Arc::default();
        let (tx, rx) = mpsc::channel();
        {
            let (v4, v6, pending) = (v4.clone(), v6.clone(), pending.clone());
            std::thread::Builder::new()
                .name("lb-syn-send".into())
                .spawn(move || wire::send_loop(rx, &v4, v6.as_deref(), &pending))?;
        }
        let rx4: Arc<Mutex<wire::Receiver>> = Arc::default();
        let rx6: Option<Arc<Mutex<wire::Receiver>>> = v6.as_ref().map(|_| Arc::default());
        for (sock, ipv4, receiver) in std::iter::once((v4.clone(), true, rx4.clone()))
            .chain(v6.clone().zip(rx6.clone()).map(|(s, r)| (s, false, r)))
        {
            let pending = pending.clone();
            std::thread::Builder::new()
                .name(if ipv4 { "lb-syn-recv4" } else { "lb-syn-recv6" }.into())
                .spawn(move || wire::recv_loop(&sock, ipv4, &pending, &receiver))?;
        }
        Ok(Checker {
            v4,
            v6,
            rx4,
            rx6,
            ports,
            key: RandomState::new(),
            round: AtomicU32::new(0),
            pending,
            sources: source::Cache::default(),
            queue: Mutex::new(tx),
        })
    }

    /// The raw socket for `addr`'s family, if there is one.
    fn family(&self, addr: SocketAddr) -> Option<&Socket> {
        match addr.ip() {
            IpAddr::V4(_) => Some(&self.v4),
            IpAddr::V6(_) => self.v6.as_deref(),
        }
    }

    /// Drains `dst`'s raw socket now (waiting for its receiver thread if that is
    /// reading): every reply the kernel received before the returned stamp has reached
    /// its probe.
    fn drain(&self, dst: SocketAddr) -> io::Result<Stamp> {
        let (sock, receiver, ipv4) = match (dst.ip(), &self.v6, &self.rx6) {
            (IpAddr::V4(_), _, _) => (&self.v4, &self.rx4, true),
            (IpAddr::V6(_), Some(sock), Some(rx)) => (sock, rx, false),
            (IpAddr::V6(_), _, _) => return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT)),
        };
        receiver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(sock, ipv4, &self.pending)
    }

    /// The send bracket of probe `flight`, if its SYN went out (an unfinished send's
    /// bracket ends now).
    fn sent(&self, flight: &InFlight) -> Option<Sent> {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let p = pending.get(&flight.key).filter(|p| p.isn == flight.isn)?;
        let lo = p.sent_lo?;
        Some(Sent {
            lo,
            hi: p.sent_hi.unwrap_or_else(stamps::now),
        })
    }

    /// Registers a probe of `dst` from `src_ip` on a source port not in flight to `dst`.
    fn register(
        &'static self,
        src_ip: IpAddr,
        dst: SocketAddr,
        timeout: std::time::Duration,
    ) -> Result<(Outgoing, oneshot::Receiver<Settled>, InFlight), ProbeError> {
        let round = self.round.fetch_add(1, Ordering::Relaxed);
        let ports = &self.ports.ports;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for i in 0..ports.len() {
            let sport = ports[(round as usize + i) % ports.len()];
            if let Entry::Vacant(slot) = pending.entry((dst, sport)) {
                let src = SocketAddr::new(src_ip, sport);
                let isn = packet::isn(&self.key, src, dst, round);
                let (tx, rx) = oneshot::channel();
                slot.insert(Pending {
                    isn,
                    reply: tx,
                    sent_lo: None,
                    sent_hi: None,
                });
                let out = Outgoing {
                    queued: std::time::Instant::now(),
                    timeout,
                    dst,
                    sport,
                    isn,
                    segment: packet::syn(src, dst, isn),
                };
                let guard = InFlight {
                    pending: &self.pending,
                    key: (dst, sport),
                    isn,
                };
                return Ok((out, rx, guard));
            }
        }
        Err(ProbeError::Io {
            what: "syn",
            source: io::Error::from_raw_os_error(libc::EADDRNOTAVAIL),
        })
    }
}

/// Removes a probe's entry when it ends (reply, timeout or cancellation), unless a later
/// probe already took the slot.
struct InFlight {
    pending: &'static PendingMap,
    key: (SocketAddr, u16),
    isn: u32,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.get(&self.key).is_some_and(|p| p.isn == self.isn) {
            pending.remove(&self.key);
        }
    }
}

/// A raw TCP socket of `domain` with the reply filter for `ports` and large buffers.
fn raw(domain: Domain, ports: &[u16]) -> io::Result<Socket> {
    let sock = Socket::new(domain, Type::RAW, Some(Protocol::TCP))?;
    filter::attach(&sock, domain == Domain::IPV4, ports)?;
    // Replies are judged by when the kernel received them (stamps module).
    stamps::enable(&sock)?;
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

/// Runs one SYN check of `dst`, judged by the kernel's stamps (docs/local-faults.md):
/// an answer the kernel received within `timeout` of the SYN's send passes (or refuses)
/// however late the agent read it; silence is a timeout only once the agent has drained
/// the socket at a moment when the server had had its whole timeout; when the agent was
/// too late to tell, no verdict ([`ProbeError::Late`]). Takes at most about twice
/// `timeout` (one extension when the SYN left late).
pub(super) async fn probe(
    checker: &'static Checker,
    dst: SocketAddr,
    timeout: std::time::Duration,
) -> Result<Passed, ProbeError> {
    let start = tokio::time::Instant::now();
    let src_ip = checker
        .sources
        .for_target(dst)
        .map_err(|source| ProbeError::Connect { source })?;
    let (out, mut reply, in_flight) = checker.register(src_ip, dst, timeout)?;
    checker
        .queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send(out)
        .map_err(|_| ProbeError::Io {
            what: "syn send",
            source: io::Error::other("sender thread gone"),
        })?;
    let mut wake = start + timeout;
    let mut extended = false;
    loop {
        tokio::select! {
            biased;
            settled = &mut reply => return settle(settled.ok(), timeout),
            () = tokio::time::sleep_until(wake) => {}
        }
        super::lag::note_late(tokio::time::Instant::now().saturating_duration_since(wake));
        // The deadline: read what the kernel has (the receiver thread may be starved).
        let drained = checker.drain(dst).map_err(|source| ProbeError::Io {
            what: "syn receive",
            source,
        })?;
        match reply.try_recv() {
            Ok(settled) => return settle(Some(settled), timeout),
            Err(oneshot::error::TryRecvError::Closed) => return settle(None, timeout),
            Err(oneshot::error::TryRecvError::Empty) => {}
        }
        let sent = checker.sent(&in_flight);
        match stamps::silence(sent, drained, timeout) {
            Ok(judged) => {
                let since = sent.map_or(drained, |s| s.lo);
                return Err(ProbeError::judged(stamps::confirm(judged, since, timeout)));
            }
            // The SYN left late: the server is owed the rest of its timeout, once.
            Err(owed) if !extended => {
                extended = true;
                wake = tokio::time::Instant::now() + owed;
            }
            Err(owed) => return Err(ProbeError::judged(stamps::still_owed(owed))),
        }
    }
}

/// The verdict of a settled SYN check.
fn settle(settled: Option<Settled>, timeout: std::time::Duration) -> Result<Passed, ProbeError> {
    match settled {
        Some(Settled::Answer { answer, rx, sent }) => {
            let rtt = match (sent, rx) {
                (Some(sent), Some(rx)) => match stamps::answer(sent, rx, timeout) {
                    Judged::InTime(rtt) => Some(rtt),
                    other => {
                        return Err(ProbeError::judged(stamps::confirm(other, sent.lo, timeout)));
                    }
                },
                // No stamps (the kernel gave none): judged as it came.
                _ => None,
            };
            match answer {
                Answer::Accepts => Ok(Passed {
                    detail: "connected (SYN-ACK)".into(),
                    rtt,
                }),
                Answer::Refuses => Err(ProbeError::Refused),
            }
        }
        // As a connect fails on the same ICMP error: a port unreachable is a refusal,
        // the others "connect: <errno>" (No route to host…).
        Some(Settled::Unreachable(source)) => Err(ProbeError::connect(source)),
        Some(Settled::NotSent(source)) => Err(ProbeError::Io {
            what: "syn send",
            source,
        }),
        None => Err(ProbeError::Io {
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
        assert!(stats().accepted.load(Ordering::Relaxed) >= 2);
        assert!(stats().refused.load(Ordering::Relaxed) >= 2);
    }

    #[test]
    fn an_idle_probe_task_stays_small() {
        // The schedule holds one `execute` future per (server, probe): at 100,000
        // targets its size is most of the agent's memory, and only `probe::execute`'s
        // boxing of the large kinds keeps it small (unboxed, 4.4 KB).
        let cfg = syn_probe();
        let fut = execute(&cfg, "127.0.0.1:1".parse().unwrap());
        let size = std::mem::size_of_val(&fut);
        assert!(size <= 1024, "execute's future is {size} bytes");
    }

    /// The answer reaches the kernel in time while the agent cannot read it (the
    /// receiver is held past the deadline, as a starved receiver thread would be): judged
    /// by the kernel's stamps, the probe passes, with the stamps' round trip. Judged by
    /// when the agent read it, it would be a timeout.
    #[test]
    fn an_answer_received_in_time_but_read_late_passes() {
        if availability() == Err("no CAP_NET_RAW") {
            eprintln!("skipped: needs CAP_NET_RAW");
            return;
        }
        let checker = checker().unwrap();
        let open = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = open.local_addr().unwrap();
        let cfg = syn_probe();
        let hold = cfg.timeout * 2;
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let _receiver = checker.rx4.lock().unwrap();
            held_tx.send(()).unwrap();
            std::thread::sleep(hold);
        });
        held_rx.recv().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let began = std::time::Instant::now();
        let out = rt.block_on(execute(&cfg, addr));
        let took = began.elapsed();
        holder.join().unwrap();
        assert!(out.ok, "{out:?}");
        assert!(
            took >= hold - Duration::from_millis(50),
            "read only once the receiver was free ({took:?})"
        );
        assert!(
            out.duration < cfg.timeout,
            "measured by the stamps, not by the read: {out:?}"
        );
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
