//! http(s) probes against servers on 127.0.0.1 started by each test, including hostile
//! ones (silent, endless body, garbage), each of which must fail within the timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lb_agent::config::{ProbeConfig, ProbeKind};
use lb_agent::probe::{ProbeOutcome, execute};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::PrivateKeyDer;

const TIMEOUT: Duration = Duration::from_millis(800);

fn http_probe() -> ProbeConfig {
    let mut p = ProbeConfig::new("health", ProbeKind::Http);
    p.timeout = TIMEOUT;
    p
}

/// What a test server does with one connection once it has read the request head.
#[derive(Clone)]
enum Behaviour {
    /// Writes these bytes and closes.
    Reply(Vec<u8>),
    /// Reads the request, then never writes, holding the connection open.
    Silent,
    /// Sends a 200 head, then body bytes forever, `chunk` per `every`.
    EndlessBody { chunk: usize, every: Duration },
    /// Accepts and never even reads.
    Mute,
    /// Writes these bytes at once, without reading the request, and closes.
    Blurt(Vec<u8>),
}

/// A server on 127.0.0.1:0 applying `b` to every connection; request heads (as text) go
/// to the returned receiver. It lives as long as the test's runtime.
async fn serve(b: Behaviour) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            tokio::spawn(handle(conn, b.clone(), tx.clone()));
        }
    });
    (addr, rx)
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    b: Behaviour,
    tx: mpsc::UnboundedSender<String>,
) {
    match &b {
        Behaviour::Mute => return tokio::time::sleep(Duration::from_secs(30)).await,
        Behaviour::Blurt(bytes) => {
            let _ = conn.write_all(bytes).await;
            let _ = conn.shutdown().await;
            return;
        }
        _ => {}
    }
    let head = read_head(&mut conn).await;
    let _ = tx.send(head);
    match b {
        Behaviour::Reply(bytes) => {
            let _ = conn.write_all(&bytes).await;
            let _ = conn.shutdown().await;
        }
        Behaviour::Silent | Behaviour::Mute | Behaviour::Blurt(_) => {
            tokio::time::sleep(Duration::from_secs(30)).await
        }
        Behaviour::EndlessBody { chunk, every } => {
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                .await;
            let data = vec![b'x'; chunk];
            // Bounded: stops when the prober goes away (write error) or after 30 s.
            let end = Instant::now() + Duration::from_secs(30);
            while Instant::now() < end && conn.write_all(&data).await.is_ok() {
                tokio::time::sleep(every).await;
            }
        }
    }
}

