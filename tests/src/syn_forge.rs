//! A host that answers TCP SYNs with forged replies: it reads the SYNs arriving at its
//! namespace from a packet socket (before netfilter, so a port that nftables drops still
//! shows them) and answers each with a SYN-ACK and an RST+ACK whose acknowledgement
//! numbers are wrong (the SYN's sequence number + 2, and + 0), from the SYN's
//! destination, through a raw socket. A SYN check must believe neither.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
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
    netns::NetNs,
    packet::{TCP_ACK, TCP_RST, TCP_SYN, checksum, fold, pseudo_header_sum, sum_words},
};

/// `IPPROTO_RAW`: sending implies `IP_HDRINCL`.
const IPPROTO_RAW: i32 = 255;

/// A running forger; stops (and is joined) on drop, or after its time limit.
pub struct SynForger {
    stop: Arc<AtomicBool>,
    forged: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl SynForger {
    /// Starts forging answers, in `ns`, to SYNs for `port`, for at most `limit`.
    pub fn start(ns: &NetNs, port: u16, limit: Duration) -> io::Result<SynForger> {
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
                let (rx, tx) = sockets?;
                forge(&rx, &tx, port, limit, &s, &f)
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

    /// Forged replies sent so far.
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

/// A packet socket that gets every IPv4 packet (without the Ethernet header), and a raw
/// socket to send whole IPv4 packets.
fn open() -> io::Result<(Socket, Socket)> {
    let eth_p_ip = (libc::ETH_P_IP as u16).to_be();
    let rx = Socket::new(
        Domain::PACKET,
        Type::DGRAM,
        Some(Protocol::from(i32::from(eth_p_ip))),
    )?;
    rx.set_read_timeout(Some(Duration::from_millis(100)))?;
    let tx = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_RAW)))?;
    Ok((rx, tx))
}

fn forge(
    rx: &Socket,
    tx: &Socket,
    port: u16,
    limit: Duration,
    stop: &AtomicBool,
    forged: &AtomicUsize,
) -> io::Result<()> {
    let end = Instant::now() + limit;
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        // SAFETY: `buf` is valid for its length for the call.
        let n = unsafe { libc::recv(rx.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
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
        let Some((src, dst, sport, seq)) = syn_to(&buf[..n as usize], port) else {
            continue;
        };
        for (flags, ack) in [
            (TCP_SYN | TCP_ACK, seq.wrapping_add(2)),
            (TCP_RST | TCP_ACK, seq),
        ] {
            let pkt = reply(dst, src, port, sport, flags, ack);
            let to = SockAddr::from(SocketAddr::new(IpAddr::V4(src), 0));
            if tx.send_to(&pkt, &to).is_ok() {
                forged.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// A TCP SYN to `port` in IPv4 packet `p`: its source, destination, source port, seq.
fn syn_to(p: &[u8], port: u16) -> Option<(Ipv4Addr, Ipv4Addr, u16, u32)> {
    let ihl = usize::from(*p.first()? & 0x0f) * 4;
    if p.first()? >> 4 != 4 || *p.get(9)? != 6 || p.len() < ihl + 20 {
        return None;
    }
    let t = &p[ihl..];
    if u16::from_be_bytes([t[2], t[3]]) != port || t[13] & (TCP_SYN | TCP_ACK) != TCP_SYN {
        return None;
    }
    Some((
        Ipv4Addr::new(p[12], p[13], p[14], p[15]),
        Ipv4Addr::new(p[16], p[17], p[18], p[19]),
        u16::from_be_bytes([t[0], t[1]]),
        u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
    ))
}

/// An IPv4 packet with a bare TCP header, checksums filled in.
fn reply(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, flags: u8, ack: u32) -> Vec<u8> {
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&0x5eed_0000u32.to_be_bytes());
    tcp[8..12].copy_from_slice(&ack.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    let sum = pseudo_header_sum(src.into(), dst.into(), 6, tcp.len()) + sum_words(&tcp);
    tcp[16..18].copy_from_slice(&(!fold(sum)).to_be_bytes());
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
    ip[2..4].copy_from_slice(&((20 + tcp.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&tcp);
    ip
}
