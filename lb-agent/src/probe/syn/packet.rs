//! The SYN check's packets: the SYN we send (a bare TCP header with an MSS option, its
//! checksum over the pseudo-header), the replies we accept (SYN-ACK or RST+ACK), and the
//! initial sequence number, a keyed hash of the 4-tuple and the probe round.

use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};

/// TCP header of our SYN: 20 bytes plus the 4-byte MSS option.
pub(super) const SYN_LEN: usize = 24;
/// MSS we announce (the connection never carries data).
const MSS: u16 = 1460;
/// Window we announce.
const WINDOW: u16 = 64_240;

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;

/// The ISN of the probe of `dst` from `src` in round `round`: a keyed hash (`key` is
/// secret and per agent run), so only a host that saw our SYN can answer it.
pub(super) fn isn(key: &impl BuildHasher, src: SocketAddr, dst: SocketAddr, round: u32) -> u32 {
    key.hash_one((src, dst, round)) as u32
}

/// Our SYN from `src` to `dst` with sequence number `seq`, checksum included.
pub(super) fn syn(src: SocketAddr, dst: SocketAddr, seq: u32) -> [u8; SYN_LEN] {
    let mut h = [0u8; SYN_LEN];
    h[0..2].copy_from_slice(&src.port().to_be_bytes());
    h[2..4].copy_from_slice(&dst.port().to_be_bytes());
    h[4..8].copy_from_slice(&seq.to_be_bytes());
    // ack 0; data offset 6 words; flags SYN.
    h[12] = ((SYN_LEN / 4) as u8) << 4;
    h[13] = SYN;
    h[14..16].copy_from_slice(&WINDOW.to_be_bytes());
    // checksum [16..18] below, urgent pointer 0.
    h[20] = 2; // MSS option kind, length 4
    h[21] = 4;
    h[22..24].copy_from_slice(&MSS.to_be_bytes());
    let sum = checksum(src.ip(), dst.ip(), &h);
    h[16..18].copy_from_slice(&sum.to_be_bytes());
    h
}

/// The TCP checksum of `segment` (its checksum field zero) from `src` to `dst`.
pub(super) fn checksum(src: IpAddr, dst: IpAddr, segment: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut add = |bytes: &[u8]| {
        for c in bytes.chunks(2) {
            sum += u64::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
        }
    };
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            add(&s.octets());
            add(&d.octets());
            add(&[0, 6]);
            add(&(segment.len() as u16).to_be_bytes());
        }
        _ => {
            add(&ip6_octets(src));
            add(&ip6_octets(dst));
            add(&(segment.len() as u32).to_be_bytes());
            add(&[0, 0, 0, 6]);
        }
    }
    add(segment);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn ip6_octets(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// What a reply says about the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// SYN-ACK: the port accepts connections.
    Accepts,
    /// RST with ACK: the port refused.
    Refuses,
}

/// A reply to one of our SYNs, not yet verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reply {
    /// The port it came from (our SYN's destination port).
    pub from_port: u16,
    /// Our source port it went to.
    pub to_port: u16,
    /// Its acknowledgement number: our ISN + 1 if it answers our SYN.
    pub ack: u32,
    pub answer: Answer,
}

/// Why a packet on the raw socket is not a reply we could use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Malformed {
    /// Too short for the headers it announces, or not IPv4/TCP.
    Truncated,
    /// Neither SYN-ACK nor RST+ACK (the socket filter lets only those through).
    Flags,
}

/// Parses `segment`, a TCP header (an IPv6 raw socket's packet, or an IPv4 one after
/// [`strip_ipv4`]).
pub(super) fn parse(segment: &[u8]) -> Result<Reply, Malformed> {
    if segment.len() < 20 || usize::from(segment[12] >> 4) * 4 < 20 {
        return Err(Malformed::Truncated);
    }
    let flags = segment[13];
    let answer = if flags & (SYN | ACK | RST | FIN) == SYN | ACK {
        Answer::Accepts
    } else if flags & (RST | ACK) == RST | ACK && flags & SYN == 0 {
        Answer::Refuses
    } else {
        return Err(Malformed::Flags);
    };
    Ok(Reply {
        from_port: u16::from_be_bytes([segment[0], segment[1]]),
        to_port: u16::from_be_bytes([segment[2], segment[3]]),
        ack: u32::from_be_bytes([segment[8], segment[9], segment[10], segment[11]]),
        answer,
    })
}

