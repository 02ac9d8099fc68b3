//! Who may change what: the Unix socket serves every request (its file permissions are
//! the check, as HAProxy's runtime socket); TCP serves reads (`GET`) to anyone and
//! changes only with `Authorization: Bearer <token>` from `agent.api_token_file`.

use std::{os::unix::fs::MetadataExt, path::Path, sync::Arc};

use axum::{
    extract::{Request, State},
    http::{Method, StatusCode, header},
    middleware::Next,
    response::Response,
};
use subtle::ConstantTimeEq;

use super::{
    counters::{ApiCounters, Rejection},
    limits::refuse,
};

/// Shortest token accepted (bytes, after trimming whitespace).
pub const MIN_TOKEN_LEN: usize = 16;

/// The bearer token changes over TCP need.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    /// Constant-time comparison with `presented`.
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.0.len() == presented.len() && bool::from(self.0.ct_eq(presented))
    }
}

/// Why the token file is refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("reading the API token file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the API token file {path} is readable by other users (mode {mode:03o}): \
         `chmod 600 {path}` (or 640 with a group)"
    )]
    WorldReadable { path: String, mode: u32 },
    #[error(
        "the API token file {path} holds {len} bytes; a token needs at least {MIN_TOKEN_LEN} (e.g. `openssl rand -hex 32`)"
    )]
    TooShort { path: String, len: usize },
}

/// Reads the token (surrounding whitespace trimmed); refuses a file other users can
/// read or write, and a short token.
pub fn load_token(path: &Path) -> Result<Token, TokenError> {
    let shown = path.display().to_string();
    let read = |source| TokenError::Read {
        path: shown.clone(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    let mode = meta.mode() & 0o777;
    if mode & 0o007 != 0 {
        return Err(TokenError::WorldReadable { path: shown, mode });
    }
    let text = std::fs::read(path).map_err(read)?;
    let token = text.trim_ascii();
    if token.len() < MIN_TOKEN_LEN {
        return Err(TokenError::TooShort {
            path: shown,
            len: token.len(),
        });
    }
    Ok(Token(token.into()))
}

/// Which listener a request came in on.
#[derive(Clone, Debug)]
pub enum Access {
    /// The Unix socket: everything.
    Socket,
    /// TCP: reads to anyone, changes with the token (`None`: no changes at all).
    Tcp { token: Option<Token> },
}

/// What the authorization middleware needs.
#[derive(Clone)]
pub struct AuthState {
    pub access: Access,
    pub counters: Arc<ApiCounters>,
}

/// Lets a request through or answers `401`/`403`.
pub async fn authorize(State(a): State<AuthState>, req: Request, next: Next) -> Response {
    let Access::Tcp { token } = &a.access else {
        return next.run(req).await;
    };
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    let Some(token) = token else {
        a.counters.reject(Rejection::ChangesNeedSocket);
        return refuse(
            StatusCode::FORBIDDEN,
            "changes are not accepted over TCP without agent.api_token_file: use the Unix socket \
             (agent.api_socket; `lb-agent … --socket PATH`)"
                .into(),
        );
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    if !presented.is_some_and(|p| token.matches(p.trim_ascii())) {
        a.counters.reject(Rejection::Unauthorized);
        let mut resp = refuse(
            StatusCode::UNAUTHORIZED,
            "changes over TCP need `Authorization: Bearer <token>` with the token of \
             agent.api_token_file (`lb-agent … --token-file FILE`)"
                .into(),
        );
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("valid"));
        return resp;
    }
    next.run(req).await
}
