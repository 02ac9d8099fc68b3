//! The http probe: one HTTP/1.1 request (`method`, `headers`, `body`) over hyper's client
//! connection, `Connection: close`.
//!
//! A response passes when it is complete — head with a status in `expect_status`, body
//! read to its end within the probe's timeout — and `expect_body`, if set, matches its
//! first `max_body` bytes; with a `test`, when the complete response meets it instead. At most `max_body` bytes are kept (the rest is read and
//! discarded), so memory stays bounded; an endless body, one cut short by the peer, or
//! one that trickles slower than the timeout fails.

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, HOST, HeaderName, HeaderValue, USER_AGENT};
use hyper::{Method, Request, Response, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::condition::Response as Observed;
use super::{ProbeError, Verdict, bytes_regex, tls};
use crate::config::{HttpProbe, ProbeConfig};

/// hyper's read buffer bound (its minimum is 8 KiB): a response head larger than this
/// fails, and no read ever buffers more.
const MAX_BUF: usize = 64 * 1024;

pub(super) async fn probe(cfg: &ProbeConfig, addr: SocketAddr) -> Verdict {
    let h = &cfg.http;
    let request = build_request(h, addr)?;
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(ProbeError::connect)?;
    // Probes are one small request: no point waiting for Nagle.
    let _ = tcp.set_nodelay(true);
    if h.tls {
        let name = tls::server_name(h.sni.as_deref(), h.host.as_deref(), addr)?;
        let stream = tls::connect(tcp, name, h.verify).await?;
        exchange(TokioIo::new(stream), request, cfg).await
    } else {
        exchange(TokioIo::new(tcp), request, cfg).await
    }
}

fn build_request(h: &HttpProbe, addr: SocketAddr) -> Result<Request<Full<Bytes>>, ProbeError> {
    let bad = |reason: String| ProbeError::Request { reason };
    let method =
        Method::from_bytes(h.method.as_bytes()).map_err(|e| bad(format!("method: {e}")))?;
    let uri: Uri = h
        .uri
        .parse()
        .map_err(|e| bad(format!("uri {:?}: {e}", h.uri)))?;
    let host = match &h.host {
        Some(host) => host.clone(),
        None => default_host(addr, h.tls),
    };
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(Bytes::from(h.body.clone().unwrap_or_default())))
        .map_err(|e| bad(e.to_string()))?;
    let headers = req.headers_mut();
    headers.insert(
        HOST,
        HeaderValue::from_str(&host).map_err(|e| bad(format!("host: {e}")))?,
    );
    headers.insert(
        USER_AGENT,
        HeaderValue::from_static("lb-agent health probe"),
    );
    let plain = h.headers.iter().map(|(n, v)| (n, v.as_str(), false));
    let secret = h.secret_headers.iter().map(|(n, v)| (n, v.expose(), true));
    for (name, value, sensitive) in plain.chain(secret) {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| bad(format!("header {name:?}: {e}")))?;
        // The value never appears in the message (it may be a secret).
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| bad(format!("header {name}: invalid value")))?;
        value.set_sensitive(sensitive);
        // A configured Host or User-Agent replaces ours; other names may repeat.
        if name == HOST || name == USER_AGENT {
            headers.insert(name, value);
        } else {
            headers.append(name, value);
        }
    }
    // Last, so that no configured header keeps the connection open.
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    Ok(req)
}

/// `Host:` when none is configured: the target address, without the scheme's default port.
fn default_host(addr: SocketAddr, tls: bool) -> String {
    let default_port = if tls { 443 } else { 80 };
    match addr {
        SocketAddr::V4(a) if a.port() == default_port => a.ip().to_string(),
        SocketAddr::V6(a) if a.port() == default_port => format!("[{}]", a.ip()),
        a => a.to_string(),
    }
}