/// The TCP segment of an IPv4 packet as a raw socket delivers it (IP header first); only
/// first fragments of TCP.
pub(super) fn strip_ipv4(packet: &[u8]) -> Result<&[u8], Malformed> {
    let first = *packet.first().ok_or(Malformed::Truncated)?;
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < 20 || packet.len() < ihl || packet[9] != 6 {
        return Err(Malformed::Truncated);
    }
    // A later fragment has no TCP header at its start.
    if u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff != 0 {
        return Err(Malformed::Truncated);
    }
    Ok(&packet[ihl..])
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::RandomState;

    use super::*;

    fn v4(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn syn_checksum_verifies_and_matches_a_known_value() {
        let (src, dst) = (v4("10.0.0.1:40000"), v4("10.0.0.2:80"));
        let pkt = syn(src, dst, 0x0102_0304);
        assert_eq!(&pkt[0..2], &40000u16.to_be_bytes());
        assert_eq!(&pkt[2..4], &80u16.to_be_bytes());
        assert_eq!(&pkt[4..8], &[1, 2, 3, 4]);
        assert_eq!(pkt[12] >> 4, 6, "data offset counts the MSS option");
        assert_eq!(pkt[13], SYN);
        // A segment with its checksum sums to zero over the pseudo-header.
        assert_eq!(checksum(src.ip(), dst.ip(), &pkt), 0);
        // Against an independent sum by hand of the 16-bit words.
        let words: u32 = [
            0x0a00, 0x0001, 0x0a00, 0x0002, 0x0006, 24, // pseudo-header
            40000, 80, 0x0102, 0x0304, 0, 0, 0x6002, 64_240, 0, 0, 0x0204, 1460,
        ]
        .iter()
        .sum();
        let folded = (words & 0xffff) + (words >> 16);
        let expected = !((folded & 0xffff) + (folded >> 16)) as u16;
        assert_eq!(u16::from_be_bytes([pkt[16], pkt[17]]), expected);
    }

    #[test]
    fn ipv6_checksum_verifies() {
        let src: SocketAddr = "[fd00::1]:40001".parse().unwrap();
        let dst: SocketAddr = "[fd00::2]:443".parse().unwrap();
        let pkt = syn(src, dst, 7);
        assert_eq!(checksum(src.ip(), dst.ip(), &pkt), 0);
        assert_ne!(
            checksum(src.ip(), "fd00::3".parse().unwrap(), &pkt),
            0,
            "the pseudo-header covers the destination"
        );
    }

    fn reply(flags: u8, ack: u32) -> Vec<u8> {
        let mut h = vec![0u8; 20];
        h[0..2].copy_from_slice(&80u16.to_be_bytes());
        h[2..4].copy_from_slice(&40000u16.to_be_bytes());
        h[8..12].copy_from_slice(&ack.to_be_bytes());
        h[12] = 5 << 4;
        h[13] = flags;
        h
    }

    #[test]
    fn replies_parse_by_their_flags() {
        let got = parse(&reply(SYN | ACK, 42)).unwrap();
        assert_eq!(
            got,
            Reply {
                from_port: 80,
                to_port: 40000,
                ack: 42,
                answer: Answer::Accepts
            }
        );
        assert_eq!(parse(&reply(RST | ACK, 9)).unwrap().answer, Answer::Refuses);
        assert_eq!(parse(&reply(SYN, 1)), Err(Malformed::Flags), "a bare SYN");
        assert_eq!(
            parse(&reply(RST, 1)),
            Err(Malformed::Flags),
            "RST without ACK"
        );
        assert_eq!(parse(&reply(ACK, 1)), Err(Malformed::Flags));
        assert_eq!(parse(&reply(SYN | ACK | RST, 1)), Err(Malformed::Flags));
        assert_eq!(parse(&reply(SYN | ACK, 1)[..19]), Err(Malformed::Truncated));
        let mut short_offset = reply(SYN | ACK, 1);
        short_offset[12] = 4 << 4;
        assert_eq!(parse(&short_offset), Err(Malformed::Truncated));
    }

    #[test]
    fn ipv4_header_is_stripped_by_its_length() {
        let mut pkt = vec![0x46, 0, 0, 0, 0, 0, 0, 0, 64, 6];
        pkt.resize(24, 0);
        pkt.extend(reply(SYN | ACK, 5));
        assert_eq!(parse(strip_ipv4(&pkt).unwrap()).unwrap().ack, 5);
        let mut udp = pkt.clone();
        udp[9] = 17;
        assert_eq!(strip_ipv4(&udp), Err(Malformed::Truncated));
        let mut fragment = pkt.clone();
        fragment[7] = 1;
        assert_eq!(strip_ipv4(&fragment), Err(Malformed::Truncated));
        assert_eq!(strip_ipv4(&pkt[..10]), Err(Malformed::Truncated));
    }

    #[test]
    fn isn_depends_on_key_tuple_and_round() {
        let key = RandomState::new();
        let (src, dst) = (v4("10.0.0.1:40000"), v4("10.0.0.2:80"));
        let a = isn(&key, src, dst, 1);
        assert_eq!(a, isn(&key, src, dst, 1), "stable within a run");
        assert_ne!(a, isn(&key, src, dst, 2), "a new round, a new ISN");
        assert_ne!(a, isn(&key, src, v4("10.0.0.2:81"), 1));
        assert_ne!(a, isn(&key, v4("10.0.0.1:40001"), dst, 1));
        assert_ne!(
            a,
            isn(&RandomState::new(), src, dst, 1),
            "another run's key"
        );
    }
}
