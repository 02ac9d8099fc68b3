//! The SYN engine: one thread (`lb-syn-engine`) that runs every SYN check of the process
//! without a task, a timer or a channel per target (docs/probes.md, "SYN engine").
//!
//! It owns the raw sockets, the SYNs in flight and the [`Plan`] of every scheduled
//! (server, probe). Each round it takes new entries and one-off probes from its command
//! queue, reads the replies and ICMP errors queued (`recvmmsg`, without waiting), starts
//! the runs that are due and expires the timeouts (both from the plan's wheel), sends the
//! SYNs of the round in `sendmmsg` batches, and hands the reports to their channels in
//! batches (one `try_reserve_many` per run of reports to the same channel). It then
//! sleeps until the next millisecond that holds work, or, when none is that close, polls
//! its sockets and its wake-up `eventfd` until the next work or a reply.
//!
//! A report that does not fit its channel waits in the engine; its entry's next tick is
//! scheduled only once it was handed over (as a probe task waits on `send`).

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use socket2::Socket;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::oneshot;

use super::plan::{Due, FlightKey, Plan, Timer};
use super::wire::{self, BATCH, RecvBufs, Settlements};
use super::{Flight, Flights, Outgoing, Owner, Settled, packet, source, verdict};
use crate::config::{ProbeConfig, ProbeKind};
use crate::probe::{ProbeReport, ServerKey, ServerSignals, outcome_of, timeout_outcome};

/// When the next work is at most this far, the engine sleeps instead of polling its
/// sockets: at high rates a round then carries many SYNs and replies per system call
/// (and the thread wakes about a thousand times a second). It adds at most this much to
/// a probe's measured duration.
const GATHER: Duration = Duration::from_millis(1);
/// `recvmmsg` calls per socket and round at most (then the round's other work comes).
const RECV_ROUNDS: usize = 64;

/// A (server, probe) for the engine to schedule: what [`crate::probe::spawn_spread`] was
/// given.
pub(crate) struct Spec {
    pub(crate) server: ServerKey,
    pub(crate) probe: usize,
    pub(crate) cfg: Arc<ProbeConfig>,
    pub(crate) signals: Arc<dyn ServerSignals>,
    pub(crate) reports: tokio::sync::mpsc::Sender<ProbeReport>,
    /// The first run falls within this (at most the interval).
    pub(crate) spread: Duration,
    /// When it was scheduled: the first run's offset counts from here.
    pub(crate) created: Instant,
}

impl Spec {
    /// Where its SYNs go: the server's address, with the probe's port if it sets one.
    pub(super) fn target(&self) -> SocketAddr {
        SocketAddr::new(
            self.server.addr.ip(),
            self.cfg.port.unwrap_or(self.server.addr.port()),
        )
    }
}

/// Shared between a [`crate::probe::ProbeTask`] and its engine entry.
#[derive(Debug, Default)]
pub(crate) struct EntryFlags {
    /// Set when the task is dropped: nothing starts or is reported after it.
    pub(crate) cancelled: AtomicBool,
    /// Set by the engine when the entry's report channel was closed.
    pub(crate) finished: AtomicBool,
}

/// What the engine is asked to do.
pub(super) enum Command {
    /// Schedule an entry.
    Add(Spec, Arc<EntryFlags>),
    /// Check `dst` once; the answer goes to `reply` (dropped on timeout).
    Once {
        dst: SocketAddr,
        timeout: Duration,
        queued: Instant,
        reply: oneshot::Sender<Settled>,
    },
}

/// Schedules `spec` in the engine when it is a SYN check the engine can run (the SYN
/// check is available for its target's family); gives it back otherwise.
pub(crate) fn schedule(spec: Spec) -> Result<Arc<EntryFlags>, Spec> {
    if spec.cfg.kind != ProbeKind::Tcp {
        return Err(spec);
    }
    let Some(Ok(checker)) = super::route(&spec.cfg, spec.target()) else {
        return Err(spec);
    };
    let flags = Arc::new(EntryFlags::default());
    match checker.engine.submit(Command::Add(spec, flags.clone())) {
        Ok(()) => Ok(flags),
        Err(Command::Add(spec, _)) => Err(spec),
        Err(Command::Once { .. }) => unreachable!("submitted an Add"),
    }
}

/// The way to the engine thread.
pub(super) struct Handle {
    commands: mpsc::Sender<Command>,
    wake: Arc<OwnedFd>,
}

