//! What one client may cost the API: the limits of both listeners, and the middleware
//! that reads a request body within its size and time bounds.

use std::time::Duration;

use axum::{
    body::{Body, to_bytes},
    extract::{Request, State},
    http::StatusCode,
    middleware::Next,
    response::{IntoResponse, Response},
};
use serde_json::json;

use super::counters::{ApiCounters, Rejection};

/// The limits of one listener (docs/api-security.md lists the values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A connection must send a complete request head within this after it opens or
    /// after its previous answer (slowloris and idle keep-alive connections).
    pub header_timeout: Duration,
    /// Request line and headers together, bytes.
    pub max_header_bytes: usize,
    /// Header lines per request.
    pub max_headers: usize,
    /// A request body, bytes.
    pub max_body: usize,
    /// The whole body must arrive within this once the head is read.
    pub body_timeout: Duration,
    /// Connections served at once; a connection beyond it is closed when accepted.
    pub max_connections: usize,
    /// A connection is closed after this long whatever it does (a client that never
    /// reads its answer).
    pub max_connection_age: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(5),
            max_header_bytes: 8 * 1024,
            max_headers: 32,
            max_body: 64 * 1024,
            body_timeout: Duration::from_secs(5),
            max_connections: 64,
            max_connection_age: Duration::from_secs(60),
        }
    }
}

/// What the body middleware needs.
#[derive(Clone)]
pub struct BodyBounds {
    pub limits: Limits,
    pub counters: std::sync::Arc<ApiCounters>,
}

/// Reads the whole body within `max_body` and `body_timeout` before the handler runs:
/// `413` for a larger body, `408` for one that does not arrive in time.
pub async fn bounded_body(State(b): State<BodyBounds>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout(b.limits.body_timeout, to_bytes(body, b.limits.max_body));
    let bytes = match read.await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            b.counters.reject(Rejection::BodyTooLarge);
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is limited to {} bytes", b.limits.max_body),
            );
        }
        Err(_) => {
            b.counters.reject(Rejection::BodyTimeout);
            return refuse(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {:?}",
                    b.limits.body_timeout
                ),
            );
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

pub(super) fn refuse(code: StatusCode, message: String) -> Response {
    (code, axum::Json(json!({ "error": message }))).into_response()
}
