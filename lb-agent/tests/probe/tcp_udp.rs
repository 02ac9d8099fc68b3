//! tcp and udp probes against servers on 127.0.0.1 started by each test.

use std::net::SocketAddr;
use std::time::Duration;

use lb_agent::config::{ProbeConfig, ProbeKind};
use lb_agent::probe::{ProbeOutcome, execute};
use regex::Regex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_millis(600);

fn probe(kind: ProbeKind) -> ProbeConfig {
    let mut p = ProbeConfig::new("check", kind);
    p.timeout = TIMEOUT;
    p
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

/// A TCP server: reads up to `read` bytes (0: none), then writes `reply` (forever when
/// `endless`), then holds the connection open for a while.
async fn tcp_server(read: usize, reply: &'static [u8], endless: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = vec![0u8; read];
                if read > 0 {
                    let _ = conn.read_exact(&mut buf).await;
                }
                let end = Instant::now() + Duration::from_secs(30);
                loop {
                    if conn.write_all(reply).await.is_err() || !endless || Instant::now() > end {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    addr
}

async fn closed_tcp_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

#[tokio::test]
async fn tcp_connect_passes() {
    let addr = tcp_server(0, b"", false).await;
    let o = execute(&probe(ProbeKind::Tcp), addr).await;
    assert!(o.ok, "expected a pass, got {o:?}");
}

#[tokio::test]
async fn tcp_refused_fails_at_once() {
    let o = execute(&probe(ProbeKind::Tcp), closed_tcp_port().await).await;
    assert_fails(&o, "connection refused", true);
}

#[tokio::test]
async fn tcp_send_and_expect_passes_when_the_reply_matches() {
    let addr = tcp_server(6, b"+PONG\r\n", false).await;
    let mut p = probe(ProbeKind::Tcp);
    p.send = Some(b"PING\r\n".to_vec());
    p.expect = Some(Regex::new(r"^\+PONG").unwrap());
    let o = execute(&p, addr).await;
    assert!(o.ok, "expected a pass, got {o:?}");
}

#[tokio::test]
async fn tcp_expect_fails_on_a_different_reply_and_close() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        conn.write_all(b"-ERR nope\r\n").await.unwrap();
    });
    let mut p = probe(ProbeKind::Tcp);
    p.expect = Some(Regex::new(r"^\+PONG").unwrap());
    assert_fails(&execute(&p, addr).await, "response did not match", true);
}

#[tokio::test]
async fn tcp_expect_fails_as_soon_as_the_reply_cannot_match() {
    // Redis while it loads its dataset: a wrong answer, and the connection stays open.
    let addr = tcp_server(
        0,
        b"-LOADING Redis is loading the dataset in memory\r\n",
        false,
    )
    .await;
    let mut p = probe(ProbeKind::Tcp);
    p.send = Some(b"PING\r\n".to_vec());
    p.expect = Some(Regex::new(r"^\+PONG").unwrap());
    let o = execute(&p, addr).await;
    assert_fails(&o, "cannot match any more", true);
    assert!(
        o.duration < TIMEOUT / 2,
        "decided by the first bytes, not at the timeout: {o:?}"
    );
}

#[tokio::test]
async fn tcp_expect_reads_at_most_max_response() {
    let addr = tcp_server(0, b"garbage garbage garbage\n", true).await;
    let mut p = probe(ProbeKind::Tcp);
    p.expect = Some(Regex::new("OK").unwrap());
    p.max_response = 4096;
    let o = execute(&p, addr).await;
    assert_fails(
        &o,
        "response did not match (4096 bytes, max_response reached)",
        true,
    );
}

#[tokio::test]
async fn tcp_silent_server_times_out_only_when_a_reply_is_expected() {
    let addr = tcp_server(0, b"", false).await;
    let mut p = probe(ProbeKind::Tcp);
    p.send = Some(b"hello".to_vec());
    p.expect = Some(Regex::new("OK").unwrap());
    assert_fails(&execute(&p, addr).await, "timeout", false);
    p.max_response = 0;
    let o = execute(&p, addr).await;
    assert!(o.ok, "max_response = 0: no reply awaited, got {o:?}");
}

