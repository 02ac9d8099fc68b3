//! The frames of the sync stream: a type byte, a 4-byte body length, the body
//! (docs/internals/cluster-sync.md lists each). Decoding never panics: input that does
//! not follow the format is [`Malformed`].

use tokio::io::{AsyncRead, AsyncReadExt};

use super::error::{Malformed, SyncError};
use super::record::Record;

/// The protocol version a hello carries.
pub const VERSION: u16 = 1;
/// Most records in one batch or bulk frame.
pub const MAX_RECORDS: usize = 512;
/// Largest body a frame may have.
pub const MAX_BODY: usize = 65_536;
/// Longest node name.
const MAX_NAME: usize = 64;

/// The acceptor's answer to a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    ForeignNode,
    OtherFingerprint,
    OtherVersion,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Hello {
        version: u16,
        fingerprint: [u8; 32],
        incarnation: u64,
        name: String,
    },
    Welcome {
        verdict: Verdict,
        bulk_wanted: bool,
        next_seq: u64,
    },
    Batch {
        first_seq: u64,
        records: Vec<Record>,
    },
    Bulk {
        records: Vec<Record>,
    },
    BulkEnd {
        records: u64,
        next_seq: u64,
    },
    Ack {
        next_seq: u64,
    },
}

impl Frame {
    /// Appends the frame, header and body, to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 5]);
        let ty = match self {
            Frame::Hello {
                version,
                fingerprint,
                incarnation,
                name,
            } => {
                out.extend_from_slice(&version.to_be_bytes());
                out.extend_from_slice(fingerprint);
                out.extend_from_slice(&incarnation.to_be_bytes());
                out.push(name.len() as u8);
                out.extend_from_slice(name.as_bytes());
                1
            }
            Frame::Welcome {
                verdict,
                bulk_wanted,
                next_seq,
            } => {
                out.push(match verdict {
                    Verdict::Accepted => 0,
                    Verdict::ForeignNode => 1,
                    Verdict::OtherFingerprint => 2,
                    Verdict::OtherVersion => 3,
                });
                out.push(u8::from(*bulk_wanted));
                out.extend_from_slice(&next_seq.to_be_bytes());
                2
            }
            Frame::Batch { first_seq, records } => {
                out.extend_from_slice(&first_seq.to_be_bytes());
                encode_records(records, out);
                3
            }
            Frame::Bulk { records } => {
                encode_records(records, out);
                4
            }
            Frame::BulkEnd { records, next_seq } => {
                out.extend_from_slice(&records.to_be_bytes());
                out.extend_from_slice(&next_seq.to_be_bytes());
                5
            }
            Frame::Ack { next_seq } => {
                out.extend_from_slice(&next_seq.to_be_bytes());
                6
            }
        };
        let body = (out.len() - start - 5) as u32;
        out[start] = ty;
        out[start + 1..start + 5].copy_from_slice(&body.to_be_bytes());
    }

    /// The frame of type `ty` whose body is `body`.
    pub fn decode(ty: u8, body: &[u8]) -> Result<Frame, Malformed> {
        let mut r = Reader(body);
        let frame = match ty {
            1 => {
                let version = r.u16()?;
                let fingerprint = r.take(32)?.try_into().expect("32 bytes");
                let incarnation = r.u64()?;
                let len = usize::from(r.u8()?);
                if len == 0 || len > MAX_NAME {
                    return Err(Malformed::Field("name length", len as u64));
                }
                let name = std::str::from_utf8(r.take(len)?)
                    .map_err(|_| Malformed::Field("name", 0))?
                    .to_string();
                Frame::Hello {
                    version,
                    fingerprint,
                    incarnation,
                    name,
                }
            }
            2 => {
                let verdict = match r.u8()? {
                    0 => Verdict::Accepted,
                    1 => Verdict::ForeignNode,
                    2 => Verdict::OtherFingerprint,
                    3 => Verdict::OtherVersion,
                    v => return Err(Malformed::Field("verdict", v.into())),
                };
                let bulk_wanted = match r.u8()? {
                    0 => false,
                    1 => true,
                    v => return Err(Malformed::Field("bulk wanted", v.into())),
                };
                Frame::Welcome {
                    verdict,
                    bulk_wanted,
                    next_seq: r.u64()?,
                }
            }
            3 => {
                let first_seq = r.u64()?;
                Frame::Batch {
                    first_seq,
                    records: r.records()?,
                }
            }
            4 => Frame::Bulk {
                records: r.records()?,
            },
            5 => Frame::BulkEnd {
                records: r.u64()?,
                next_seq: r.u64()?,
            },
            6 => Frame::Ack { next_seq: r.u64()? },
            t => return Err(Malformed::Type(t)),
        };
        if !r.0.is_empty() {
            return Err(Malformed::Length);
        }
        Ok(frame)
    }

    /// Reads the next frame from `stream`; `None` at a clean end of the stream.
    pub async fn read(
        stream: &mut (impl AsyncRead + Unpin),
        body: &mut Vec<u8>,
    ) -> Result<Option<Frame>, SyncError> {
        let mut header = [0u8; 5];
        match stream.read_exact(&mut header[..1]).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(SyncError::Stream(e)),
        }
        stream
            .read_exact(&mut header[1..])
            .await
            .map_err(SyncError::Stream)?;
        let len = u32::from_be_bytes(header[1..].try_into().expect("4 bytes")) as usize;
        if len > MAX_BODY {
            return Err(Malformed::Field("body length", len as u64).into());
        }
        body.resize(len, 0);
        stream.read_exact(body).await.map_err(SyncError::Stream)?;
        Ok(Some(Frame::decode(header[0], body)?))
    }
}

