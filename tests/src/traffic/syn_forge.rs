//! A host that answers TCP SYNs with forged replies: it reads the SYNs (IPv4 and IPv6)
//! arriving at its namespace from a packet socket (before netfilter, so a port that
//! nftables drops still shows them) and answers each, from the SYN's destination through
//! a raw socket, with what [`Forgery`] says: a SYN-ACK and an RST+ACK whose
//! acknowledgement numbers are wrong, or an ICMP host unreachable quoting the SYN with a
//! wrong sequence number (what an attacker off the path sends). A SYN check must believe
//! none of them.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{
    net::netns::NetNs,
    traffic::packet::{Frame, TCP_ACK, TCP_RST, TCP_SYN, Transport},
};

/// `IPPROTO_RAW`: sending implies `IP_HDRINCL` (and `IPV6_HDRINCL` on IPv6).
const IPPROTO_RAW: i32 = 255;
/// `ETH_P_ALL`: a packet socket that sees every protocol.
const ETH_P_ALL: u16 = 0x0003;

/// What the forger answers a SYN with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forgery {
    /// A SYN-ACK acknowledging the SYN's sequence number + 2 and an RST+ACK
    /// acknowledging it + 0 (the right one is + 1).
    TcpWrongAck,
    /// An ICMP host unreachable (IPv4 type 3 code 1, IPv6 type 1 code 3) quoting the SYN
    /// with its sequence number + 2^31: out of any window, so the kernel's TCP ignores it
    /// for a connect as well (it takes a quote of ISN or ISN + 1 in SYN-SENT).
    IcmpWrongSeq,
}

/// A running forger; stops (and is joined) on drop, or after its time limit.
pub struct SynForger {
    stop: Arc<AtomicBool>,
    forged: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl SynForger {
    /// Starts forging SYN-ACKs and RSTs, in `ns`, to SYNs for `port`, for at most `limit`.
    pub fn start(ns: &NetNs, port: u16, limit: Duration) -> io::Result<SynForger> {
        SynForger::start_with(ns, port, limit, Forgery::TcpWrongAck)
    }

    /// Starts forging `forgery`, in `ns`, to SYNs for `port`, for at most `limit`.
    pub fn start_with(
        ns: &NetNs,
        port: u16,
        limit: Duration,
        forgery: Forgery,
    ) -> io::Result<SynForger> {
        let stop = Arc::new(AtomicBool::new(false));
        let forged = Arc::new(AtomicUsize::new(0));
        let (ns, s, f) = (ns.clone(), stop.clone(), forged.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = thread::spawn(move || {
            let run = ns.run(|| -> io::Result<()> {
                let sockets = open();
                let failed = sockets
                    .as_ref()
                    .err()
                    .map(|e| io::Error::new(e.kind(), e.to_string()));
                let _ = ready_tx.send(failed);
                let sockets = sockets?;
                forge(&sockets, port, limit, forgery, &s, &f)
            });
            if let Ok(Err(e)) = run {
                eprintln!("syn forger stopped: {e}");
            }
        });
        match ready_rx.recv_timeout(Duration::from_secs(5)) {
            Ok(None) => Ok(SynForger {
                stop,
                forged,
                thread: Some(thread),
            }),
            Ok(Some(e)) => Err(e),
            Err(_) => Err(io::Error::other("syn forger did not start")),
        }
    }

    /// Forged packets sent so far.
    pub fn forged(&self) -> usize {
        self.forged.load(Ordering::Relaxed)
    }
}

impl Drop for SynForger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The packet socket that gets every packet (without the link header), and a raw socket
/// per family to send whole IP packets.
struct Sockets {
    rx: Socket,
    tx4: Socket,
    tx6: Socket,
}

fn open() -> io::Result<Sockets> {
    let rx = Socket::new(
        Domain::PACKET,
        Type::DGRAM,
        Some(Protocol::from(i32::from(ETH_P_ALL.to_be()))),
    )?;
    rx.set_read_timeout(Some(Duration::from_millis(100)))?;
    let raw = |d| Socket::new(d, Type::RAW, Some(Protocol::from(IPPROTO_RAW)));
    Ok(Sockets {
        rx,
        tx4: raw(Domain::IPV4)?,
        tx6: raw(Domain::IPV6)?,
    })
}

fn forge(
    s: &Sockets,
    port: u16,
    limit: Duration,
    forgery: Forgery,
    stop: &AtomicBool,
    forged: &AtomicUsize,
) -> io::Result<()> {
    let end = Instant::now() + limit;
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        // SAFETY: `buf` is valid for its length for the call.
        let n = unsafe { libc::recv(s.rx.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) {
                continue;
            }
            return Err(e);
        }
        let Some(syn) = syn_to(&buf[..n as usize], port) else {
            continue;
        };
        let tx = if syn.src.is_ipv4() { &s.tx4 } else { &s.tx6 };
        let to = SockAddr::from(SocketAddr::new(syn.src, 0));
        for pkt in answers(&syn, forgery) {
            if tx.send_to(&pkt, &to).is_ok() {
                forged.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// A SYN seen on the wire.
struct Syn {
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    seq: u32,
}

/// The forged packets answering `syn` (whole IP packets).
fn answers(syn: &Syn, forgery: Forgery) -> Vec<Vec<u8>> {
    let tcp = |flags, seq, ack, (src, sport), (dst, dport)| {
        let mut f = Frame::tcp(src, sport, dst, dport, flags);
        f.transport = Transport::Tcp {
            sport,
            dport,
            flags,
            seq,
            ack,
        };
        f
    };
    let (ours, theirs) = ((syn.dst, syn.dport), (syn.src, syn.sport));
    match forgery {
        Forgery::TcpWrongAck => [
            (TCP_SYN | TCP_ACK, syn.seq.wrapping_add(2)),
            (TCP_RST | TCP_ACK, syn.seq),
        ]
        .into_iter()
        .map(|(flags, ack)| tcp(flags, 0x5eed_0000, ack, ours, theirs).ip_bytes())
        .collect(),
        Forgery::IcmpWrongSeq => {
            let quoted = tcp(TCP_SYN, syn.seq.wrapping_add(1 << 31), 0, theirs, ours).ip_bytes();
            let (ty, code) = if syn.src.is_ipv4() { (3, 1) } else { (1, 3) };
            vec![
                Frame::icmp(syn.dst, syn.src, ty, code)
                    .payload(&quoted)
                    .ip_bytes(),
            ]
        }
    }
}

/// A TCP SYN to `port` in IP packet `p` (IPv4 or IPv6 without extension headers).
fn syn_to(p: &[u8], port: u16) -> Option<Syn> {
    let (src, dst, t): (IpAddr, IpAddr, &[u8]) = match p.first()? >> 4 {
        4 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            if *p.get(9)? != 6 || p.len() < ihl + 20 {
                return None;
            }
            let a = |i: usize| Ipv4Addr::new(p[i], p[i + 1], p[i + 2], p[i + 3]);
            (a(12).into(), a(16).into(), &p[ihl..])
        }
        6 => {
            if *p.get(6)? != 6 || p.len() < 40 + 20 {
                return None;
            }
            let a = |i: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&p[i..i + 16]).unwrap());
            (a(8).into(), a(24).into(), &p[40..])
        }
        _ => return None,
    };
    let dport = u16::from_be_bytes([t[2], t[3]]);
    if dport != port || t[13] & (TCP_SYN | TCP_ACK) != TCP_SYN {
        return None;
    }
    Some(Syn {
        src,
        dst,
        sport: u16::from_be_bytes([t[0], t[1]]),
        dport,
        seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
    })
}
