//! The tcp probe: connect, optionally `send`, optionally read until `expect` matches.
//!
//! The connection is always closed with a reset (`SO_LINGER` 0), as HAProxy closes its
//! checks: no FIN exchange and no `TIME_WAIT` socket per probe, which at thousands of
//! targets is most of the kernel's work and a pile of sockets on the agent's host.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
    let Some(expect) = &cfg.expect else {
        return Ok("connected".into());
    };
    if cfg.max_response == 0 {
        return Ok("connected (no reply awaited)".into());
    }
    let re = bytes_regex(expect)?;
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
            return Err(ProbeError::ResponseMismatch {
                got: buf.len(),
                why: "closed",
            });
        }
        buf.extend_from_slice(&chunk[..n]);
        // Matching from the start each time: a pattern may span reads.
        if re.is_match(&buf) {
            return Ok(format!("response matched ({} bytes)", buf.len()));
        }
        if buf.len() >= cfg.max_response {
            return Err(ProbeError::ResponseMismatch {
                got: buf.len(),
                why: "max_response reached",
            });
        }
    }
}