/// A UDP server answering each datagram with `reply` (or never, for `None`).
async fn udp_server(reply: Option<&'static [u8]>) -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        loop {
            let (_, from) = sock.recv_from(&mut buf).await.unwrap();
            if let Some(reply) = reply {
                sock.send_to(reply, from).await.unwrap();
            }
        }
    });
    addr
}

#[tokio::test]
async fn udp_reply_must_match_expect() {
    let addr = udp_server(Some(b"PONG 42")).await;
    let mut p = probe(ProbeKind::Udp);
    p.send = Some(b"PING".to_vec());
    p.expect = Some(Regex::new(r"^PONG \d+").unwrap());
    let o = execute(&p, addr).await;
    assert!(o.ok, "expected a pass, got {o:?}");
    p.expect = Some(Regex::new("^OK").unwrap());
    assert_fails(&execute(&p, addr).await, "reply did not match", true);
}

#[tokio::test]
async fn udp_port_unreachable_fails_at_once() {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    drop(sock);
    for expect in [None, Some(Regex::new("x").unwrap())] {
        let mut p = probe(ProbeKind::Udp);
        p.expect = expect;
        let o = execute(&p, addr).await;
        assert_fails(&o, "port unreachable", true);
        assert!(
            o.duration < Duration::from_millis(200),
            "no waiting for the timeout: {o:?}"
        );
    }
}

#[tokio::test]
async fn udp_silence_passes_only_without_expect() {
    let addr = udp_server(None).await;
    let mut p = probe(ProbeKind::Udp);
    p.send = Some(b"PING".to_vec());
    let start = Instant::now();
    let o = execute(&p, addr).await;
    assert!(o.ok, "silence without expect passes, got {o:?}");
    assert!(
        start.elapsed() >= TIMEOUT,
        "after waiting the timeout for an ICMP error"
    );
    p.expect = Some(Regex::new("PONG").unwrap());
    assert_fails(&execute(&p, addr).await, "timeout", false);
}

#[tokio::test]
async fn udp_any_reply_passes_without_expect() {
    let addr = udp_server(Some(b"whatever")).await;
    let o = execute(&probe(ProbeKind::Udp), addr).await;
    assert!(o.ok, "expected a pass, got {o:?}");
    assert!(o.duration < TIMEOUT, "the reply ends the probe: {o:?}");
}

/// `max_response = 0` reads no reply, but the probe still checks the port: a closed one
/// answers the datagram with an ICMP port-unreachable, which a receive on the connected
/// socket reports (a probe that passed right after the send would never see it).
#[tokio::test]
async fn udp_max_response_zero_still_fails_on_a_closed_port() {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let closed = sock.local_addr().unwrap();
    drop(sock);
    let mut p = probe(ProbeKind::Udp);
    p.send = Some(b"PING".to_vec());
    p.max_response = 0;
    let o = execute(&p, closed).await;
    assert_fails(&o, "port unreachable", true);
    assert!(
        o.duration < Duration::from_millis(200),
        "the ICMP error ends the probe: {o:?}"
    );

    let silent = udp_server(None).await;
    let start = Instant::now();
    let o = execute(&p, silent).await;
    assert!(o.ok, "an open, silent port passes, got {o:?}");
    assert!(
        start.elapsed() >= TIMEOUT,
        "after waiting the timeout for an ICMP error: {o:?}"
    );

    let answering = udp_server(Some(b"PONG")).await;
    let o = execute(&p, answering).await;
    assert!(o.ok, "an answering port passes, got {o:?}");
    assert!(o.duration < TIMEOUT, "the reply ends the probe: {o:?}");
}
