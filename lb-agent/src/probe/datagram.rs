//! The udp probe: send `send` (or an empty datagram) on a connected socket and wait for a
//! reply matching `expect`. The socket is connected so that an ICMP port-unreachable
//! comes back as ECONNREFUSED and fails the probe at once. Silence is handled by the
//! caller's timeout (a pass only when neither `expect` nor `test` is set). With
//! `max_response = 0` the reply is not read, but the probe still waits for its timeout:
//! the port-unreachable that a closed port answers arrives after the send, and only a
//! receive on the connected socket sees it (docs/probes.md, "udp probes").

use std::io::ErrorKind;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::net::UdpSocket;

use super::condition::Response as Observed;
use super::{ProbeError, Verdict, bytes_regex};
use crate::config::ProbeConfig;

/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;

pub(super) async fn probe(cfg: &ProbeConfig, addr: SocketAddr) -> Verdict {
    let io = |what| move |source: std::io::Error| io_error(what, source);
    let local: SocketAddr = match addr {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(local).await.map_err(io("bind"))?;
    sock.connect(addr).await.map_err(io("connect"))?;
    sock.send(cfg.send.as_deref().unwrap_or_default())
        .await
        .map_err(io("send"))?;
    let re = cfg.expect.as_ref().map(bytes_regex).transpose()?;
    // One byte at least: a datagram larger than the buffer is truncated, and a closed
    // port's ICMP error is reported on this receive either way.
    let mut buf = vec![0u8; cfg.max_response.clamp(1, MAX_DATAGRAM)];
    let n = sock.recv(&mut buf).await.map_err(io("receive"))?;
    if cfg.max_response == 0 {
        return Ok("reply (not read: max_response = 0)".into());
    }
    let reply = &buf[..n];
    if let Some(test) = &cfg.test {
        return if test.holds(&Observed {
            body: reply,
            ..Observed::default()
        }) {
            Ok(format!("test passed ({n} bytes)"))
        } else {
            Err(ProbeError::TestFailed {
                got: format!("{n} bytes"),
            })
        };
    }
    match re {
        Some(re) if re.is_match(reply) => Ok(format!("reply matched ({n} bytes)")),
        Some(_) => Err(ProbeError::ReplyMismatch),
        None => Ok(format!("reply ({n} bytes)")),
    }
}

fn io_error(what: &'static str, source: std::io::Error) -> ProbeError {
    if source.kind() == ErrorKind::ConnectionRefused {
        ProbeError::PortUnreachable
    } else {
        ProbeError::Io { what, source }
    }
}
