//! 2,000 slow connections (one header line every 5 s) against an API
//! whose process runs at a low file limit: the connection cap keeps the API's file
//! descriptors bounded, so the Unix socket answers, outgoing connections (what probes
//! open) still succeed, and TCP serves again once the slow clients are cut.
//!
//! A test of its own (`harness = false`): it sets RLIMIT_NOFILE for the whole process,
//! and re-runs its own binary with `LB_API_HOLD=ADDR` as the client process that holds
//! the connections (a client in this process would spend this process's descriptors).

#[path = "api/util.rs"]
mod api_util;

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use api_util::{GET_SERVICES, start, unix};
use lb_agent::api::{Limits, Rejection};

/// The API process's soft file limit.
const NOFILE: u64 = 512;
/// Connections the client process holds.
const HOLD: usize = 2000;
/// How long the client holds them at most.
const HOLD_FOR: Duration = Duration::from_secs(20);

fn main() {
    if let Ok(addr) = std::env::var("LB_API_HOLD") {
        hold(addr.parse().expect("LB_API_HOLD is an address"));
        return;
    }
    let started = Instant::now();
    test();
    println!("api_fd_limit: ok in {:?}", started.elapsed());
}

/// The client process, killed when the test ends (also on failure).
struct Client(std::process::Child);

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One GET over TCP; `None` when the connection is closed or reset without an answer
/// (a connection beyond the cap).
async fn try_get(addr: SocketAddr) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(GET_SERVICES.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        (!out.is_empty()).then(|| api_util::parse(&out).0)
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
}

fn set_nofile(soft: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a valid struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = soft.min(lim.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The client process: connect `HOLD` times, send a request line and then one header
/// line every 5 s on each connection still open, for at most `HOLD_FOR`.
fn hold(addr: SocketAddr) {
    set_nofile(HOLD as u64 + 256);
    let mut conns = Vec::with_capacity(HOLD);
    for _ in 0..HOLD {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(mut s) => {
                let _ = s.write_all(b"GET /api/v1/services HTTP/1.1\r\n");
                conns.push(s);
            }
            Err(_) => break,
        }
    }
    println!("holding {}", conns.len());
    let _ = std::io::stdout().flush();
    let end = Instant::now() + HOLD_FOR;
    let mut line = 0;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_secs(5));
        line += 1;
        for s in &mut conns {
            let _ = s.write_all(format!("X-Slow-{line}: 1\r\n").as_bytes());
        }
    }
}

fn test() {
    set_nofile(NOFILE);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let limits = Limits::default();
        let api = start(limits, None).await;
        // What a probe connects to.
        let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target_addr = target.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = target.accept().await {
                drop(s);
            }
        });

        let mut child = Client(
            Command::new(std::env::current_exe().unwrap())
                .env("LB_API_HOLD", api.tcp.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("starting the client process"),
        );
        let mut out = BufReader::new(child.0.stdout.take().unwrap());
        let mut first = String::new();
        let read = tokio::task::spawn_blocking(move || out.read_line(&mut first).map(|_| first));
        let line = tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("the client connects within 60 s")
            .unwrap()
            .unwrap();
        let held: usize = line
            .trim()
            .strip_prefix("holding ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("client said {line:?}"));
        assert!(held >= HOLD / 2, "the client opened {held} connections");

        let fds = open_fds();
        assert!(
            fds < limits.max_connections + 64,
            "the API holds at most its cap: {fds} descriptors open at a limit of {NOFILE}"
        );
        let t0 = Instant::now();
        let (status, _) = unix(&api, GET_SERVICES).await;
        assert_eq!(status, 200, "the socket answers during the flood");
        println!(
            "api_fd_limit: socket answered in {:?} with {held} slow clients",
            t0.elapsed()
        );
        for i in 0..20 {
            tokio::net::TcpStream::connect(target_addr)
                .await
                .unwrap_or_else(|e| panic!("outgoing connection {i} (a probe) failed: {e}"));
        }
        // (Some are still in the listen backlog, not accepted yet.)
        assert!(
            api.counters.get(Rejection::ConnectionCap) as usize >= held / 2,
            "connections beyond the cap were closed at once: {}",
            api.counters.get(Rejection::ConnectionCap)
        );

        // The held connections are cut at the header timeout; TCP answers again.
        let deadline = Instant::now() + limits.header_timeout + Duration::from_secs(5);
        loop {
            if try_get(api.tcp).await == Some(200) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "TCP must serve again once the slow clients are cut"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        drop(child);
        drop(api);
    });
}
