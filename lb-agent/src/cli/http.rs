//! A small HTTP/1.1 client (hyper) for the CLI commands that talk to the agent's API.

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, body::Bytes};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Default API address (`agent.api_listen` default).
pub const DEFAULT_API: &str = "http://127.0.0.1:9900";

/// Sends one request to `base` + `path` and returns (status, body).
pub async fn request(
    base: &str,
    method: Method,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<(u16, String)> {
    let authority = base
        .strip_prefix("http://")
        .context("--api must start with http://")?
        .trim_end_matches('/');
    let stream = TcpStream::connect(authority).await.with_context(|| {
        format!("connecting to the agent API at {base} (is `lb-agent run` up?)")
    })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", authority)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// Like [`request`], failing on a non-2xx status with the API's error text.
pub async fn request_ok(
    base: &str,
    method: Method,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<String> {
    let (status, text) = request(base, method, path, body).await?;
    if !(200..300).contains(&status) {
        let msg = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(String::from))
            .unwrap_or(text);
        bail!("the agent answered {status}: {msg}");
    }
    Ok(text)
}

/// Percent-encodes a path segment (addresses contain `:` and `[`).
pub fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b':' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
