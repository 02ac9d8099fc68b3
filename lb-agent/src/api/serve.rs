//! The two listeners and their accept loops: every connection takes one of
//! `max_connections` slots (none free: closed at once, counted), is served by hyper with
//! the head limits and timeouts of [`Limits`], and ends after `max_connection_age`.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{Router, middleware::from_fn_with_state};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, UnixListener},
    sync::Semaphore,
};
use tracing::warn;

use super::{
    ApiState,
    auth::{self, Access, AuthState, Token},
    counters::{ApiCounters, Rejection},
    limits::{self, BodyBounds, Limits},
    socket::{self, SocketError, SocketFile},
};

/// Pause after a failed `accept` (e.g. out of file descriptors) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// What to listen on.
#[derive(Debug, Clone, Default)]
pub struct ListenConfig {
    pub tcp: Option<SocketAddr>,
    pub socket: Option<PathBuf>,
    pub socket_group: Option<String>,
    /// Changes over TCP need it; `None`: TCP serves reads only.
    pub token: Option<Token>,
    pub limits: Limits,
}

/// Why the API could not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("binding the API to {addr}: {source}")]
    Tcp {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the API socket: {0}")]
    Socket(#[from] SocketError),
}

/// The running listeners; the socket file goes when this is dropped.
#[derive(Debug)]
pub struct Listening {
    /// The TCP address actually bound (port 0 resolved).
    pub tcp: Option<SocketAddr>,
    pub socket: Option<SocketFile>,
}

/// The routes behind `access`, with the body bounds and the authorization check.
pub fn app(state: ApiState, access: Access, limits: Limits) -> Router {
    let counters = state.counters.clone();
    super::router(state)
        .layer(from_fn_with_state(
            BodyBounds {
                limits,
                counters: counters.clone(),
            },
            limits::bounded_body,
        ))
        .layer(from_fn_with_state(
            AuthState { access, counters },
            auth::authorize,
        ))
}

/// Binds what `cfg` asks for and spawns the accept loops.
pub async fn listen(state: ApiState, cfg: ListenConfig) -> Result<Listening, ListenError> {
    let mut out = Listening {
        tcp: None,
        socket: None,
    };
    if let Some(path) = &cfg.socket {
        let (listener, file) = socket::bind(path, cfg.socket_group.as_deref())?;
        let app = app(state.clone(), Access::Socket, cfg.limits);
        tokio::spawn(serve_unix(
            listener,
            app,
            cfg.limits,
            state.counters.clone(),
        ));
        out.socket = Some(file);
    }
    if let Some(addr) = cfg.tcp {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ListenError::Tcp { addr, source })?;
        out.tcp = Some(
            listener
                .local_addr()
                .map_err(|source| ListenError::Tcp { addr, source })?,
        );
        let access = Access::Tcp {
            token: cfg.token.clone(),
        };
        let app = app(state.clone(), access, cfg.limits);
        tokio::spawn(serve_tcp(listener, app, cfg.limits, state.counters.clone()));
    }
    Ok(out)
}

/// Serves TCP connections until the runtime stops.
pub async fn serve_tcp(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    counters: Arc<ApiCounters>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut last_warning = None;
    loop {
        let accepted = listener.accept().await.map(|(s, _)| {
            let _ = s.set_nodelay(true);
            s
        });
        admit(accepted, &slots, &app, limits, &counters, &mut last_warning).await;
    }
}

/// Serves Unix-socket connections until the runtime stops.
pub async fn serve_unix(
    listener: UnixListener,
    app: Router,
    limits: Limits,
    counters: Arc<ApiCounters>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut last_warning = None;
    loop {
        let accepted = listener.accept().await.map(|(s, _)| s);
        admit(accepted, &slots, &app, limits, &counters, &mut last_warning).await;
    }
}

async fn admit<S>(
    accepted: std::io::Result<S>,
    slots: &Arc<Semaphore>,
    app: &Router,
    limits: Limits,
    counters: &Arc<ApiCounters>,
    last_warning: &mut Option<Instant>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let stream = match accepted {
        Ok(s) => s,
        Err(err) => {
            if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                warn!(error = %err, "API accept failed (retrying)");
                *last_warning = Some(Instant::now());
            }
            tokio::time::sleep(ACCEPT_BACKOFF).await;
            return;
        }
    };
    let Ok(slot) = slots.clone().try_acquire_owned() else {
        counters.reject(Rejection::ConnectionCap);
        drop(stream);
        return;
    };
    let app = app.clone();
    let counters = counters.clone();
    tokio::spawn(async move {
        connection(stream, app, limits, &counters).await;
        drop(slot);
    });
}

async fn connection<S>(stream: S, app: Router, limits: Limits, counters: &ApiCounters)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_headers(limits.max_headers)
        .keep_alive(true);
    let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    match tokio::time::timeout(limits.max_connection_age, conn).await {
        Ok(Ok(())) | Err(_) => {}
        Ok(Err(err)) if err.is_timeout() => counters.reject(Rejection::HeaderTimeout),
        Ok(Err(err)) if err.is_parse() || err.is_parse_too_large() => {
            counters.reject(Rejection::BadHead)
        }
        Ok(Err(_)) => {}
    }
}
