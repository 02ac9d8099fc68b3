//! The status page (docs/status-page.md): a self-contained HTML/CSS/JS page at `/`
//! (assets embedded in the binary) and `GET /api/v1/page`, the compact view it polls:
//! per service and server the state, role, configured and effective weight, Maglev
//! share and counters; the data-plane counters and propagation histogram; and the
//! transitions since the page's last look.

use std::{
    sync::LazyLock,
    time::{Duration, SystemTime},
};

use axum::{
    Json,
    extract::State,
    http::{HeaderValue, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};

use super::ApiState;
use crate::view::{Event, Histogram, ServerStatus, ServiceStatus, Snapshot, Stats};

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const STYLE_CSS: &str = include_str!("page/style.css");

/// How far back the page's timeline reaches on its first look.
pub const TIMELINE_SPAN: Duration = Duration::from_secs(3600);

/// The page's own rules: only this origin's scripts, styles and fetches; never framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// The HTML with the assets' URLs versioned by their content, so a browser caches them
/// as long as it likes and still loads new ones after an upgrade.
static INDEX: LazyLock<String> = LazyLock::new(|| {
    INDEX_HTML
        .replace(
            "{{app_js}}",
            &format!("/page/app.js?v={:016x}", fnv(APP_JS)),
        )
        .replace(
            "{{style_css}}",
            &format!("/page/style.css?v={:016x}", fnv(STYLE_CSS)),
        )
});

/// FNV-1a of `text` (a cache key, not a security measure).
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `GET /`: the page.
pub async fn index() -> Response {
    asset(INDEX.as_str(), "text/html; charset=utf-8", "no-cache")
}

/// `GET /page/app.js`.
pub async fn app_js() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8", CACHED)
}

/// `GET /page/style.css`.
pub async fn style_css() -> Response {
    asset(STYLE_CSS, "text/css; charset=utf-8", CACHED)
}

const CACHED: &str = "public, max-age=86400, immutable";

fn asset(body: &'static str, content_type: &'static str, cache: &'static str) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// `GET /api/v1/page[?events_since=<RFC 3339 time>]`: events at or after that time
/// (the page holds everything before it and replaces those of that very time); without
/// it, those of the last [`TIMELINE_SPAN`].
pub async fn page(State(st): State<ApiState>, uri: Uri) -> Response {
    let now = SystemTime::now();
    let since = match events_since_param(uri.query()) {
        Ok(Some(since)) => since,
        Ok(None) => rfc3339(now.checked_sub(TIMELINE_SPAN).unwrap_or(now)),
        Err(why) => return super::limits::refuse(StatusCode::BAD_REQUEST, why),
    };
    let snap = st.snapshot.get().await;
    let events: Vec<Event> = {
        let log = st.events.lock().await;
        events_since(log.iter(), &since)
    };
    Json(view(&snap, events, now)).into_response()
}

/// The `events_since` of a query string, checked to be an RFC 3339 time.
pub fn events_since_param(query: Option<&str>) -> Result<Option<String>, String> {
    let mut since = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "events_since" {
            return Err("the only query parameter is events_since=<RFC 3339 time>".into());
        }
        let value = percent_decode(value)
            .filter(|v| humantime::parse_rfc3339(v).is_ok())
            .ok_or_else(|| {
                format!(
                    "events_since must be an RFC 3339 UTC time such as 2026-01-01T12:00:00.000Z (got {:?})",
                    value.chars().take(64).collect::<String>()
                )
            })?;
        since = Some(value);
    }
    Ok(since)
}

/// `%XX` escapes of a query value (an RFC 3339 time needs no more); `None` if malformed.
fn percent_decode(text: &str) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// The events of `log` (oldest first) at or after `since`. Times are fixed-width
/// RFC 3339 UTC strings, so they order as text.
pub fn events_since<'a>(log: impl Iterator<Item = &'a Event>, since: &str) -> Vec<Event> {
    log.filter(|e| e.time.as_str() >= since).cloned().collect()
}

/// What the page shows, as of one moment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PageView {
    /// When this answer was made (RFC 3339 UTC); rates are deltas over these.
    pub time: String,
    pub interface: String,
    pub xdp_mode: String,
    pub services: Vec<ServiceView>,
    /// Global data-plane counters by name.
    pub counters: Vec<(String, u64)>,
    pub passive_events: Vec<(String, u64)>,
    pub transitions: u64,
    pub propagation: Histogram,
    /// Events at or after the asked time, oldest first.
    pub events: Vec<Event>,
    /// With `[cluster]`: this node, its peers and the sync's counters.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cluster: Option<crate::cluster::ClusterStatus>,
}

