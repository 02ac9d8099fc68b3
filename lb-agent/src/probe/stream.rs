//! The tcp probe: connect, optionally `send`, optionally read until `expect` matches or
//! `test` holds (evaluated on the reply so far after every read, and at the close). A
//! reply that can no longer match `expect` fails at once (`reply_prefix.rs`).
//!
//! The connection is always closed with a reset (`SO_LINGER` 0), as HAProxy closes its
//! checks: no FIN exchange and no `TIME_WAIT` socket per probe, which at thousands of
//! targets is most of the kernel's work and a pile of sockets on the agent's host.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::condition::Response as Observed;
use super::reply_prefix::ReplyPrefix;
use super::{ProbeError, Verdict, bytes_regex};
use crate::config::ProbeConfig;

/// Bytes asked of one read.
const CHUNK: usize = 16 * 1024;

pub(super) async fn probe(cfg: &ProbeConfig, addr: SocketAddr) -> Verdict {
    let mut tcp = TcpStream::connect(addr)
        .await
        .map_err(ProbeError::connect)?;
    // Best effort: failing to set it only costs a graceful close.
    let _ = tcp.set_zero_linger();
    if let Some(send) = &cfg.send {
        let _ = tcp.set_nodelay(true);
        tcp.write_all(send).await.map_err(|source| ProbeError::Io {
            what: "send",
            source,
        })?;
    }
    let re = match (&cfg.expect, &cfg.test) {
        (None, None) => return Ok("connected".into()),
        _ if cfg.max_response == 0 => return Ok("connected (no reply awaited)".into()),
        (Some(expect), _) => Some(bytes_regex(expect)?),
        (None, Some(_)) => None,
    };
    let mut prefix = cfg
        .expect
        .as_ref()
        .and_then(|e| ReplyPrefix::new(e.as_str()));
    // The reply so far meets `expect` or `test`.
    let matched = |buf: &[u8]| match (&re, &cfg.test) {
        (Some(re), _) => re.is_match(buf),
        (None, Some(test)) => test.holds(&Observed {
            body: buf,
            ..Observed::default()
        }),
        (None, None) => true,
    };
    let mut buf = Vec::with_capacity(cfg.max_response.min(CHUNK));
    let mut chunk = vec![0u8; cfg.max_response.min(CHUNK)];
    loop {
        let want = chunk.len().min(cfg.max_response - buf.len());
        let n = tcp
            .read(&mut chunk[..want])
            .await
            .map_err(|source| ProbeError::Io {
                what: "read",
                source,
            })?;
        if n == 0 {
            // A test may hold on what came before the close (or on nothing at all).
            if cfg.test.is_some() && matched(&buf) {
                return Ok(format!("test passed ({} bytes, closed)", buf.len()));
            }
            return Err(ProbeError::ResponseMismatch {
                got: buf.len(),
                why: "closed",
            });
        }
        buf.extend_from_slice(&chunk[..n]);
        // Matching from the start each time: a pattern may span reads.
        if matched(&buf) {
            return Ok(format!("response matched ({} bytes)", buf.len()));
        }
        if prefix.as_mut().is_some_and(|p| p.hopeless(&buf)) {
            return Err(ProbeError::ResponseMismatch {
                got: buf.len(),
                why: "cannot match any more",
            });
        }
        if buf.len() >= cfg.max_response {
            return Err(ProbeError::ResponseMismatch {
                got: buf.len(),
                why: "max_response reached",
            });
        }
    }
}