/// Sends `req` and judges the response, driving the connection in this task (nothing is
/// spawned, so the caller's timeout drops everything).
async fn exchange<T>(io: T, req: Request<Full<Bytes>>, cfg: &ProbeConfig) -> Verdict
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_BUF)
        .handshake::<_, Full<Bytes>>(io)
        .await
        .map_err(|source| ProbeError::Http { source })?;
    let work = async move {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|source| ProbeError::Http { source })?;
        judge(resp, cfg).await
    };
    tokio::pin!(conn);
    tokio::pin!(work);
    let mut conn_done = false;
    loop {
        tokio::select! {
            verdict = &mut work => return verdict,
            // The connection ends after the body (`Connection: close`); a connection error
            // also surfaces through `work`, so only keep waiting for it.
            _ = &mut conn, if !conn_done => conn_done = true,
        }
    }
}

async fn judge(resp: Response<Incoming>, cfg: &ProbeConfig) -> Verdict {
    let h = &cfg.http;
    let code = resp.status().as_u16();
    if let Some(test) = &cfg.test {
        let headers: Vec<(String, Vec<u8>)> = resp
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
            .collect();
        let (body, _) = read_body(resp.into_body(), h.max_body).await?;
        let observed = Observed {
            status: Some(code),
            headers: &headers,
            body: &body,
        };
        return if test.holds(&observed) {
            Ok(format!("status {code}, test passed"))
        } else {
            Err(ProbeError::TestFailed {
                got: format!("status {code}"),
            })
        };
    }
    if !h.expect_status.iter().any(|r| r.contains(&code)) {
        return Err(ProbeError::Status { code });
    }
    let (body, truncated) = read_body(resp.into_body(), h.max_body).await?;
    if let Some(re) = &h.expect_body
        && !bytes_regex(re)?.is_match(&body)
    {
        return Err(ProbeError::BodyMismatch);
    }
    Ok(if truncated {
        format!("status {code} (body matched on its first max_body bytes)")
    } else {
        format!("status {code}")
    })
}

/// Reads the body to its end, keeping at most `max` bytes; `true` when some were
/// discarded. The caller's timeout bounds how long an endless body is read.
async fn read_body(mut body: Incoming, max: usize) -> Result<(Vec<u8>, bool), ProbeError> {
    let mut buf = Vec::new();
    let mut truncated = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|source| ProbeError::Http { source })?;
        if let Ok(data) = frame.into_data() {
            let room = max - buf.len();
            if data.len() > room {
                truncated = true;
            }
            buf.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    Ok((buf, truncated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_host_omits_the_scheme_port() {
        assert_eq!(
            default_host("10.0.0.1:80".parse().unwrap(), false),
            "10.0.0.1"
        );
        assert_eq!(
            default_host("10.0.0.1:8080".parse().unwrap(), false),
            "10.0.0.1:8080"
        );
        assert_eq!(default_host("[::1]:443".parse().unwrap(), true), "[::1]");
        assert_eq!(default_host("[::1]:80".parse().unwrap(), true), "[::1]:80");
    }

    #[test]
    fn request_carries_host_headers_and_connection_close() {
        let h = HttpProbe {
            uri: "/health?full=1".into(),
            method: "HEAD".into(),
            headers: vec![
                ("X-Probe".into(), "1".into()),
                ("connection".into(), "keep-alive".into()),
            ],
            host: Some("app.example".into()),
            ..HttpProbe::default()
        };
        let req = build_request(&h, "10.0.0.1:8080".parse().unwrap()).unwrap();
        assert_eq!(req.method(), Method::HEAD);
        assert_eq!(req.uri(), "/health?full=1");
        assert_eq!(req.headers()[HOST], "app.example");
        assert_eq!(req.headers()["x-probe"], "1");
        assert_eq!(
            req.headers().get_all(CONNECTION).iter().collect::<Vec<_>>(),
            ["close"]
        );
    }

    #[test]
    fn bad_method_is_an_invalid_request() {
        let h = HttpProbe {
            method: "GE T".into(),
            ..HttpProbe::default()
        };
        let err = build_request(&h, "10.0.0.1:80".parse().unwrap()).unwrap_err();
        assert!(
            matches!(err, ProbeError::Request { .. }),
            "expected an invalid request, got {err}"
        );
    }
}
