//! Flows whose packets leave from each CPU in turn: one sender thread, pinned to CPU 0
//! and CPU 1 alternately (`sched_setaffinity` between rounds), sends a burst on every
//! flow in each round. A veth hands what is sent to its peer's NAPI on the sending CPU,
//! so with a queue per CPU the lb's native XDP program handles one flow's packets on
//! both CPUs, interleaved (`netns_multiqueue`).
//!
//! Every payload is a series of [`STAMP_LEN`]-byte stamps, each holding the wall-clock
//! time (`CLOCK_REALTIME`) at which it was written, so a capture at the receiver
//! ([`crate::traffic::arrivals`]) knows when a packet's data left the sender. UDP flows
//! live as long as the sender; TCP flows (`TCP_NODELAY`, replies read and dropped) are
//! closed after [`SpreadConfig::tcp_rounds`] rounds, or when they fail, and replaced by
//! new connections, so that new flows keep arriving too.

use std::{
    io::{self, Read, Write},
    net::{IpAddr, SocketAddr, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::{agent::daemon::Proto, net::netns::NetNs, util::error::Error};

/// Bytes of one stamp: a magic word, four zero bytes, the time in ns (big endian).
pub const STAMP_LEN: usize = 16;
const STAMP_MAGIC: u32 = 0x5350_5244;
/// How long a new TCP connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);

/// Nanoseconds since the epoch, `CLOCK_REALTIME` (the clock of the kernel's receive
/// times).
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The time of the stamp a payload starts with, if it starts with one.
pub fn read_stamp(payload: &[u8]) -> Option<u64> {
    let head: [u8; STAMP_LEN] = payload.get(..STAMP_LEN)?.try_into().ok()?;
    let magic = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    (magic == STAMP_MAGIC && head[4..8] == [0; 4])
        .then(|| u64::from_be_bytes(head[8..16].try_into().expect("8 bytes")))
}

fn stamp() -> [u8; STAMP_LEN] {
    let mut s = [0u8; STAMP_LEN];
    s[..4].copy_from_slice(&STAMP_MAGIC.to_be_bytes());
    s[8..].copy_from_slice(&wall_ns().to_be_bytes());
    s
}

/// What to send.
#[derive(Clone, Debug)]
pub struct SpreadConfig {
    /// The source address of the UDP flows (TCP flows take the route's).
    pub src: IpAddr,
    /// `(protocol, destination, flows)`: each destination gets that many flows.
    pub targets: Vec<(Proto, SocketAddr, usize)>,
    /// One round (a burst on every flow) this often.
    pub round: Duration,
    /// Packets per flow per round, back to back on one CPU.
    pub burst: usize,
    /// Rounds after which a TCP flow is closed and replaced.
    pub tcp_rounds: u32,
    /// The sender stops by itself after this long (a bound for a test that fails).
    pub limit: Duration,
}

/// What the sender did.
#[derive(Clone, Debug, Default)]
pub struct SpreadReport {
    /// Rounds on each CPU, as `sched_getcpu` saw them.
    pub rounds_by_cpu: [u64; 2],
    /// Packets (UDP datagrams, TCP writes) sent.
    pub sent: u64,
    /// TCP connections opened, and those that failed to open or broke.
    pub tcp_opened: u64,
    pub tcp_failed: u64,
}

/// A running sender; stopped on drop.
pub struct Spread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<SpreadReport, Error>>>,
}

impl Spread {
    /// Starts the sender in `ns` (its sockets belong to `ns`).
    pub fn start(ns: &NetNs, config: SpreadConfig) -> Spread {
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, flag) = (ns.clone(), Arc::clone(&stop));
        let handle = thread::spawn(move || ns.run(move || send(&config, &flag))?);
        Spread {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the sender and returns what it did.
    pub fn stop(mut self) -> Result<SpreadReport, Error> {
        self.finish()
    }

    fn finish(&mut self) -> Result<SpreadReport, Error> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take() {
            Some(h) => h
                .join()
                .map_err(|_| Error::Unexpected("the spread sender panicked".into()))?,
            None => Ok(SpreadReport::default()),
        }
    }
}

impl Drop for Spread {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

enum Flow {
    Udp(UdpSocket),
    Tcp {
        stream: TcpStream,
        rounds: u32,
    },
    /// A TCP flow to open in the next round.
    Closed,
}

fn send(config: &SpreadConfig, stop: &AtomicBool) -> Result<SpreadReport, Error> {
    let mut report = SpreadReport::default();
    let mut flows = Vec::new();
    for &(proto, dst, n) in &config.targets {
        for _ in 0..n {
            let flow = match proto {
                Proto::Udp => Flow::Udp(
                    udp_flow(config.src, dst)
                        .map_err(Error::io(format!("opening a UDP flow to {dst}")))?,
                ),
                Proto::Tcp => Flow::Closed,
            };
            flows.push((dst, flow));
        }
    }
    let started = Instant::now();
    let mut buf = [0u8; 2048];
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) && started.elapsed() < config.limit {
        let cpu = (round % 2) as usize;
        pin_to(cpu).map_err(Error::io(format!("pinning the sender to CPU {cpu}")))?;
        // SAFETY: sched_getcpu has no preconditions.
        if let Some(n) = usize::try_from(unsafe { libc::sched_getcpu() })
            .ok()
            .and_then(|c| report.rounds_by_cpu.get_mut(c))
        {
            *n += 1;
        }
        for (dst, flow) in &mut flows {
            if let Flow::Tcp { rounds, .. } = flow
                && *rounds >= config.tcp_rounds
            {
                *flow = Flow::Closed;
            }
            if let Flow::Closed = flow {
                match tcp_flow(*dst) {
                    Ok(stream) => {
                        report.tcp_opened += 1;
                        *flow = Flow::Tcp { stream, rounds: 0 };
                    }
                    Err(_) => {
                        report.tcp_failed += 1;
                        continue;
                    }
                }
            }
            let ok = burst(flow, config.burst, &mut buf, &mut report.sent);
            if !ok {
                report.tcp_failed += 1;
                *flow = Flow::Closed;
            }
        }
        round += 1;
        thread::sleep(config.round);
    }
    Ok(report)
}

/// Sends `n` stamped packets on `flow` and drops what came back; false when a TCP
/// connection broke.
fn burst(flow: &mut Flow, n: usize, buf: &mut [u8], sent: &mut u64) -> bool {
    match flow {
        Flow::Udp(sock) => {
            for _ in 0..n {
                if sock.send(&stamp()).is_ok() {
                    *sent += 1;
                }
            }
            while sock.recv(buf).is_ok() {}
            true
        }
        Flow::Tcp { stream, rounds } => {
            *rounds += 1;
            for _ in 0..n {
                match stream.write(&stamp()) {
                    Ok(_) => *sent += 1,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => return false,
                }
            }
            loop {
                match stream.read(buf) {
                    Ok(0) => return false,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    Err(_) => return false,
                }
            }
        }
        Flow::Closed => true,
    }
}

fn udp_flow(src: IpAddr, dst: SocketAddr) -> io::Result<UdpSocket> {
    let sock = UdpSocket::bind(SocketAddr::new(src, 0))?;
    sock.connect(dst)?;
    sock.set_nonblocking(true)?;
    Ok(sock)
}

fn tcp_flow(dst: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT)?;
    stream.set_nodelay(true)?;
    stream.set_nonblocking(true)?;
    Ok(stream)
}

/// Moves the calling thread to CPU `cpu` (it runs there when the call returns).
fn pin_to(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it; the call
    // reads `size_of` bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
