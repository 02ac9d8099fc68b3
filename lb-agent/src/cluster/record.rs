//! A sync record: one nat connection described by addresses (never by local ids, which
//! differ between nodes), 80 bytes on the wire (docs/internals/cluster-sync.md).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use super::error::Malformed;

/// What a record says about its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RecordKind {
    /// Established on the sending node.
    #[default]
    Open,
    /// Still alive: it saw traffic on the sending node.
    Refresh,
    /// Ended (RST, or both FINs).
    Close,
}

/// One connection as the nodes share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    pub kind: RecordKind,
    /// `lb_common::IPPROTO_TCP` or `IPPROTO_UDP`.
    pub protocol: u8,
    /// The `NAT_S_*` bits of the connection.
    pub state: u8,
    /// Milliseconds since the connection's last packet, as the sender saw it.
    pub age_ms: u32,
    pub vip: SocketAddr,
    pub client: SocketAddr,
    pub backend: SocketAddr,
    pub snat: SocketAddr,
}

/// A connection's identity: its client side (protocol, VIP and client address and
/// port, the addresses IPv6 or IPv4-mapped), packed into five words: compared and
/// hashed word by word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ConnKey([u64; 5]);

impl std::hash::Hash for ConnKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        for word in self.0 {
            state.write_u64(word);
        }
    }
}

impl Record {
    /// Bytes on the wire.
    pub const LEN: usize = 80;

    pub fn key(&self) -> ConnKey {
        let mut bytes = [0u8; 40];
        bytes[0] = self.protocol;
        bytes[1..19].copy_from_slice(&endpoint_bytes(self.vip));
        bytes[19..37].copy_from_slice(&endpoint_bytes(self.client));
        let mut words = [0u64; 5];
        for (word, chunk) in words.iter_mut().zip(bytes.as_chunks::<8>().0) {
            *word = u64::from_ne_bytes(*chunk);
        }
        ConnKey(words)
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(match self.kind {
            RecordKind::Open => 1,
            RecordKind::Refresh => 2,
            RecordKind::Close => 3,
        });
        out.push(self.protocol);
        out.push(self.state);
        out.push(if self.vip.is_ipv4() { 4 } else { 6 });
        out.extend_from_slice(&self.age_ms.to_be_bytes());
        for sa in [self.vip, self.client, self.backend, self.snat] {
            out.extend_from_slice(&endpoint_bytes(sa));
        }
    }

    /// Reads one record from exactly [`Record::LEN`] bytes.
    pub fn decode(b: &[u8]) -> Result<Record, Malformed> {
        if b.len() != Self::LEN {
            return Err(Malformed::Length);
        }
        let kind = match b[0] {
            1 => RecordKind::Open,
            2 => RecordKind::Refresh,
            3 => RecordKind::Close,
            k => return Err(Malformed::Field("kind", k.into())),
        };
        let protocol = b[1];
        if protocol != lb_common::IPPROTO_TCP && protocol != lb_common::IPPROTO_UDP {
            return Err(Malformed::Field("protocol", protocol.into()));
        }
        let v4 = match b[3] {
            4 => true,
            6 => false,
            f => return Err(Malformed::Field("family", f.into())),
        };
        let mut addrs = [SocketAddr::from(([0u8; 4], 0)); 4];
        for (i, slot) in addrs.iter_mut().enumerate() {
            let at = 8 + i * 18;
            let octets: [u8; 16] = b[at..at + 16].try_into().expect("16 bytes");
            let port = u16::from_be_bytes([b[at + 16], b[at + 17]]);
            let v6 = Ipv6Addr::from(octets);
            let ip = match (v4, v6.to_ipv4_mapped()) {
                (true, Some(a)) => IpAddr::V4(a),
                (false, None) => IpAddr::V6(v6),
                _ => return Err(Malformed::Field("address family", i as u64)),
            };
            *slot = SocketAddr::new(ip, port);
        }
        let [vip, client, backend, snat] = addrs;
        Ok(Record {
            kind,
            protocol,
            state: b[2],
            age_ms: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
            vip,
            client,
            backend,
            snat,
        })
    }
}

impl ConnKey {
    fn bytes(&self) -> [u8; 40] {
        let mut out = [0u8; 40];
        for (chunk, word) in out.as_chunks_mut::<8>().0.iter_mut().zip(self.0) {
            *chunk = word.to_ne_bytes();
        }
        out
    }