async fn read_head<S: AsyncRead + Unpin>(conn: &mut S) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        match conn.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn response(status: &str, body: &str) -> Behaviour {
    Behaviour::Reply(
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

fn assert_fails(o: &ProbeOutcome, detail: &str, immediate: bool) {
    assert!(!o.ok, "expected a failure ({detail}), got {o:?}");
    assert!(
        o.detail.contains(detail),
        "expected detail containing {detail:?}, got {o:?}"
    );
    assert_eq!(o.immediate, immediate, "immediate flag of {o:?}");
    assert!(
        o.duration <= TIMEOUT + Duration::from_millis(200),
        "bounded by the timeout: {o:?}"
    );
}

#[tokio::test]
async fn http_passes_on_expected_status_and_sends_the_configured_request() {
    let (addr, mut heads) = serve(response("200 OK", "fine")).await;
    let mut p = http_probe();
    p.http.uri = "/health?deep=1".into();
    p.http.method = "HEAD".into();
    p.http.headers = vec![("X-Probe".into(), "lb".into())];
    let o = execute(&p, addr).await;
    assert!(o.ok, "expected a pass, got {o:?}");
    assert_eq!(o.detail, "status 200");
    let head = heads.recv().await.unwrap();
    assert!(
        head.starts_with("HEAD /health?deep=1 HTTP/1.1\r\n"),
        "request line: {head}"
    );
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains(&format!("host: {addr}\r\n")),
        "Host is the target address: {head}"
    );
    assert!(lower.contains("connection: close\r\n"), "{head}");
    assert!(lower.contains("x-probe: lb\r\n"), "{head}");
}

#[tokio::test]
async fn http_uses_the_configured_host_and_probe_port() {
    let (addr, mut heads) = serve(response("204 No Content", "")).await;
    let mut p = http_probe();
    p.http.host = Some("app.example".into());
    p.port = Some(addr.port());
    // The server's own port is wrong; the probe port wins.
    let o = execute(&p, SocketAddr::new(addr.ip(), 1)).await;
    assert!(o.ok, "expected a pass, got {o:?}");
    let head = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(head.contains("host: app.example\r\n"), "{head}");
}

#[tokio::test]
async fn http_bad_status_fails_at_once() {
    let (addr, _) = serve(response("500 Internal Server Error", "oops")).await;
    let o = execute(&http_probe(), addr).await;
    assert_fails(&o, "status 500", true);
}

#[tokio::test]
async fn http_redirect_is_not_followed() {
    let redirect = "HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n";
    let (addr, _) = serve(Behaviour::Reply(redirect.into())).await;
    let o = execute(&http_probe(), addr).await;
    assert_fails(&o, "status 302", true);

    let mut p = http_probe();
    p.http.expect_status = vec![200..=200, 301..=302];
    let o = execute(&p, addr).await;
    assert!(o.ok, "302 is in expect_status: {o:?}");
}

#[tokio::test]
async fn http_body_must_match_expect_body() {
    let (addr, _) = serve(response("200 OK", "{\"status\":\"ok\"}")).await;
    let mut p = http_probe();
    p.http.expect_body = Some(regex::Regex::new(r#""status":"ok""#).unwrap());
    assert!(execute(&p, addr).await.ok, "body matches");
    p.http.expect_body = Some(regex::Regex::new("degraded").unwrap());
    let o = execute(&p, addr).await;
    assert_fails(&o, "body did not match", true);
}

#[tokio::test]
async fn http_expect_body_sees_only_the_first_max_body_bytes() {
    let body = format!("{}needle", "a".repeat(1000));
    let (addr, _) = serve(response("200 OK", &body)).await;
    let mut p = http_probe();
    p.http.expect_body = Some(regex::Regex::new("needle").unwrap());
    p.http.max_body = 1000;
    assert_fails(&execute(&p, addr).await, "body did not match", true);
    p.http.max_body = 1006;
    let o = execute(&p, addr).await;
    assert!(o.ok, "needle ends at byte 1006: {o:?}");
}

#[tokio::test]
async fn http_truncated_body_fails() {
    let (addr, _) = serve(Behaviour::Reply(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort".to_vec(),
    ))
    .await;
    let o = execute(&http_probe(), addr).await;
    assert_fails(&o, "invalid response", true);
}

#[tokio::test]
async fn http_refused_fails_at_once() {
    let addr = closed_port().await;
    let o = execute(&http_probe(), addr).await;
    assert_fails(&o, "connection refused", true);
    assert!(
        o.duration < Duration::from_millis(200),
        "no waiting for the timeout: {o:?}"
    );
}

#[tokio::test]
async fn hostile_server_that_never_answers_times_out() {
    for b in [Behaviour::Silent, Behaviour::Mute] {
        let (addr, _) = serve(b).await;
        let start = Instant::now();
        let o = execute(&http_probe(), addr).await;
        assert_fails(&o, "timeout", false);
        assert!(start.elapsed() >= TIMEOUT, "waited the whole timeout");
        assert!(
            start.elapsed() < TIMEOUT + Duration::from_millis(500),
            "and not much longer"
        );
    }
}

#[tokio::test]
async fn hostile_server_streaming_an_endless_body_fails_within_the_timeout() {
    // Fast: only max_body bytes are kept, but the response never completes, so it fails
    // at the timeout, with or without expect_body (DESIGN.md §5: "a complete response").
    let (addr, _) = serve(Behaviour::EndlessBody {
        chunk: 64 * 1024,
        every: Duration::from_millis(1),
    })
    .await;
    let mut p = http_probe();
    p.http.max_body = 256 * 1024;
    assert_fails(&execute(&p, addr).await, "timeout", false);
    p.http.expect_body = Some(regex::Regex::new("healthy").unwrap());
    assert_fails(&execute(&p, addr).await, "timeout", false);

    // Slow: the body never reaches max_body and never ends.
    let (addr, _) = serve(Behaviour::EndlessBody {
        chunk: 10,
        every: Duration::from_millis(20),
    })
    .await;
    assert_fails(&execute(&http_probe(), addr).await, "timeout", false);
}

#[tokio::test]
async fn hostile_server_answering_garbage_fails_at_once() {
    let mut noise = Vec::new();
    for i in 0..4096u32 {
        noise.push((i.wrapping_mul(2_654_435_761) >> 13) as u8);
    }
    for garbage in [
        b"SSH-2.0-OpenSSH_9.6\r\n".to_vec(),
        noise,
        b"HTTP/1.1 abc\r\n\r\n".to_vec(),
    ] {
        let (addr, _) = serve(Behaviour::Reply(garbage)).await;
        assert_fails(
            &execute(&http_probe(), addr).await,
            "invalid response",
            true,
        );
    }
}

#[tokio::test]
async fn hostile_server_with_endless_headers_fails_at_once() {
    let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
    while head.len() < 1024 * 1024 {
        head.extend_from_slice(
            b"X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
        );
    }
    let (addr, _) = serve(Behaviour::Reply(head)).await;
    assert_fails(
        &execute(&http_probe(), addr).await,
        "invalid response",
        true,
    );
}

async fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

/// A TLS server with a self-signed certificate for `backend.test`; the SNI each client
/// sent goes to the receiver.
async fn serve_tls(reply: &'static str) -> (SocketAddr, mpsc::UnboundedReceiver<Option<String>>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["backend.test".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let config = ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    )
    .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = tx.send(tls.get_ref().1.server_name().map(str::to_owned));
                let (sink, _) = mpsc::unbounded_channel();
                handle(tls, Behaviour::Reply(reply.into()), sink).await;
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn https_without_verify_accepts_a_self_signed_certificate() {
    let (addr, mut snis) = serve_tls("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let mut p = http_probe();
    p.http.tls = true;
    p.http.verify = false;
    p.http.sni = Some("backend.test".into());
    p.http.expect_body = Some(regex::Regex::new("^ok$").unwrap());
    let o = execute(&p, addr).await;
    assert!(o.ok, "expected a pass over TLS, got {o:?}");
    assert_eq!(
        snis.recv().await.unwrap().as_deref(),
        Some("backend.test"),
        "the configured SNI"
    );

    // Without sni, the Host name is sent.
    p.http.sni = None;
    p.http.host = Some("app.test:8443".into());
    assert!(execute(&p, addr).await.ok);
    assert_eq!(snis.recv().await.unwrap().as_deref(), Some("app.test"));
}

#[tokio::test]
async fn https_with_verify_rejects_a_self_signed_certificate() {
    let (addr, _) = serve_tls("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
    let mut p = http_probe();
    p.http.tls = true;
    p.http.sni = Some("backend.test".into());
    assert!(p.http.verify, "verify is the default");
    let o = execute(&p, addr).await;
    assert_fails(&o, "tls:", true);
}

#[tokio::test]
async fn https_probe_of_a_plain_http_server_fails_at_once() {
    let (addr, _) = serve(Behaviour::Blurt(
        b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec(),
    ))
    .await;
    let mut p = http_probe();
    p.http.tls = true;
    p.http.verify = false;
    assert_fails(&execute(&p, addr).await, "tls:", true);
}
