//! The status page over the real listeners: the page and its assets are open reads on
//! TCP (no token) and on the socket, with their security headers; `GET /api/v1/page`
//! carries roles, shares and the events since a time; a bad query is refused with the
//! reason; a change to `/` over TCP is not a read.

use std::sync::Arc;

use crate::util::exchange;
use lb_agent::{
    api::{
        AdminRequest, ApiCounters, ApiState, Limits, ListenConfig, Listening, PageView,
        ReloadRequest, listen,
    },
    view::{Event, ServerStatus, ServiceStatus, Snapshot},
};
use tokio::{
    net::{TcpStream, UnixStream},
    sync::{Mutex, mpsc, watch},
};

fn event(time: &str, server: &str, to: &str) -> Event {
    Event {
        time: time.into(),
        service: "web".into(),
        server: server.into(),
        from: "up".into(),
        to: to.into(),
        cause: "probe tcp: 1 consecutive failure (connection refused)".into(),
    }
}

/// A listening API over a fixed snapshot and event log; everything stays up while
/// this lives.
struct Served {
    tcp: std::net::SocketAddr,
    socket: std::path::PathBuf,
    _keep: (
        crate::util::TempDir,
        Listening,
        watch::Sender<Arc<Snapshot>>,
        mpsc::Receiver<AdminRequest>,
        mpsc::Receiver<ReloadRequest>,
    ),
}

async fn serve() -> Served {
    let dir = crate::util::TempDir::new("page");
    let socket = dir.path().join("run").join("api.sock");
    let mut snap = Snapshot::default();
    snap.services.push(ServiceStatus {
        name: "web".into(),
        servers: vec![
            ServerStatus {
                address: "10.0.1.1:80".into(),
                weight: 1,
                state: "up".into(),
                active: true,
                slots: 65537,
                ..Default::default()
            }
            .into(),
            ServerStatus {
                address: "10.0.1.2:80".into(),
                weight: 2,
                state: "unhealthy".into(),
                ..Default::default()
            }
            .into(),
        ],
        maglev_size: 65537,
        ..Default::default()
    });
    let (snap_tx, snapshot) = watch::channel(Arc::new(snap));
    let (admin, admin_rx) = mpsc::channel(1);
    let (reload, reload_rx) = mpsc::channel(1);
    // An event two hours old (the first look skips it) and two recent ones.
    let now = std::time::SystemTime::now();
    let at = |ago: u64| {
        humantime::format_rfc3339_millis(now - std::time::Duration::from_secs(ago)).to_string()
    };
    let events = [
        event(&at(7200), "10.0.1.2:80", "checking"),
        event(&at(60), "10.0.1.2:80", "unhealthy"),
        event(&at(10), "10.0.1.1:80", "draining"),
    ];
    let state = ApiState {
        snapshot: snapshot.into(),
        events: Arc::new(Mutex::new(events.into_iter().collect())),
        admin,
        reload,
        counters: Arc::new(ApiCounters::default()),
    };
    let listening = listen(
        state,
        ListenConfig {
            tcp: Some("127.0.0.1:0".parse().unwrap()),
            socket: Some(socket.clone()),
            socket_group: None,
            token: None,
            limits: Limits::default(),
        },
    )
    .await
    .expect("the API listens");
    Served {
        tcp: listening.tcp.expect("tcp bound"),
        socket,
        _keep: (dir, listening, snap_tx, admin_rx, reload_rx),
    }
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
}

async fn tcp(addr: std::net::SocketAddr, raw: &str) -> (u16, String) {
    let s = TcpStream::connect(addr).await.expect("connecting");
    exchange(s, raw, std::time::Duration::from_secs(5)).await
}

fn body(text: &str) -> &str {
    text.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// The body of a `Transfer-Encoding: chunked` or plain answer, as one string.
fn json_body(text: &str) -> PageView {
    let b = body(text);
    let plain = if text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = b;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
            if n == 0 {
                break;
            }
            out.push_str(&after[..n]);
            rest = &after[n + 2..];
        }
        out
    } else {
        b.to_owned()
    };
    serde_json::from_str(&plain).unwrap_or_else(|e| panic!("{e}: {plain}"))
}

#[tokio::test]
async fn the_page_and_its_assets_are_open_reads_on_both_listeners() {
    let api = serve().await;
    let (addr, socket) = (api.tcp, api.socket.clone());
    let (status, page) = tcp(addr, &get("/")).await;
    assert_eq!(status, 200, "{page}");
    let lower = page.to_ascii_lowercase();
    assert!(lower.contains("content-type: text/html"), "{page}");
    assert!(lower.contains("content-security-policy: default-src 'none'; script-src 'self'"));
    assert!(lower.contains("x-content-type-options: nosniff"));
    let js = body(&page)
        .split("src=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the page names its script")
        .to_owned();
    let css = body(&page)
        .split("href=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the page names its style")
        .to_owned();
    for (path, kind) in [(&js, "text/javascript"), (&css, "text/css")] {
        let (status, text) = tcp(addr, &get(path)).await;
        assert_eq!(status, 200, "{path}: {text}");
        let lower = text.to_ascii_lowercase();
        assert!(lower.contains(&format!("content-type: {kind}")), "{text}");
        assert!(
            lower.contains("immutable"),
            "versioned assets are cached: {text}"
        );
    }
    let s = UnixStream::connect(&socket).await.expect("connecting");
    let (status, _) = exchange(s, &get("/"), std::time::Duration::from_secs(5)).await;
    assert_eq!(status, 200, "the socket serves the page too");
    let post = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let (status, _) = tcp(addr, post).await;
    assert_eq!(status, 403, "only reads are open over TCP");
}

#[tokio::test]
async fn the_page_view_has_roles_shares_and_events_since_a_time() {
    let api = serve().await;
    let addr = api.tcp;
    let (status, text) = tcp(addr, &get("/api/v1/page")).await;
    assert_eq!(status, 200, "{text}");
    let v = json_body(&text);
    let servers = &v.services[0].servers;
    assert_eq!(
        (
            servers[0].role.as_str(),
            servers[0].effective_weight,
            servers[0].share
        ),
        ("primary", 1, 1.0)
    );
    assert_eq!(
        (
            servers[1].state.as_str(),
            servers[1].effective_weight,
            servers[1].share
        ),
        ("unhealthy", 0, 0.0)
    );
    assert_eq!(
        v.events.iter().map(|e| e.to.as_str()).collect::<Vec<_>>(),
        ["unhealthy", "draining"],
        "the first look brings the last hour"
    );
    let since = v.events[1].time.clone();
    let (status, text) = tcp(
        addr,
        &get(&format!(
            "/api/v1/page?events_since={}",
            since.replace(':', "%3A")
        )),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let v = json_body(&text);
    assert_eq!(
        v.events.iter().map(|e| e.to.as_str()).collect::<Vec<_>>(),
        ["draining"],
        "events at or after the time asked"
    );
    for bad in [
        "/api/v1/page?events_since=yesterday",
        "/api/v1/page?since=x",
    ] {
        let (status, text) = tcp(addr, &get(bad)).await;
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(
            text.contains("events_since"),
            "the refusal says what is allowed: {text}"
        );
    }
}