/// One service on the page.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServiceView {
    pub name: String,
    /// Slots of its Maglev table (0 before the first publish).
    pub maglev_size: u32,
    pub vip: String,
    pub protocol: String,
    pub forwarding: String,
    pub main_weight: u32,
    pub active_weight: u32,
    pub spare_num: usize,
    pub active_backup_level: u32,
    pub fail_open: bool,
    pub stats: Stats,
    pub servers: Vec<ServerView>,
}

/// One server on the page.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerView {
    pub address: String,
    pub state: String,
    /// `primary`, `spare running`, `spare idle`, `backup N`, `drained`, `down`.
    pub role: String,
    /// Configured (or runtime-set) weight.
    pub weight: u32,
    /// The weight it takes new flows with now: its weight while it holds Maglev slots,
    /// else 0.
    pub effective_weight: u32,
    /// Share of the live Maglev table, 0..=1.
    pub share: f64,
    pub active: bool,
    pub mac: Option<String>,
    pub stats: Stats,
    /// Flows pinned to it that are still open, as last counted (`None` before the
    /// first count): `lb_server_active_flows`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub active_flows: Option<u64>,
    /// Failures counted (probes and passive).
    pub fails: u64,
    pub downstart: Option<String>,
    pub probes: Vec<ProbeView>,
    pub differs_from_config: Vec<String>,
}

/// The last result of one probe of a server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeView {
    pub name: String,
    /// `passed`, `failed`, `none`.
    pub result: String,
    /// Why it failed (empty otherwise).
    pub detail: String,
    /// Consecutive failures now.
    pub fails: u64,
    pub last: Option<String>,
    pub duration_ms: f64,
}

/// The page's view of `snap` with `events`, made at `now`.
pub fn view(snap: &Snapshot, events: Vec<Event>, now: SystemTime) -> PageView {
    PageView {
        time: rfc3339(now),
        interface: snap.interface.clone(),
        xdp_mode: snap.xdp_mode.clone(),
        services: snap.services.iter().map(service_view).collect(),
        counters: snap.counters.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        passive_events: snap
            .passive_events
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        transitions: snap.transitions,
        propagation: snap.propagation.clone(),
        events,
        cluster: snap.cluster.clone(),
    }
}

fn service_view(svc: &ServiceStatus) -> ServiceView {
    ServiceView {
        name: svc.name.clone(),
        maglev_size: svc.maglev_size,
        vip: svc.vip.clone(),
        protocol: svc.protocol.clone(),
        forwarding: svc.forwarding.clone(),
        main_weight: svc.main_weight,
        active_weight: svc.active_weight,
        spare_num: svc.spare_num,
        active_backup_level: svc.active_backup_level,
        fail_open: svc.fail_open,
        stats: svc.stats,
        servers: svc
            .servers
            .iter()
            .map(|s| server_view(s, svc.maglev_size))
            .collect(),
    }
}

/// `s` of a service whose Maglev table has `table_size` slots.
fn server_view(s: &ServerStatus, table_size: u32) -> ServerView {
    ServerView {
        address: s.address.clone(),
        state: s.state.clone(),
        role: role(s),
        weight: s.weight,
        effective_weight: if s.slots > 0 { s.weight } else { 0 },
        share: if table_size == 0 {
            0.0
        } else {
            f64::from(s.slots) / f64::from(table_size)
        },
        active: s.active,
        mac: s.mac.clone(),
        stats: s.stats,
        active_flows: s.active_flows,
        fails: s.health.fails,
        downstart: s.health.downstart.clone(),
        probes: s
            .health
            .probes
            .iter()
            .map(|(name, p)| {
                let (result, detail) = match p.last_result.split_once(": ") {
                    Some((r, d)) => (r.to_string(), d.to_string()),
                    None => (p.last_result.clone(), String::new()),
                };
                ProbeView {
                    name: name.clone(),
                    result,
                    detail,
                    fails: p.fails,
                    last: p.last.clone(),
                    duration_ms: p.last_duration_ms,
                }
            })
            .collect(),
        differs_from_config: s.differs_from_config.clone(),
    }
}

