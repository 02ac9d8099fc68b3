//! The cluster component's errors: the key file, the endpoint, and what a peer's
//! stream can do wrong.

use std::path::PathBuf;

use thiserror::Error;

/// Why bytes from a peer are not a frame or a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Malformed {
    #[error("unknown frame type {0}")]
    Type(u8),
    #[error("body of the wrong length")]
    Length,
    #[error("{0} out of range ({1})")]
    Field(&'static str, u64),
}

/// The shared key file cannot be used.
#[derive(Debug, Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {len} bytes; the cluster key needs at least {min} (head -c 32 /dev/urandom)")]
    Short {
        path: PathBuf,
        len: usize,
        min: usize,
    },
    #[error("{path}: mode {mode:o} lets others read the cluster key; chmod 600 it")]
    Readable { path: PathBuf, mode: u32 },
    #[error("cannot build the certificate: {0}")]
    Certificate(String),
}

/// The cluster component cannot start.
#[derive(Debug, Error)]
pub enum StartError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("cannot bind the sync socket on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// What ends one sync connection.
#[derive(Debug, Error)]
pub enum SyncError {
    #[error("malformed frame: {0}")]
    Malformed(#[from] Malformed),
    #[error("stream: {0}")]
    Stream(std::io::Error),
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    #[error("write: {0}")]
    Write(#[from] quinn::WriteError),
    #[error("refused by the peer: {0:?}")]
    Refused(super::frame::Verdict),
    #[error("unexpected frame: {0}")]
    Unexpected(&'static str),
}
