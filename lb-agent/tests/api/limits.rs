//! Every limit of the API on a real socket (docs/api-security.md): a slow or idle client
//! is cut after the header timeout and never holds the API, oversized heads and bodies
//! are refused, a slow body times out, and connections beyond the cap are closed at once
//! while the Unix socket keeps answering.

use std::time::{Duration, Instant};

use crate::util::{GET_SERVICES, closed_within, parse, start, tcp, unix};
use lb_agent::api::{Limits, Rejection};
use tokio::{io::AsyncWriteExt, net::TcpStream};

/// Short limits so the tests run quickly; the defaults are longer.
fn limits() -> Limits {
    Limits {
        header_timeout: Duration::from_millis(500),
        max_header_bytes: 2048,
        max_headers: 16,
        max_body: 1024,
        body_timeout: Duration::from_millis(500),
        max_connections: 8,
        max_connection_age: Duration::from_secs(20),
    }
}

/// Scheduling slack on a loaded machine.
const MARGIN: Duration = Duration::from_millis(1500);

#[tokio::test]
async fn a_slowloris_client_is_cut_at_the_header_timeout_and_others_are_served() {
    let api = start(limits(), None).await;
    let mut slow = TcpStream::connect(api.tcp).await.unwrap();
    let t0 = Instant::now();
    slow.write_all(b"GET /api/v1/services HTTP/1.1\r\n")
        .await
        .unwrap();
    // One header line every 100 ms, never the blank line: until the server hangs up.
    let mut closed_after = None;
    for i in 0..40 {
        if slow
            .write_all(format!("X-Slow-{i}: 1\r\n").as_bytes())
            .await
            .is_err()
        {
            closed_after = Some(t0.elapsed());
            break;
        }
        if i == 2 {
            let (status, _) = tcp(&api, GET_SERVICES).await;
            assert_eq!(status, 200, "a legitimate client is served meanwhile");
        }
        if closed_within(&mut slow, Duration::from_millis(100))
            .await
            .is_some()
        {
            closed_after = Some(t0.elapsed());
            break;
        }
    }
    let took = closed_after.expect("the slow client must be disconnected");
    assert!(
        took >= Duration::from_millis(400) && took <= limits().header_timeout + MARGIN,
        "cut after {took:?}; the header timeout is {:?}",
        limits().header_timeout
    );
    assert!(api.counters.get(Rejection::HeaderTimeout) >= 1);
}

#[tokio::test]
async fn idle_connections_and_idle_keep_alives_are_closed() {
    let api = start(limits(), None).await;
    let mut idle = TcpStream::connect(api.tcp).await.unwrap();
    let t0 = Instant::now();
    closed_within(&mut idle, limits().header_timeout + MARGIN)
        .await
        .expect("a connection that never sends is closed");
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t0.elapsed()
    );

    let mut keep = TcpStream::connect(api.tcp).await.unwrap();
    keep.write_all(b"GET /api/v1/services HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let t1 = Instant::now();
    let out = closed_within(&mut keep, limits().header_timeout + MARGIN)
        .await
        .expect("a keep-alive connection idle after its answer is closed");
    assert_eq!(parse(&out).0, 200, "it got its answer first");
    assert!(
        t1.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t1.elapsed()
    );
}

#[tokio::test]
async fn heads_beyond_the_size_and_count_limits_are_refused() {
    let api = start(limits(), None).await;
    let long = format!(
        "GET /api/v1/services HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(4096)
    );
    let (status, _) = tcp(&api, &long).await;
    assert_eq!(status, 431, "a head over max_header_bytes");
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(4096));
    let (status, _) = tcp(&api, &long_uri).await;
    assert_eq!(status, 431, "a request line over max_header_bytes");
    let many: String = (0..40).map(|i| format!("X-H{i}: 1\r\n")).collect();
    let (status, _) = tcp(
        &api,
        &format!("GET /api/v1/services HTTP/1.1\r\nHost: x\r\n{many}\r\n"),
    )
    .await;
    assert_eq!(status, 431, "more than max_headers header lines");
    assert!(api.counters.get(Rejection::BadHead) >= 3);
    let (status, _) = tcp(&api, GET_SERVICES).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn large_and_slow_bodies_are_refused() {
    let api = start(limits(), None).await;
    let body = format!("{{\"drain\":true,\"pad\":\"{}\"}}", "x".repeat(4000));
    let big = format!(
        "PATCH /api/v1/services/web/servers/10.0.1.1:80 HTTP/1.1\r\nHost: x\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, text) = unix(&api, &big).await;
    assert_eq!(status, 413, "{text}");
    assert_eq!(api.counters.get(Rejection::BodyTooLarge), 1);

    let mut slow = tokio::net::UnixStream::connect(&api.socket).await.unwrap();
    slow.write_all(
        b"PATCH /api/v1/services/web/servers/10.0.1.1:80 HTTP/1.1\r\nHost: x\r\n\
          Content-Length: 100\r\nConnection: close\r\n\r\n{\"drain\"",
    )
    .await
    .unwrap();
    let t0 = Instant::now();
    let out = closed_within(&mut slow, limits().body_timeout + MARGIN)
        .await
        .expect("a body that stops coming is answered and closed");
    assert_eq!(parse(&out).0, 408, "{}", String::from_utf8_lossy(&out));
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(api.counters.get(Rejection::BodyTimeout), 1);
    assert_eq!(
        api.changes.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "neither reached the agent"
    );
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once_and_the_socket_still_answers() {
    let api = start(limits(), None).await;
    let mut held = Vec::new();
    for _ in 0..limits().max_connections {
        held.push(TcpStream::connect(api.tcp).await.unwrap());
    }
    // Let the accept loop take every one of them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = TcpStream::connect(api.tcp).await.unwrap();
    let t0 = Instant::now();
    let out = closed_within(&mut extra, Duration::from_millis(300))
        .await
        .expect("a connection beyond the cap is closed at once");
    assert!(out.is_empty(), "closed without an answer");
    assert!(t0.elapsed() < Duration::from_millis(300));
    assert!(api.counters.get(Rejection::ConnectionCap) >= 1);

    let (status, _) = unix(&api, GET_SERVICES).await;
    assert_eq!(status, 200, "the socket has slots of its own");

    // The held connections time out; TCP serves again.
    for h in &mut held {
        closed_within(h, limits().header_timeout + MARGIN)
            .await
            .expect("held idle connections are cut at the header timeout");
    }
    let (status, _) = tcp(&api, GET_SERVICES).await;
    assert_eq!(status, 200, "slots come back");
}
