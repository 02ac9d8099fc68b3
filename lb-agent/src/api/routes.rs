//! HTTP routes of the API.

use axum::{
    Json, Router,
    extract::{Path, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, patch},
};
use serde_json::json;
use tokio::sync::oneshot;

use super::{AdminChange, AdminError, AdminRequest, ApiState, NewServer, ServerPatch};

/// The API's routes over `state`.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/api/v1/agent", get(agent))
        .route("/api/v1/services", get(services))
        .route("/api/v1/services/{name}", get(service))
        .route(
            "/api/v1/services/{name}/servers",
            axum::routing::post(add_server),
        )
        .route(
            "/api/v1/services/{name}/servers/{address}",
            patch(patch_server).delete(remove_server),
        )
        .route("/api/v1/events", get(events))
        .route("/api/v1/reload", axum::routing::post(reload))
        .route("/api/v1/node", get(node))
        .route("/api/v1/node/drain", axum::routing::post(node_drain))
        .route("/api/v1/node/undrain", axum::routing::post(node_undrain))
        .route("/metrics", get(metrics))
        .route("/", get(super::page::index))
        .route("/page/app.js", get(super::page::app_js))
        .route("/page/style.css", get(super::page::style_css))
        .route("/api/v1/page", get(super::page::page))
        .with_state(state)
}

/// The agent itself: its build and where it is attached.
async fn agent(State(st): State<ApiState>) -> Response {
    let snap = st.snapshot.get().await;
    let mut body = json!({
        "build": snap.build,
        "interface": snap.interface,
        "xdp_mode": snap.xdp_mode,
        "tables": snap.tables,
    });
    if let Some(cluster) = &snap.cluster {
        body["cluster"] = json!(cluster);
    }
    Json(body).into_response()
}

async fn services(State(st): State<ApiState>) -> Response {
    let snap = st.snapshot.get().await;
    Json(&snap.services).into_response()
}

async fn service(State(st): State<ApiState>, Path(name): Path<String>) -> Response {
    let snap = st.snapshot.get().await;
    match snap.services.iter().find(|s| s.name == name) {
        Some(svc) => Json(svc).into_response(),
        None => error(StatusCode::NOT_FOUND, &AdminError::NoService(name)),
    }
}

async fn events(State(st): State<ApiState>) -> Response {
    let log = st.events.lock().await;
    Json(log.iter().collect::<Vec<_>>()).into_response()
}

async fn metrics(State(st): State<ApiState>) -> Response {
    let snap = st.snapshot.get().await;
    let mut text = super::render_metrics(&snap);
    st.counters.render(&mut text);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn reload(State(st): State<ApiState>) -> Response {
    let (reply, answer) = oneshot::channel();
    if st.reload.send(reply).await.is_err() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            &AdminError::Invalid("the agent is shutting down".into()),
        );
    }
    match answer.await {
        Ok(Ok(outcome)) => Json(json!({"ok": true, "warnings": outcome.warnings})).into_response(),
        Ok(Err(why)) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": why})),
        )
            .into_response(),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            &AdminError::Invalid("the agent dropped the request".into()),
        ),
    }
}

/// The node's announcement state: VIPs, drain, BGP sessions.
async fn node(State(st): State<ApiState>) -> Response {
    let snap = st.snapshot.get().await;
    Json(&snap.announce).into_response()
}

async fn node_drain(State(st): State<ApiState>) -> Response {
    ask(
        &st,
        String::new(),
        String::new(),
        AdminChange::NodeDrain(true),
    )
    .await
}

async fn node_undrain(State(st): State<ApiState>) -> Response {
    ask(
        &st,
        String::new(),
        String::new(),
        AdminChange::NodeDrain(false),
    )
    .await
}

async fn patch_server(
    State(st): State<ApiState>,
    Path((name, address)): Path<(String, String)>,
    Json(patch): Json<ServerPatch>,
) -> Response {
    ask(&st, name, address, AdminChange::Patch(patch)).await
}

async fn add_server(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    Json(server): Json<NewServer>,
) -> Response {
    let address = server.address.to_string();
    ask(&st, name, address, AdminChange::Add(server)).await
}

async fn remove_server(
    State(st): State<ApiState>,
    Path((name, address)): Path<(String, String)>,
) -> Response {
    ask(&st, name, address, AdminChange::Remove).await
}

async fn ask(st: &ApiState, service: String, address: String, change: AdminChange) -> Response {
    let (reply, answer) = oneshot::channel();
    let req = AdminRequest {
        service,
        address,
        change,
        reply,
    };
    if st.admin.send(req).await.is_err() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            &AdminError::Invalid("the agent is shutting down".into()),
        );
    }
    match answer.await {
        Ok(Ok(())) => Json(json!({"ok": true})).into_response(),
        Ok(Err(err)) => {
            let code = match err {
                AdminError::NoService(_) | AdminError::NoServer { .. } => StatusCode::NOT_FOUND,
                AdminError::Invalid(_) => StatusCode::BAD_REQUEST,
            };
            error(code, &err)
        }
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            &AdminError::Invalid("the agent dropped the request".into()),
        ),
    }
}

fn error(code: StatusCode, err: &AdminError) -> Response {
    (code, Json(json!({"error": err.to_string()}))).into_response()
}
