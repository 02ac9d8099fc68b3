//! A small HTTP/1.1 client (hyper) for the CLI commands that talk to the agent's API:
//! over the Unix socket by default (every command), or over TCP with `--api URL`
//! (changes then need `--token-file`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, body::Bytes};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};

/// Default API socket (`agent.api_socket` default).
pub const DEFAULT_SOCKET: &str = lb_agent::config::DEFAULT_API_SOCKET;

/// Where the agent's API is and how to authenticate.
#[derive(Clone, Debug)]
pub enum Target {
    Socket(PathBuf),
    Tcp { base: String, token: Option<String> },
}

impl Target {
    /// `--api URL` wins over `--socket PATH`; the token is read from `token_file`.
    pub fn new(
        socket: &Path,
        api: Option<&str>,
        token_file: Option<&Path>,
    ) -> anyhow::Result<Target> {
        let Some(base) = api else {
            if token_file.is_some() {
                bail!("--token-file goes with --api URL (the socket needs no token)");
            }
            return Ok(Target::Socket(socket.to_path_buf()));
        };
        let token = token_file
            .map(|p| {
                std::fs::read_to_string(p)
                    .with_context(|| format!("reading the token file {}", p.display()))
                    .map(|t| t.trim().to_string())
            })
            .transpose()?;
        Ok(Target::Tcp {
            base: base.to_string(),
            token,
        })
    }
}

impl Target {
    /// Where the agent run with the config file `path` serves its API: its `api_socket`,
    /// or, when that is disabled (`""`), its `api_listen` over TCP with the token of its
    /// `api_token_file` (when this user can read it: reads need none).
    /// A file the loader refuses still names the API when its own keys are valid: that
    /// is the agent `reload` must reach to hear why the file is refused.
    pub fn from_config(path: &Path) -> anyhow::Result<Target> {
        let agent = match lb_agent::config::load(path) {
            Ok(cfg) => cfg.agent,
            Err(err) => api_keys_alone(path).ok_or_else(|| anyhow::anyhow!("{err}"))?,
        };
        if let Some(socket) = agent.api_socket {
            return Ok(Target::Socket(socket));
        }
        let Some(listen) = agent.api_listen else {
            bail!(
                "{} disables both api_socket and api_listen: the agent serves no API",
                path.display()
            );
        };
        let token = agent
            .api_token_file
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|t| t.trim().to_string());
        Ok(Target::Tcp {
            base: format!("http://{listen}"),
            token,
        })
    }
}

/// The `[agent]` table of `path` with only the keys that say where the API is, through
/// the loader (so with its defaults); `None` when even those do not load.
fn api_keys_alone(path: &Path) -> Option<lb_agent::config::AgentConfig> {
    const API_KEYS: [&str; 3] = ["api_socket", "api_listen", "api_token_file"];
    let text = std::fs::read_to_string(path).ok()?;
    let table: toml::Table = text.parse().ok()?;
    let mut keys = toml::Table::new();
    if let Some(agent) = table.get("agent").and_then(toml::Value::as_table) {
        for key in API_KEYS {
            if let Some(value) = agent.get(key) {
                keys.insert(key.to_string(), value.clone());
            }
        }
    }
    let mut alone = toml::Table::new();
    alone.insert("agent".to_string(), toml::Value::Table(keys));
    lb_agent::config::parse(&alone.to_string(), path)
        .ok()
        .map(|c| c.agent)
}

/// Sends one request to `target` + `path` and returns (status, body).
pub async fn request(
    target: &Target,
    method: Method,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<(u16, String)> {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    let (mut sender, host) = match target {
        Target::Socket(socket) => {
            let stream = UnixStream::connect(socket).await.with_context(|| {
                format!(
                    "connecting to the agent API socket {} (is `lb-agent run` up, and may this \
                     user open the socket? For an agent started with another config: `--config \
                     FILE` finds its socket; `--socket PATH` names one, `--api URL` uses TCP)",
                    socket.display()
                )
            })?;
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            (sender, "localhost".to_string())
        }
        Target::Tcp { base, token } => {
            let authority = base
                .strip_prefix("http://")
                .context("--api must start with http://")?
                .trim_end_matches('/');
            let stream = TcpStream::connect(authority).await.with_context(|| {
                format!("connecting to the agent API at {base} (is `lb-agent run` up?)")
            })?;
            if let Some(token) = token {
                req = req.header("authorization", format!("Bearer {token}"));
            }
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            (sender, authority.to_string())
        }
    };
    let req = req
        .header("host", host)
        .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// Like [`request`], failing on a non-2xx status with the API's error text.
pub async fn request_ok(
    target: &Target,
    method: Method,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<String> {
    let (status, text) = request(target, method, path, body).await?;
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