impl Handle {
    /// Queues `command` and wakes the engine; gives it back if the engine is gone.
    pub(super) fn submit(&self, command: Command) -> Result<(), Command> {
        self.commands.send(command).map_err(|e| e.0)?;
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from `one` to our eventfd. A full counter (never, at one
        // per command) only loses a redundant wake-up.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        Ok(())
    }
}

/// Starts the engine thread on the raw sockets, with the claimed source `ports`.
pub(super) fn start(v4: Socket, v6: Option<Socket>, ports: Vec<u16>) -> io::Result<Handle> {
    // SAFETY: eventfd has no memory arguments; a valid descriptor is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor no one else owns.
    let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
    v4.set_nonblocking(true)?;
    if let Some(v6) = &v6 {
        v6.set_nonblocking(true)?;
    }
    let (tx, rx) = mpsc::channel();
    let epoch = Instant::now();
    let engine = Engine {
        v4,
        v6,
        ports,
        key: RandomState::new(),
        round: 0,
        flights: Flights::default(),
        sources: source::Cache::default(),
        plan: Plan::new(epoch),
        commands: rx,
        wake: wake.clone(),
        outgoing: Vec::with_capacity(BATCH),
        outbox: VecDeque::new(),
        settled: Vec::new(),
        replies: Vec::with_capacity(BATCH),
        bufs: RecvBufs::new(),
        expired: Vec::new(),
        due: Vec::new(),
        broken: [false; 2],
    };
    std::thread::Builder::new()
        .name("lb-syn-engine".into())
        .spawn(move || engine.run())?;
    Ok(Handle { commands: tx, wake })
}

struct Engine {
    v4: Socket,
    v6: Option<Socket>,
    ports: Vec<u16>,
    /// The ISN key ([`packet::isn`]) and its round number.
    key: RandomState,
    round: u32,
    flights: Flights,
    sources: source::Cache,
    plan: Plan,
    commands: mpsc::Receiver<Command>,
    wake: Arc<OwnedFd>,
    /// The round's SYNs.
    outgoing: Vec<Outgoing>,
    /// Reports not handed over yet: (entry, its run's stamp, report).
    outbox: VecDeque<(u32, u32, ProbeReport)>,
    /// Scratch space, kept between rounds.
    settled: Settlements,
    replies: Vec<(IpAddr, packet::Reply)>,
    bufs: RecvBufs,
    expired: Vec<Timer>,
    due: Vec<Due>,
    /// A socket failed for good (logged once): [v4, v6].
    broken: [bool; 2],
}

impl Engine {
    fn run(mut self) {
        loop {
            if !self.take_commands() {
                return;
            }
            self.receive();
            let now = Instant::now();
            self.settle(now);
            self.fire(now);
            wire::send_families(
                &self.outgoing,
                &self.v4,
                self.v6.as_ref(),
                &mut self.flights,
                &mut self.settled,
            );
            self.outgoing.clear();
            self.settle(now);
            self.deliver(Instant::now());
            self.wait();
        }
    }

    /// Takes every queued command; false once every handle is gone.
    fn take_commands(&mut self) -> bool {
        loop {
            match self.commands.try_recv() {
                Ok(Command::Add(spec, flags)) => {
                    self.plan.add(spec, flags);
                }
                Ok(Command::Once {
                    dst,
                    timeout,
                    queued,
                    reply,
                }) => match self.register(dst, Owner::Once(reply), queued, timeout) {
                    Ok((key, isn)) => self.plan.once_timeout(queued + timeout, key, isn),
                    Err(settled) => self.settled.push(settled),
                },
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return self.plan.len() > 0,
            }
        }
    }

    /// Reads what both sockets have queued and matches it to the SYNs in flight.
    fn receive(&mut self) {
        for ipv4 in [true, false] {
            let sock = if ipv4 {
                &self.v4
            } else {
                match &self.v6 {
                    Some(s) => s,
                    None => continue,
                }
            };
            let broken = &mut self.broken[usize::from(!ipv4)];
            if *broken {
                continue;
            }
            for _ in 0..RECV_ROUNDS {
                match wire::recv_some(sock, ipv4, &mut self.bufs, &mut self.replies) {
                    Ok(n) if n < BATCH => break,
                    Ok(_) => {}
                    Err(e) => match e.raw_os_error() {
                        Some(libc::EAGAIN) => break,
                        Some(libc::EINTR) => {}
                        Some(libc::EBADF | libc::ENOTSOCK | libc::EINVAL | libc::EFAULT) => {
                            tracing::error!(error = %e, ipv4, "SYN check receiver stopped");
                            *broken = true;
                            break;
                        }
                        // A queued error (`IP_RECVERR`): an ICMP error about a TCP
                        // packet of this host, maybe one of our SYNs.
                        _ => wire::read_errors(sock, ipv4, &mut self.flights, &mut self.settled),
                    },
                }
            }
        }
        wire::resolve(&mut self.flights, &self.replies, &mut self.settled);
        self.replies.clear();
    }

