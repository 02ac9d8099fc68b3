//! Millions of distinct TCP or UDP frames put on a namespace's wire fast enough for a
//! test: one template frame whose source address and port are rewritten per frame (both
//! checksums updated incrementally, RFC 1624), sent by `sendmmsg` batches on an
//! `AF_PACKET` socket. Every frame is delivered to the interface's queue: a batch the
//! full queue refuses (`ENOBUFS`, which needs a qdisc: [`crate::net::netns::NetNs::hold_bursts`])
//! is sent again after a short pause, within a time limit.

use std::{
    io,
    net::{IpAddr, Ipv4Addr},
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use crate::{
    net::netns::NetNs,
    traffic::{
        inject,
        packet::{Frame, IPPROTO_TCP, IPPROTO_UDP},
    },
    util::error::Error,
};

/// Frames per `sendmmsg` call.
const BATCH: usize = 64;
/// Pause after a full queue refused a frame.
const FULL_QUEUE_PAUSE: Duration = Duration::from_micros(200);
/// Bytes of every frame: an IPv4 TCP segment without options or payload, or an IPv4
/// UDP datagram of [`UDP_PAYLOAD`] bytes.
pub const FRAME_LEN: usize = 14 + 20 + 20;
/// The UDP datagrams' payload: their frames are as long as the TCP ones.
const UDP_PAYLOAD: [u8; 12] = *b"spoofed-flow";
/// Offsets in that frame.
const IP_CSUM: usize = 14 + 10;
const IP_SRC: usize = 14 + 12;
const L4_SPORT: usize = 14 + 20;
const TCP_CSUM: usize = 14 + 20 + 16;
const UDP_CSUM: usize = 14 + 20 + 6;

/// An IPv4 TCP or UDP frame whose source changes per frame.
#[derive(Clone, Debug)]
pub struct FrameTemplate {
    bytes: [u8; FRAME_LEN],
    /// Where its transport checksum is.
    l4_csum: usize,
}

impl FrameTemplate {
    /// The TCP frame (no options, no payload) `src_mac → dst_mac`, `0.0.0.0:0 →
    /// dst:dport` with `flags`; each frame sent gets its own source
    /// ([`FrameTemplate::write`]).
    pub fn tcp(src_mac: [u8; 6], dst_mac: [u8; 6], dst: Ipv4Addr, dport: u16, flags: u8) -> Self {
        let f = Frame::tcp(
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            0,
            IpAddr::V4(dst),
            dport,
            flags,
        )
        .macs(src_mac, dst_mac);
        Self::of(&f, IPPROTO_TCP, TCP_CSUM)
    }

    /// The UDP frame `src_mac → dst_mac`, `0.0.0.0:0 → dst:dport`, a 12-byte payload.
    pub fn udp(src_mac: [u8; 6], dst_mac: [u8; 6], dst: Ipv4Addr, dport: u16) -> Self {
        let f = Frame::udp(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0, IpAddr::V4(dst), dport)
            .macs(src_mac, dst_mac)
            .payload(&UDP_PAYLOAD);
        Self::of(&f, IPPROTO_UDP, UDP_CSUM)
    }

    fn of(f: &Frame, proto: u8, l4_csum: usize) -> Self {
        let f = f.bytes();
        assert_eq!(
            f.len(),
            FRAME_LEN,
            "a plain IPv4 frame of the template's length"
        );
        assert_eq!(f[14 + 9], proto);
        let mut bytes = [0u8; FRAME_LEN];
        bytes.copy_from_slice(&f);
        FrameTemplate { bytes, l4_csum }
    }

    /// The template with source `src:sport`, checksums updated, into `out`.
    pub fn write(&self, src: Ipv4Addr, sport: u16, out: &mut [u8; FRAME_LEN]) {
        *out = self.bytes;
        let addr = src.octets();
        let port = sport.to_be_bytes();
        // The template's source is all zeroes: each checksum only gains the new words.
        let ip = add_words(read16(out, IP_CSUM), &addr);
        out[IP_CSUM..IP_CSUM + 2].copy_from_slice(&ip.to_be_bytes());
        let at = self.l4_csum;
        let l4 = add_words(add_words(read16(out, at), &addr), &port);
        out[at..at + 2].copy_from_slice(&l4.to_be_bytes());
        out[IP_SRC..IP_SRC + 4].copy_from_slice(&addr);
        out[L4_SPORT..L4_SPORT + 2].copy_from_slice(&port);
    }
}

fn read16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// RFC 1624 eqn. 3 for words that were zero: HC' = ~(~HC + m').
fn add_words(csum: u16, words: &[u8]) -> u16 {
    let mut sum = u32::from(!csum);
    for w in words.as_chunks::<2>().0 {
        sum += u32::from(u16::from_be_bytes(*w));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// What [`send`] did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sent {
    pub frames: u64,
    /// Times the full queue refused a frame (each resent after a pause).
    pub refusals: u64,
    pub elapsed: Duration,
}

impl Sent {
    pub fn per_second(&self) -> f64 {
        self.frames as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Sends frames `0..count` of `template`, frame `n` from `source(n)`, out of `ifname`
/// in `ns`, within `limit`.
pub fn send(
    ns: &NetNs,
    ifname: &str,
    template: &FrameTemplate,
    count: u64,
    source: impl Fn(u64) -> (Ipv4Addr, u16) + Send + Sync,
    limit: Duration,
) -> Result<Sent, Error> {
    let err = |what: &'static str| {
        let ifname = ifname.to_owned();
        move |source| Error::Io {
            what: format!("sending frames on {ifname}: {what}"),
            source,
        }
    };
    ns.run(|| -> Result<Sent, Error> {
        let (sock, index) = inject::packet_socket(ifname).map_err(|(what, e)| err(what)(e))?;
        let sent = stream(sock.as_raw_fd(), index, template, count, &source, limit)
            .map_err(err("sendmmsg"))?;
        if sent.frames < count {
            return Err(Error::Timeout {
                what: format!("{count} frames to be sent on {ifname}"),
                waited: limit,
                last: format!("{} sent", sent.frames),
            });
        }
        Ok(sent)
    })?
}

fn stream(
    fd: i32,
    ifindex: u32,
    template: &FrameTemplate,
    count: u64,
    source: &(impl Fn(u64) -> (Ipv4Addr, u16) + Sync),
    limit: Duration,
) -> io::Result<Sent> {
    // SAFETY: a zeroed sockaddr_ll is valid; the fields sendmmsg needs are set.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_ifindex = ifindex as i32;
    addr.sll_halen = 6;
    addr.sll_addr[..6].copy_from_slice(&template.bytes[..6]);
    let mut frames = vec![[0u8; FRAME_LEN]; BATCH];
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(BATCH);
    // SAFETY: zeroed mmsghdrs are valid; they are filled before each call.
    let mut msgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut out = Sent::default();
    let started = Instant::now();
    // Frames `next..next + ready` are built in `frames[..ready]`.
    let mut next = 0u64;
    let mut ready = 0usize;
    while next < count && started.elapsed() < limit {
        if ready == 0 {
            ready = BATCH.min((count - next) as usize);
            for (i, f) in frames.iter_mut().take(ready).enumerate() {
                let (ip, port) = source(next + i as u64);
                template.write(ip, port, f);
            }
        }
        iovs.clear();
        for f in frames.iter_mut().take(ready) {
            iovs.push(libc::iovec {
                iov_base: f.as_mut_ptr().cast(),
                iov_len: FRAME_LEN,
            });
        }
        for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
            m.msg_hdr.msg_name = (&raw mut addr).cast();
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_ll>() as u32;
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `ready` headers, each pointing at live iovecs, frames and address.
        let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), ready as u32, 0) };
        let taken = if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ENOBUFS) | Some(libc::EAGAIN) => 0,
                Some(libc::EINTR) => continue,
                _ => return Err(e),
            }
        } else {
            n as usize
        };
        out.frames += taken as u64;
        next += taken as u64;
        if taken < ready {
            // The first frame not taken was refused by the full queue: it and the rest
            // of the batch go again (moved to the front) after a pause.
            frames.copy_within(taken..ready, 0);
            ready -= taken;
            out.refusals += 1;
            std::thread::sleep(FULL_QUEUE_PAUSE);
        } else {
            ready = 0;
        }
    }
    out.elapsed = started.elapsed();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::packet::TCP_ACK;

    #[test]
    fn a_rewritten_template_equals_the_frame_built_whole() {
        let (a, b) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let dst = Ipv4Addr::new(10, 77, 1, 200);
        let tcp = FrameTemplate::tcp(a, b, dst, 8080, TCP_ACK);
        let udp = FrameTemplate::udp(a, b, dst, 53);
        for (src, port) in [
            (Ipv4Addr::new(198, 18, 0, 0), 1),
            (Ipv4Addr::new(198, 19, 255, 255), 65535),
            (Ipv4Addr::new(255, 255, 255, 254), 40000),
        ] {
            let mut out = [0u8; FRAME_LEN];
            tcp.write(src, port, &mut out);
            let whole = Frame::tcp(IpAddr::V4(src), port, IpAddr::V4(dst), 8080, TCP_ACK)
                .macs(a, b)
                .bytes();
            assert_eq!(out.as_slice(), whole.as_slice(), "TCP {src}:{port}");
            udp.write(src, port, &mut out);
            let whole = Frame::udp(IpAddr::V4(src), port, IpAddr::V4(dst), 53)
                .macs(a, b)
                .payload(&UDP_PAYLOAD)
                .bytes();
            assert_eq!(out.as_slice(), whole.as_slice(), "UDP {src}:{port}");
        }
    }
}
