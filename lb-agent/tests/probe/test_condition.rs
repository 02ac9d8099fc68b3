//! Probes with a `test` condition, an http request body and secret headers, executed
//! against servers on 127.0.0.1 started by each test: a holding test passes, a failing one
//! fails (at once when the response is complete), silence with a test is a failure.

use std::net::SocketAddr;
use std::time::Duration;

use lb_agent::config::{ProbeConfig, ProbeKind, Secret};
use lb_agent::probe::condition::{Condition, Scope};
use lb_agent::probe::execute;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::mpsc;

const TIMEOUT: Duration = Duration::from_millis(800);

fn with_test(kind: ProbeKind, test: &str) -> ProbeConfig {
    let mut p = ProbeConfig::new("check", kind);
    p.timeout = TIMEOUT;
    let scope = if kind == ProbeKind::Http {
        Scope::Http
    } else {
        Scope::Stream
    };
    p.test = Some(Condition::parse(test, scope).expect("a valid test"));
    p
}

/// A line echo server: greets with `hello\n`, answers each line with `echo <line>`,
/// closes after `lines` lines.
async fn echo_server(lines: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let (r, mut w) = conn.into_split();
                let _ = w.write_all(b"hello\n").await;
                let mut r = BufReader::new(r);
                for _ in 0..lines {
                    let mut line = String::new();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let _ = w.write_all(format!("echo {line}").as_bytes()).await;
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn tcp_test_holds_on_the_echo_across_reads() {
    let addr = echo_server(1).await;
    let mut p = with_test(
        ProbeKind::Tcp,
        "$upstream_probe_response ~ \"echo PING\" && $upstream_probe_response !~ \"data:\"",
    );
    p.send = Some(b"PING\n".to_vec());
    let o = execute(&p, addr).await;
    assert!(o.ok, "expected a pass, got {o:?}");
}

#[tokio::test]
async fn tcp_test_that_never_holds_fails_when_the_peer_closes() {
    let addr = echo_server(1).await;
    let mut p = with_test(ProbeKind::Tcp, "$upstream_probe_response ~ \"echo PONG\"");
    p.send = Some(b"PING\n".to_vec());
    let o = execute(&p, addr).await;
    assert!(!o.ok && o.immediate, "fails at the close: {o:?}");
    assert!(o.detail.contains("closed"), "{o:?}");
    assert!(o.duration < TIMEOUT, "before the timeout: {o:?}");
}

#[tokio::test]
async fn tcp_negated_test_holds_at_the_close_on_what_came() {
    let addr = echo_server(1).await;
    let mut p = with_test(ProbeKind::Tcp, "!($upstream_probe_response ~ ERR)");
    p.send = Some(b"PING\n".to_vec());
    let o = execute(&p, addr).await;
    assert!(o.ok, "{o:?}");
}

async fn udp_server(reply: Option<&'static [u8]>) -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        for _ in 0..16 {
            let Ok((_, peer)) = sock.recv_from(&mut buf).await else {
                return;
            };
            if let Some(r) = reply {
                let _ = sock.send_to(r, peer).await;
            }
        }
    });
    addr
}

#[tokio::test]
async fn udp_test_judges_the_reply() {
    let addr = udp_server(Some(b"PONG v2")).await;
    let o = execute(
        &with_test(ProbeKind::Udp, "$upstream_probe_response ~ ^PONG"),
        addr,
    )
    .await;
    assert!(o.ok, "{o:?}");
    let o = execute(
        &with_test(ProbeKind::Udp, "$upstream_probe_response ~ v3"),
        addr,
    )
    .await;
    assert!(!o.ok && o.immediate, "{o:?}");
    assert!(o.detail.contains("test failed"), "{o:?}");
}

#[tokio::test]
async fn udp_silence_fails_a_probe_with_a_test() {
    let addr = udp_server(None).await;
    let o = execute(
        &with_test(ProbeKind::Udp, "!$upstream_probe_response"),
        addr,
    )
    .await;
    assert!(!o.ok, "a test needs a reply; silence is no pass: {o:?}");
    assert_eq!(o.detail, "timeout");
}

/// An HTTP server answering every request with `reply` (headers and body after the
/// status line), sending each request (head and body) to the receiver.
async fn http_server(reply: &'static str) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                // Head and a Content-Length body: enough for these small requests.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                while tokio::time::Instant::now() < deadline {
                    let n = tokio::time::timeout(Duration::from_millis(100), conn.read(&mut buf))
                        .await
                        .unwrap_or(Ok(0))
                        .unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    req.extend_from_slice(&buf[..n]);
                }
                let _ = tx.send(String::from_utf8_lossy(&req).into_owned());
                let _ = conn.write_all(reply.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr, rx)
}

const PRIMARY: &str = "HTTP/1.1 200 OK\r\nX-Role: primary\r\nX-Role: ro\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{\"ok\":true}";

#[tokio::test]
async fn http_test_over_status_headers_and_body() {
    let (addr, _) = http_server(PRIMARY).await;
    let pass = with_test(
        ProbeKind::Http,
        "$upstream_status ~ ^2 && $upstream_http_x_role ~ primary && $upstream_probe_response ~ \"\\\"ok\\\":true\"",
    );
    let o = execute(&pass, addr).await;
    assert!(o.ok, "{o:?}");
    assert_eq!(o.detail, "status 200, test passed");

    let fail = with_test(
        ProbeKind::Http,
        "$upstream_status == 200 && !($upstream_http_x_role ~ ro)",
    );
    let o = execute(&fail, addr).await;
    assert!(!o.ok && o.immediate, "{o:?}");
    assert_eq!(o.detail, "test failed (status 200)");

    let either = with_test(
        ProbeKind::Http,
        "$upstream_status == 503 || $upstream_http_x_missing || $upstream_http_x_role == \"primary, ro\"",
    );
    assert!(execute(&either, addr).await.ok);
}

#[tokio::test]
async fn http_test_may_accept_a_non_2xx_status() {
    let (addr, _) = http_server(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    let p = with_test(
        ProbeKind::Http,
        "$upstream_status == 503 && $upstream_http_retry_after",
    );
    let o = execute(&p, addr).await;
    assert!(o.ok, "the test replaces expect_status: {o:?}");
}

#[tokio::test]
async fn http_method_body_and_secret_header_are_sent() {
    let (addr, mut requests) = http_server(PRIMARY).await;
    let mut p = ProbeConfig::new("health", ProbeKind::Http);
    p.timeout = TIMEOUT;
    p.http.method = "POST".into();
    p.http.body = Some(b"{\"probe\":1}".to_vec());
    p.http.secret_headers = vec![(
        "X-Health-Key".into(),
        Secret::new("k-123".into(), "env TEST".into()),
    )];
    let o = execute(&p, addr).await;
    assert!(o.ok, "{o:?}");
    let req = requests.recv().await.expect("the server saw the request");
    assert!(req.starts_with("POST / HTTP/1.1\r\n"), "{req}");
    let lower = req.to_ascii_lowercase();
    assert!(lower.contains("\r\ncontent-length: 11\r\n"), "{req}");
    assert!(lower.contains("\r\nx-health-key: k-123\r\n"), "{req}");
    assert!(req.ends_with("\r\n\r\n{\"probe\":1}"), "{req}");
}