    /// Starts the runs that are due and ends the ones that timed out.
    fn fire(&mut self, now: Instant) {
        self.plan.due(now, &mut self.expired, &mut self.due);
        let mut due = std::mem::take(&mut self.due);
        for d in due.drain(..) {
            match d {
                Due::Start { id, stamp } => {
                    let Some((target, spec, started)) = self.plan.running(id, stamp) else {
                        continue;
                    };
                    let timeout = spec.cfg.timeout;
                    match self.register(target, Owner::Entry { id, stamp }, started, timeout) {
                        Ok((key, isn)) => self.plan.sent(id, stamp, key, isn),
                        Err(settled) => self.settled.push(settled),
                    }
                }
                Due::TimedOut { id, stamp, flight } => {
                    if let Some((key, isn)) = flight {
                        self.forget(key, isn);
                    }
                    let Some((_, spec, started)) = self.plan.running(id, stamp) else {
                        continue;
                    };
                    let outcome = timeout_outcome(spec.cfg.timeout, now - started);
                    if let Some(report) = self.plan.settle(id, stamp, outcome, now) {
                        self.outbox.push_back((id, stamp, report));
                    }
                }
                Due::OnceExpired { key, isn } => self.forget(key, isn),
            }
        }
        self.due = due;
    }

    /// Drops the SYN in flight at `key` if it is still the one with `isn`.
    fn forget(&mut self, key: FlightKey, isn: u32) {
        if self.flights.get(&key).is_some_and(|f| f.isn == isn) {
            self.flights.remove(&key);
        }
    }

    /// Puts a SYN to `dst` in flight for `owner` on a source port not in flight to `dst`,
    /// and queues it for this round's send: its key and ISN, or why it cannot go.
    fn register(
        &mut self,
        dst: SocketAddr,
        owner: Owner,
        queued: Instant,
        timeout: Duration,
    ) -> Result<(FlightKey, u32), (Owner, Settled)> {
        let src_ip = match self.sources.for_target(dst) {
            Ok(ip) => ip,
            Err(e) => return Err((owner, Settled::NoSource(e))),
        };
        let round = self.round;
        self.round = self.round.wrapping_add(1);
        let n = self.ports.len();
        let Some(sport) = (0..n)
            .map(|i| self.ports[(round as usize + i) % n])
            .find(|&p| !self.flights.contains_key(&(dst, p)))
        else {
            return Err((owner, Settled::NoPort));
        };
        let src = SocketAddr::new(src_ip, sport);
        let isn = packet::isn(&self.key, src, dst, round);
        self.flights.insert((dst, sport), Flight { isn, owner });
        self.outgoing.push(Outgoing {
            queued,
            timeout,
            dst,
            sport,
            isn,
            segment: packet::syn(src, dst, isn),
        });
        Ok(((dst, sport), isn))
    }

    /// Ends the probes that were answered (or could not start) at `at`.
    fn settle(&mut self, at: Instant) {
        for (owner, settled) in self.settled.drain(..) {
            match owner {
                Owner::Once(reply) => {
                    let _ = reply.send(settled);
                }
                Owner::Entry { id, stamp } => {
                    let Some((target, _, started)) = self.plan.running(id, stamp) else {
                        continue;
                    };
                    let outcome = outcome_of(verdict(settled), at - started, target);
                    if let Some(report) = self.plan.settle(id, stamp, outcome, at) {
                        self.outbox.push_back((id, stamp, report));
                    }
                }
            }
        }
    }