/// The server's place in its service: admin states first (`down`, `drained`), then its
/// group: a backup level, a spare (running or idle) or a primary.
pub fn role(s: &ServerStatus) -> String {
    match s.state.as_str() {
        "down" => return "down".into(),
        "draining" => return "drained".into(),
        _ => {}
    }
    if s.backup > 0 {
        return format!("backup {}", s.backup);
    }
    match s.spare.as_deref() {
        Some(how) => format!("spare {how}"),
        None => "primary".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{HealthStatus, ProbeStatus};

    fn server(state: &str, spare: Option<&str>, backup: u32) -> ServerStatus {
        ServerStatus {
            address: "10.0.1.1:80".into(),
            weight: 2,
            state: state.into(),
            spare: spare.map(Into::into),
            backup,
            ..Default::default()
        }
    }

    #[test]
    fn roles_put_admin_states_before_the_group() {
        assert_eq!(role(&server("up", None, 0)), "primary");
        assert_eq!(role(&server("unhealthy", None, 0)), "primary");
        assert_eq!(role(&server("up", Some("running"), 0)), "spare running");
        assert_eq!(role(&server("checking", Some("idle"), 0)), "spare idle");
        assert_eq!(role(&server("up", None, 2)), "backup 2");
        assert_eq!(role(&server("draining", Some("idle"), 0)), "drained");
        assert_eq!(role(&server("down", None, 1)), "down");
    }

    #[test]
    fn effective_weight_and_share_come_from_the_slots() {
        let mut s = server("up", None, 0);
        s.slots = 16411 / 4;
        let v = server_view(&s, 16411);
        assert_eq!(v.effective_weight, 2);
        assert!((v.share - 0.25).abs() < 1e-4, "{}", v.share);
        s.slots = 0;
        let v = server_view(&s, 4099);
        assert_eq!((v.effective_weight, v.share), (0, 0.0));
    }

    #[test]
    fn probe_results_split_into_result_and_detail() {
        let mut s = server("unhealthy", None, 0);
        s.health = HealthStatus {
            probes: [
                (
                    "h".to_string(),
                    ProbeStatus {
                        fails: 2,
                        last_result: "failed: connection refused".into(),
                        ..Default::default()
                    },
                ),
                (
                    "t".to_string(),
                    ProbeStatus {
                        last_result: "passed".into(),
                        ..Default::default()
                    },
                ),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        let v = server_view(&s, 4099);
        assert_eq!(
            (v.probes[0].name.as_str(), v.probes[0].result.as_str()),
            ("h", "failed")
        );
        assert_eq!(v.probes[0].detail, "connection refused");
        assert_eq!(v.probes[0].fails, 2);
        assert_eq!(
            (v.probes[1].result.as_str(), v.probes[1].detail.as_str()),
            ("passed", "")
        );
    }

    fn event(time: &str) -> Event {
        Event {
            time: time.into(),
            ..Default::default()
        }
    }

    #[test]
    fn events_since_keeps_that_time_and_later() {
        let log = [
            event("2026-12-01T12:00:00.000Z"),
            event("2026-12-01T12:00:01.500Z"),
            event("2026-12-01T12:00:01.500Z"),
            event("2026-12-01T13:00:00.000Z"),
        ];
        let got = events_since(log.iter(), "2026-12-01T12:00:01.500Z");
        assert_eq!(got, log[1..].to_vec());
        assert!(events_since(log.iter(), "2026-12-01T13:00:00.001Z").is_empty());
        assert_eq!(
            events_since(log.iter(), "2026-12-01T11:00:00.000Z").len(),
            4
        );
    }

    #[test]
    fn view_carries_counters_and_services() {
        let mut snap = Snapshot::default();
        snap.counters.insert("drop_nat_ports".into(), 7);
        snap.services.push(ServiceStatus {
            name: "web".into(),
            servers: vec![server("up", None, 0).into()],
            ..Default::default()
        });
        let v = view(
            &snap,
            vec![event("2026-12-01T12:00:00.000Z")],
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(v.time, "1970-01-01T00:00:00.000Z");
        assert_eq!(v.counters, vec![("drop_nat_ports".to_string(), 7)]);
        assert_eq!(v.services[0].servers[0].role, "primary");
        assert_eq!(v.events.len(), 1);
    }

    #[test]
    fn events_since_param_is_checked() {
        assert_eq!(events_since_param(None), Ok(None));
        assert_eq!(events_since_param(Some("")), Ok(None));
        assert_eq!(
            events_since_param(Some("events_since=2026-12-01T12%3A00%3A01.500Z")),
            Ok(Some("2026-12-01T12:00:01.500Z".into()))
        );
        assert_eq!(
            events_since_param(Some("events_since=2026-12-01T12:00:01.500Z")),
            Ok(Some("2026-12-01T12:00:01.500Z".into()))
        );
        for bad in [
            "events_since=yesterday",
            "events_since=%ZZ",
            "events_since=",
            "since=2026-12-01T12:00:01.500Z",
        ] {
            assert!(events_since_param(Some(bad)).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn index_points_at_versioned_assets() {
        assert!(INDEX.contains("/page/app.js?v="), "{}", *INDEX);
        assert!(INDEX.contains("/page/style.css?v="));
        assert!(!INDEX.contains("{{"));
    }
}
