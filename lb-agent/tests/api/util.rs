//! The API's listeners on real sockets for the api tests: a temp directory, the
//! listeners started with given limits and token, an agent side that answers every
//! change `ok` and counts them, and raw HTTP/1.1 over TCP or the Unix socket.
#![allow(dead_code)]

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use lb_agent::api::{ApiCounters, ApiState, Limits, ListenConfig, Listening, Token, listen};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpStream, UnixStream},
    sync::{Mutex, mpsc, watch},
};

/// The token the tests configure.
pub const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lb-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Running listeners and what they saw.
pub struct Api {
    pub tcp: SocketAddr,
    pub socket: PathBuf,
    pub counters: Arc<ApiCounters>,
    /// Changes that reached the agent side.
    pub changes: Arc<AtomicUsize>,
    pub listening: Listening,
    pub dir: TempDir,
}

/// Starts both listeners on loopback (any port) and `dir/run/api.sock`.
pub async fn start(limits: Limits, token: Option<Token>) -> Api {
    let dir = TempDir::new("api");
    let socket = dir.path().join("run").join("api.sock");
    let (_snap_tx, snapshot) = watch::channel(Arc::new(Default::default()));
    std::mem::forget(_snap_tx);
    let (admin, mut admin_rx) = mpsc::channel::<lb_agent::api::AdminRequest>(64);
    let (reload, mut reload_rx) = mpsc::channel::<lb_agent::api::ReloadRequest>(4);
    let changes = Arc::new(AtomicUsize::new(0));
    let seen = changes.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                Some(req) = admin_rx.recv() => {
                    seen.fetch_add(1, Ordering::Relaxed);
                    let _ = req.reply.send(Ok(()));
                }
                Some(reply) = reload_rx.recv() => {
                    seen.fetch_add(1, Ordering::Relaxed);
                    let _ = reply.send(Ok(Default::default()));
                }
                else => break,
            }
        }
    });
    let counters = Arc::new(ApiCounters::default());
    let state = ApiState {
        snapshot: snapshot.into(),
        events: Arc::new(Mutex::new(Default::default())),
        admin,
        reload,
        counters: counters.clone(),
    };
    let listening = listen(
        state,
        ListenConfig {
            tcp: Some("127.0.0.1:0".parse().unwrap()),
            socket: Some(socket.clone()),
            socket_group: None,
            token,
            limits,
        },
    )
    .await
    .expect("the API listens");
    Api {
        tcp: listening.tcp.expect("tcp bound"),
        socket,
        counters,
        changes,
        listening,
        dir,
    }
}

/// A token file with `mode` holding `text`.
pub fn token_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("api.token");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// A PATCH that drains a server (what `lb-agent server drain` sends).
pub fn drain_request(auth: Option<&str>) -> String {
    let body = r#"{"drain":true}"#;
    let auth = auth
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!(
        "PATCH /api/v1/services/web/servers/10.0.1.1:80 HTTP/1.1\r\nHost: x\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

pub const GET_SERVICES: &str =
    "GET /api/v1/services HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// Writes `raw`, reads until the server closes (at most `limit`); the status code.
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    raw: &str,
    limit: Duration,
) -> (u16, String) {
    s.write_all(raw.as_bytes()).await.expect("sending");
    let mut out = Vec::new();
    tokio::time::timeout(limit, s.read_to_end(&mut out))
        .await
        .expect("the API answers in time")
        .expect("reading the answer");
    parse(&out)
}

pub fn parse(out: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    (status, text)
}

pub async fn tcp(api: &Api, raw: &str) -> (u16, String) {
    let s = TcpStream::connect(api.tcp)
        .await
        .expect("connecting over TCP");
    exchange(s, raw, Duration::from_secs(5)).await
}

pub async fn unix(api: &Api, raw: &str) -> (u16, String) {
    let s = UnixStream::connect(&api.socket)
        .await
        .expect("connecting to the socket");
    exchange(s, raw, Duration::from_secs(5)).await
}

/// Reads until EOF or `limit`; `Some(bytes)` when the server closed in time.
pub async fn closed_within<S: AsyncRead + Unpin>(s: &mut S, limit: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match tokio::time::timeout(limit, s.read_to_end(&mut out)).await {
        Ok(Ok(_)) => Some(out),
        Ok(Err(_)) => Some(out), // reset: closed too
        Err(_) => None,
    }
}

/// An `ApiState` whose agent side never answers (for listener tests); keep the second
/// value alive as long as the state is used.
pub fn idle_state() -> (ApiState, impl Drop) {
    let (snap_tx, snapshot) = watch::channel(Arc::new(Default::default()));
    let (admin, admin_rx) = mpsc::channel(1);
    let (reload, reload_rx) = mpsc::channel(1);
    let state = ApiState {
        snapshot: snapshot.into(),
        events: Arc::new(Mutex::new(Default::default())),
        admin,
        reload,
        counters: Default::default(),
    };
    (state, KeepAlive(Box::new((snap_tx, admin_rx, reload_rx))))
}

pub struct KeepAlive(#[allow(dead_code)] Box<dyn std::any::Any + Send>);

impl Drop for KeepAlive {
    fn drop(&mut self) {}
}