    /// Hands the waiting reports to their channels, as many as they take, in batches.
    fn deliver(&mut self, now: Instant) {
        while let Some(&(id, stamp, _)) = self.outbox.front() {
            let Some(tx) = self.plan.reporter(id, stamp).cloned() else {
                // Cancelled meanwhile: no report, the entry ends.
                self.outbox.pop_front();
                self.plan.remove_run(id, stamp);
                continue;
            };
            let run = self
                .outbox
                .iter()
                .take(tx.capacity().max(1))
                .take_while(|(id, stamp, _)| {
                    self.plan
                        .reporter(*id, *stamp)
                        .is_some_and(|t| t.same_channel(&tx))
                })
                .count();
            match tx.try_reserve_many(run) {
                Ok(permits) => {
                    for permit in permits {
                        let (id, stamp, report) = self.outbox.pop_front().expect("counted");
                        permit.send(report);
                        self.plan.reported(id, stamp, now);
                    }
                }
                Err(TrySendError::Full(())) => return,
                Err(TrySendError::Closed(())) => {
                    self.outbox.pop_front();
                    self.plan.closed(id, stamp);
                }
            }
        }
    }

    /// Sleeps until the next work is due, or a reply or command comes.
    fn wait(&mut self) {
        let now = Instant::now();
        let wait = if self.outbox.is_empty() {
            self.plan.next_wait(now)
        } else {
            // Reports wait for room in their channel: try again soon.
            Some(GATHER)
        };
        if let Some(w) = wait
            && w <= GATHER
        {
            if !w.is_zero() {
                std::thread::sleep(w);
            }
            return;
        }
        let timeout = wait.map_or(-1, |w| w.as_micros().div_ceil(1000).min(60_000) as i32);
        let mut fds = [
            pollfd(self.wake.as_raw_fd()),
            pollfd(self.v4.as_raw_fd()),
            pollfd(self.v6.as_ref().map_or(-1, |s| s.as_raw_fd())),
        ];
        // SAFETY: three pollfds alive for the call (a negative fd is ignored by poll).
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if fds[0].revents != 0 {
            let mut count = 0u64;
            // SAFETY: reads 8 bytes into `count` from our non-blocking eventfd.
            unsafe { libc::read(self.wake.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        }
    }
}

fn pollfd(fd: libc::c_int) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::{Ipv4Addr, TcpListener};

    use tokio::sync::mpsc;

    use super::*;
    use crate::config::TcpCheck;
    use crate::probe::{NetProber, SharedSignals, spawn_spread};

    fn syn_probe(interval_ms: u64) -> Arc<ProbeConfig> {
        let mut cfg = ProbeConfig::new("tcp", ProbeKind::Tcp);
        cfg.tcp_check = TcpCheck::Syn;
        cfg.interval = Duration::from_millis(interval_ms);
        cfg.jitter = Duration::ZERO;
        cfg.timeout = Duration::from_millis(interval_ms / 2);
        Arc::new(cfg)
    }

    fn can_run() -> bool {
        if super::super::availability() == Err("no CAP_NET_RAW") {
            eprintln!("skipped: needs CAP_NET_RAW");
            return false;
        }
        true
    }

    /// Many targets on the real kernel (loopback: 127.0.x.y all answer): each is probed
    /// on its own schedule, the first runs spread over the interval, none twice within
    /// an interval, and every report is the target's verdict.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_targets_stay_spread_and_none_is_probed_twice_within_an_interval() {
        if !can_run() {
            return;
        }
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let interval = 200;
        let cfg = syn_probe(interval);
        let (tx, mut rx) = mpsc::channel(16_384);
        let n = 2000u16;
        let start = tokio::time::Instant::now();
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let addr =
                    SocketAddr::from(([127, 0, 1 + (i / 250) as u8, 1 + (i % 250) as u8], port));
                let task = spawn_spread(
                    Arc::new(NetProber),
                    ServerKey { service: 7, addr },
                    0,
                    cfg.clone(),
                    Arc::new(SharedSignals::new(true)),
                    tx.clone(),
                    cfg.interval,
                );
                assert!(
                    matches!(task.runner, crate::probe::schedule::Runner::Engine(_)),
                    "a SYN check with the real prober runs in the engine"
                );
                task
            })
            .collect();
        let mut seen: HashMap<SocketAddr, Vec<tokio::time::Instant>> = HashMap::new();
        let end = start + Duration::from_millis(5 * interval + interval / 2);
        while let Ok(Some(r)) = tokio::time::timeout_at(end, rx.recv()).await {
            assert!(r.outcome.ok, "{r:?}");
            assert_eq!(r.outcome.detail, "connected (SYN-ACK)");
            assert_eq!(r.probe, 0);
            seen.entry(r.server.addr).or_default().push(r.at);
        }
        assert_eq!(seen.len(), n as usize, "every target reported");
        let mut first_windows = [0usize; 10];
        for (addr, at) in &seen {
            assert!(at.len() >= 4, "{addr}: {} reports", at.len());
            for w in at.windows(2) {
                let gap = w[1] - w[0];
                // The runs start exactly one interval apart; the verdicts' own delays
                // (≤ a few ms on loopback) make the gap vary a little.
                assert!(
                    gap >= Duration::from_millis(interval - 20),
                    "{addr}: {gap:?}"
                );
                assert!(
                    gap <= Duration::from_millis(interval + 60),
                    "{addr}: {gap:?}"
                );
            }
            let first = (at[0] - start).as_millis() as u64;
            first_windows[((first * 10 / interval) as usize).min(9)] += 1;
        }
        // Spread over the interval: every tenth of it holds some first runs, none more
        // than three times its share.
        assert!(
            first_windows
                .iter()
                .all(|&c| c > 0 && c <= 3 * n as usize / 10),
            "{first_windows:?}"
        );
        drop(tasks);
    }

    /// Only plain tcp probes run in the engine: the other kinds (which share the fields
    /// a SYN check looks at) and tcp probes with data keep their task.
    #[tokio::test]
    async fn only_plain_tcp_probes_run_in_the_engine() {
        if !can_run() {
            return;
        }
        let (tx, _rx) = mpsc::channel(4);
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut with_data = (*syn_probe(1000)).clone();
        with_data.tcp_check = TcpCheck::Auto;
        with_data.send = Some(b"x".to_vec());
        let mut connect = (*syn_probe(1000)).clone();
        connect.tcp_check = TcpCheck::Connect;
        let mut cases = vec![
            (ProbeConfig::new("http", ProbeKind::Http), false),
            (ProbeConfig::new("udp", ProbeKind::Udp), false),
            (ProbeConfig::new("icmp", ProbeKind::Icmp), false),
            (with_data, false),
            (connect, false),
            ((*syn_probe(1000)).clone(), true),
        ];
        let mut auto = ProbeConfig::new("tcp", ProbeKind::Tcp);
        auto.tcp_check = TcpCheck::Auto;
        cases.push((auto, true));
        for (cfg, engine) in cases {
            let name = format!("{:?} {:?}", cfg.kind, cfg.tcp_check);
            let task = spawn_spread(
                Arc::new(NetProber),
                ServerKey { service: 10, addr },
                0,
                Arc::new(cfg),
                Arc::new(SharedSignals::new(true)),
                tx.clone(),
                Duration::from_secs(1),
            );
            assert_eq!(
                matches!(task.runner, crate::probe::schedule::Runner::Engine(_)),
                engine,
                "{name}"
            );
        }
    }

    /// A closed port is refused at once, and a dropped task neither probes nor reports
    /// again; a closed report channel ends the entry.
    #[tokio::test]
    async fn refused_then_dropped_then_closed() {
        if !can_run() {
            return;
        }
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let cfg = syn_probe(50);
        let (tx, mut rx) = mpsc::channel(64);
        let task = spawn_spread(
            Arc::new(NetProber),
            ServerKey { service: 8, addr },
            0,
            cfg.clone(),
            Arc::new(SharedSignals::new(true)),
            tx.clone(),
            Duration::from_millis(1),
        );
        let r = tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(
            !r.outcome.ok && r.outcome.immediate && !r.outcome.local,
            "{r:?}"
        );
        assert_eq!(r.outcome.detail, "connection refused");
        drop(task);
        // At most one report was already on its way when the task was dropped.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut after = 0;
        while rx.try_recv().is_ok() {
            after += 1;
        }
        assert!(after <= 1, "{after} reports after the drop");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(rx.try_recv().is_err(), "no report long after the drop");

        let (tx2, rx2) = mpsc::channel(64);
        let task = spawn_spread(
            Arc::new(NetProber),
            ServerKey { service: 9, addr },
            0,
            cfg,
            Arc::new(SharedSignals::new(true)),
            tx2,
            Duration::from_millis(1),
        );
        drop(rx2);
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while !task.is_finished() {
            assert!(std::time::Instant::now() < deadline, "never finished");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(tx);
    }
}
