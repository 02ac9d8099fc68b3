//! A long download through the balancer: one connection to an echo testserver asks for
//! `stream N` and reads the N bytes at a paced rate on its own thread, checking every
//! byte, so that a scenario can hold a bulk transfer open across the events it causes.

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    net::{IpAddr, SocketAddr},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{net::netns::NetNs, traffic::clients::EchoConn, util::error::Error};

/// How long one read may wait before the download counts as stalled.
const STALL: Duration = Duration::from_secs(3);

/// What a finished download got.
#[derive(Debug)]
pub struct Downloaded {
    /// The backend that answered.
    pub backend: String,
    /// Bytes received, all of them in the pattern.
    pub bytes: u64,
    /// How long it took.
    pub took: Duration,
}

/// A running download; [`finish`](Self::finish) waits for its end.
pub struct Download {
    thread: JoinHandle<Result<Downloaded, String>>,
}

impl Download {
    /// Connects from `src` in `ns` to `dst` and downloads `bytes` bytes at about
    /// `bytes_per_sec` (read in 16 KiB steps, sleeping between them).
    pub fn start(
        ns: &NetNs,
        src: IpAddr,
        dst: SocketAddr,
        bytes: u64,
        bytes_per_sec: u64,
    ) -> Result<Download, Error> {
        let conn =
            EchoConn::connect(ns, src, dst)?.map_err(Error::io(format!("connecting to {dst}")))?;
        let thread = std::thread::spawn(move || read_paced(conn, bytes, bytes_per_sec));
        Ok(Download { thread })
    }

    /// Waits for the download's end: every byte in order, or what went wrong and when.
    pub fn finish(self) -> Result<Downloaded, String> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err("the download thread panicked".into()))
    }
}

fn read_paced(conn: EchoConn, bytes: u64, bytes_per_sec: u64) -> Result<Downloaded, String> {
    let backend = conn.backend().to_owned();
    let mut stream = conn.into_stream();
    let start = Instant::now();
    let fail = |what: String, got: u64| {
        format!(
            "download from {backend}: {what} after {got} of {bytes} bytes, {:.1} s in",
            start.elapsed().as_secs_f64()
        )
    };
    stream
        .set_read_timeout(Some(STALL))
        .map_err(|e| fail(format!("setting the read timeout: {e}"), 0))?;
    stream
        .write_all(format!("stream {bytes}\n").as_bytes())
        .map_err(|e| fail(format!("asking: {e}"), 0))?;
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    reader
        .read_line(&mut head)
        .map_err(|e| fail(format!("reading the answer's head: {e}"), 0))?;
    if head.trim_end() != format!("{backend} stream {bytes}") {
        return Err(fail(format!("unexpected head {head:?}"), 0));
    }
    let mut got = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    while got < bytes {
        let want = buf.len().min((bytes - got) as usize);
        let n = match reader.read(&mut buf[..want]) {
            Ok(0) => return Err(fail("closed".into(), got)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(fail(e.to_string(), got)),
        };
        if let Some(i) = (0..n).find(|&i| buf[i] != b'0' + ((got + i as u64) % 10) as u8) {
            return Err(fail(
                format!("byte {} is {:?}", got + i as u64, buf[i] as char),
                got,
            ));
        }
        got += n as u64;
        let due = Duration::from_secs_f64(got as f64 / bytes_per_sec as f64);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    Ok(Downloaded {
        backend,
        bytes: got,
        took: start.elapsed(),
    })
}
