//! A sync record: one nat connection described by addresses (never by local ids, which
//! differ between nodes), 80 bytes on the wire (docs/internals/cluster-sync.md) and in
//! memory.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

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

/// One connection as the nodes share it. Its addresses are kept in their wire form, so
/// that a record is read from a frame and written to one by copying bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    pub kind: RecordKind,
    /// `lb_common::IPPROTO_TCP` or `IPPROTO_UDP`.
    pub protocol: u8,
    /// The `NAT_S_*` bits of the connection.
    pub state: u8,
    /// Milliseconds since the connection's last packet, as the sender saw it.
    pub age_ms: u32,
    pub vip: Endpoint,
    pub client: Endpoint,
    pub backend: Endpoint,
    pub snat: Endpoint,
}

/// An address and port as the wire carries them: 16 address bytes (an IPv4 address
/// mapped into IPv6), then the port, big-endian.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Endpoint([u8; 18]);

/// The first 12 bytes of an IPv4-mapped IPv6 address.
const V4_MAPPED: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

impl Endpoint {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip(), self.port())
    }

    /// The address (IPv4 for a mapped one: a record never carries one as IPv6).
    pub fn ip(&self) -> IpAddr {
        let b = &self.0;
        if self.is_v4() {
            IpAddr::from([b[12], b[13], b[14], b[15]])
        } else {
            let octets: [u8; 16] = b[..16].try_into().expect("16 bytes");
            IpAddr::V6(Ipv6Addr::from(octets))
        }
    }

    pub fn port(&self) -> u16 {
        u16::from_be_bytes([self.0[16], self.0[17]])
    }

    pub fn is_v4(&self) -> bool {
        self.0[..12] == V4_MAPPED
    }

    pub fn bytes(&self) -> &[u8; 18] {
        &self.0
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(sa: SocketAddr) -> Self {
        let v6 = match sa.ip() {
            IpAddr::V4(a) => a.to_ipv6_mapped(),
            IpAddr::V6(a) => a,
        };
        let mut out = [0u8; 18];
        out[..16].copy_from_slice(&v6.octets());
        out[16..].copy_from_slice(&sa.port().to_be_bytes());
        Endpoint(out)
    }
}

impl FromStr for Endpoint {
    type Err = std::net::AddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<SocketAddr>().map(Endpoint::from)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr().fmt(f)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr().fmt(f)
    }
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
        bytes[1..19].copy_from_slice(&self.vip.0);
        bytes[19..37].copy_from_slice(&self.client.0);
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
        out.push(if self.vip.is_v4() { 4 } else { 6 });
        out.extend_from_slice(&self.age_ms.to_be_bytes());
        for endpoint in [self.vip, self.client, self.backend, self.snat] {
            out.extend_from_slice(&endpoint.0);
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
        let mut addrs = [Endpoint::default(); 4];
        for (i, slot) in addrs.iter_mut().enumerate() {
            let at = 8 + i * 18;
            *slot = Endpoint(b[at..at + 18].try_into().expect("18 bytes"));
            if slot.is_v4() != v4 {
                return Err(Malformed::Field("address family", i as u64));
            }
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

    /// The record of this connection whose other fields are these.
    pub fn record(
        &self,
        kind: RecordKind,
        state: u8,
        age_ms: u32,
        backend: Endpoint,
        snat: Endpoint,
    ) -> Record {
        let bytes = self.bytes();
        let part = |at: usize| Endpoint(bytes[at..at + 18].try_into().expect("18 bytes"));
        Record {
            kind,
            protocol: bytes[0],
            state,
            age_ms,
            vip: part(1),
            client: part(19),
            backend,
            snat,
        }
    }
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
            client: SocketAddr::from(([100 + a % 100, b, c, d], 40000 + (n % 20000) as u16)).into(),
            backend: "10.0.1.11:8080".parse().unwrap(),
            snat: SocketAddr::from(([10, 0, 0, 2], 1024 + (n % 30000) as u16)).into(),
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
    fn endpoints_give_back_the_address_they_were_made_of() {
        for text in ["10.0.0.2:1024", "[2001:db8::2]:53", "0.0.0.0:0"] {
            let sa: SocketAddr = text.parse().unwrap();
            let endpoint = Endpoint::from(sa);
            assert_eq!(endpoint.addr(), sa, "{text}");
            assert_eq!(endpoint.is_v4(), sa.is_ipv4(), "{text}");
            assert_eq!(endpoint.to_string(), sa.to_string());
            assert_eq!(text.parse::<Endpoint>(), Ok(endpoint));
        }
        // An IPv4-mapped IPv6 address is the IPv4 address.
        let mapped: Endpoint = "[::ffff:10.0.0.2]:1".parse().unwrap();
        assert_eq!(mapped.addr(), "10.0.0.2:1".parse::<SocketAddr>().unwrap());
        assert_eq!(
            size_of::<Record>(),
            Record::LEN,
            "a record is its wire size in memory"
        );
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