    pub fn protocol(&self) -> u8 {
        self.bytes()[0]
    }

    /// The record of this connection whose other fields are these (`backend` and
    /// `snat` as [`endpoint_bytes`] gives them).
    pub fn record(
        &self,
        kind: RecordKind,
        state: u8,
        age_ms: u32,
        backend: &[u8; 18],
        snat: &[u8; 18],
    ) -> Record {
        let bytes = self.bytes();
        let part = |at: usize| -> [u8; 18] { bytes[at..at + 18].try_into().expect("18 bytes") };
        Record {
            kind,
            protocol: bytes[0],
            state,
            age_ms,
            vip: endpoint_of(&part(1)),
            client: endpoint_of(&part(19)),
            backend: endpoint_of(backend),
            snat: endpoint_of(snat),
        }
    }
}

/// The address and port of [`endpoint_bytes`]'s form (an IPv4-mapped address is the
/// IPv4 address: a record never carries one as IPv6).
fn endpoint_of(b: &[u8; 18]) -> SocketAddr {
    let octets: [u8; 16] = b[..16].try_into().expect("16 bytes");
    let v6 = Ipv6Addr::from(octets);
    let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
    SocketAddr::new(ip, u16::from_be_bytes([b[16], b[17]]))
}

/// An address and port as the wire carries them: 16 address bytes (IPv4 mapped into
/// IPv6), then the port, big-endian.
pub fn endpoint_bytes(sa: SocketAddr) -> [u8; 18] {
    let v6 = match sa.ip() {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    let mut out = [0u8; 18];
    out[..16].copy_from_slice(&v6.octets());
    out[16..].copy_from_slice(&sa.port().to_be_bytes());
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A record of connection `n` (distinct client ports and addresses per `n`).
    pub(crate) fn sample(n: u32, kind: RecordKind) -> Record {
        let [a, b, c, d] = n.to_be_bytes();
        Record {
            kind,
            protocol: lb_common::IPPROTO_TCP,
            state: lb_common::maps::NAT_S_ESTABLISHED | lb_common::maps::NAT_S_ACKED,
            age_ms: n % 1000,
            vip: "10.0.0.100:80".parse().unwrap(),
            client: SocketAddr::from(([100 + a % 100, b, c, d], 40000 + (n % 20000) as u16)),
            backend: "10.0.1.11:8080".parse().unwrap(),
            snat: SocketAddr::from(([10, 0, 0, 2], 1024 + (n % 30000) as u16)),
        }
    }

    #[test]
    fn records_round_trip_in_both_families() {
        let v4 = sample(7, RecordKind::Open);
        let v6 = Record {
            kind: RecordKind::Close,
            protocol: lb_common::IPPROTO_UDP,
            vip: "[2001:db8::100]:53".parse().unwrap(),
            client: "[2001:db8:1::7]:40000".parse().unwrap(),
            backend: "[2001:db8:2::11]:53".parse().unwrap(),
            snat: "[2001:db8::2]:2000".parse().unwrap(),
            ..v4
        };
        for r in [v4, v6, sample(1, RecordKind::Refresh)] {
            let mut buf = Vec::new();
            r.encode(&mut buf);
            assert_eq!(buf.len(), Record::LEN);
            assert_eq!(Record::decode(&buf), Ok(r));
        }
    }

    #[test]
    fn malformed_records_are_refused() {
        let mut good = Vec::new();
        sample(3, RecordKind::Open).encode(&mut good);
        assert_eq!(Record::decode(&good[..79]), Err(Malformed::Length));
        let mut bad = good.clone();
        bad[0] = 9;
        assert_eq!(Record::decode(&bad), Err(Malformed::Field("kind", 9)));
        let mut bad = good.clone();
        bad[1] = 1;
        assert!(Record::decode(&bad).is_err());
        let mut bad = good.clone();
        bad[3] = 5;
        assert!(Record::decode(&bad).is_err());
        // An IPv4 record whose backend is not an IPv4-mapped address.
        let mut bad = good.clone();
        bad[44] = 0x20;
        assert_eq!(
            Record::decode(&bad),
            Err(Malformed::Field("address family", 2))
        );
        // An IPv6 record holding a mapped IPv4 address.
        let mut bad = good;
        bad[3] = 6;
        assert!(Record::decode(&bad).is_err());
    }
}