fn encode_records(records: &[Record], out: &mut Vec<u8>) {
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    for r in records {
        r.encode(out);
    }
}

/// A cursor over a body that refuses to read past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.0.len() < n {
            return Err(Malformed::Length);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2")))
    }

    fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }

    fn records(&mut self) -> Result<Vec<Record>, Malformed> {
        let count = usize::from(self.u16()?);
        if count == 0 || count > MAX_RECORDS {
            return Err(Malformed::Field("record count", count as u64));
        }
        let mut records = Vec::with_capacity(count);
        for _ in 0..count {
            records.push(Record::decode(self.take(Record::LEN)?)?);
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::record::RecordKind;
    use crate::cluster::record::tests::sample;

    fn frames() -> Vec<Frame> {
        vec![
            Frame::Hello {
                version: VERSION,
                fingerprint: [7; 32],
                incarnation: 0x0102_0304_0506_0708,
                name: "lb-1".into(),
            },
            Frame::Welcome {
                verdict: Verdict::OtherFingerprint,
                bulk_wanted: true,
                next_seq: 42,
            },
            Frame::Batch {
                first_seq: 9,
                records: (0..3).map(|n| sample(n, RecordKind::Open)).collect(),
            },
            Frame::Bulk {
                records: (0..MAX_RECORDS as u32)
                    .map(|n| sample(n, RecordKind::Refresh))
                    .collect(),
            },
            Frame::BulkEnd {
                records: 1_000_000,
                next_seq: 77,
            },
            Frame::Ack { next_seq: 78 },
        ]
    }

    #[tokio::test]
    async fn frames_round_trip_through_a_stream() {
        let mut wire = Vec::new();
        for f in frames() {
            f.encode(&mut wire);
        }
        let mut stream = &wire[..];
        let mut body = Vec::new();
        for want in frames() {
            assert_eq!(
                Frame::read(&mut stream, &mut body).await.unwrap(),
                Some(want)
            );
        }
        assert_eq!(Frame::read(&mut stream, &mut body).await.unwrap(), None);
    }

    #[test]
    fn bodies_of_the_wrong_size_or_with_bad_fields_are_malformed() {
        for f in frames() {
            let mut wire = Vec::new();
            f.encode(&mut wire);
            let (ty, body) = (wire[0], &wire[5..]);
            assert_eq!(Frame::decode(ty, body), Ok(f.clone()));
            assert!(Frame::decode(ty, &body[..body.len() - 1]).is_err());
            let mut longer = body.to_vec();
            longer.push(0);
            assert!(Frame::decode(ty, &longer).is_err(), "{f:?}");
        }
        assert_eq!(Frame::decode(0, &[]), Err(Malformed::Type(0)));
        assert_eq!(Frame::decode(7, &[0; 8]), Err(Malformed::Type(7)));
        // A batch announcing no record, or more than a frame may hold.
        let mut zero = 5u64.to_be_bytes().to_vec();
        zero.extend_from_slice(&0u16.to_be_bytes());
        assert!(Frame::decode(3, &zero).is_err());
        let mut many = 5u64.to_be_bytes().to_vec();
        many.extend_from_slice(&(MAX_RECORDS as u16 + 1).to_be_bytes());
        many.resize(many.len() + (MAX_RECORDS + 1) * Record::LEN, 0);
        assert!(Frame::decode(3, &many).is_err());
    }

    #[tokio::test]
    async fn a_body_length_over_the_limit_is_refused_before_it_is_read() {
        let mut wire = vec![3];
        wire.extend_from_slice(&(MAX_BODY as u32 + 1).to_be_bytes());
        let mut body = Vec::new();
        let got = Frame::read(&mut &wire[..], &mut body).await;
        assert!(matches!(got, Err(SyncError::Malformed(_))), "{got:?}");
        assert!(body.is_empty());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A fixed xorshift stream: every type byte, every short length, random content,
        // and the valid frames with one byte flipped at each position.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let ty = (next() % 8) as u8;
            let len = (next() % 200) as usize;
            let body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = Frame::decode(ty, &body);
        }
        for f in frames().into_iter().take(3) {
            let mut wire = Vec::new();
            f.encode(&mut wire);
            for at in 5..wire.len() {
                let mut w = wire.clone();
                w[at] ^= 0xff;
                let _ = Frame::decode(w[0], &w[5..]);
            }
        }
    }
}
