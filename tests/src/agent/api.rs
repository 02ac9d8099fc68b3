//! The agent's operator surface as the scenarios see it: its REST API (DESIGN.md §9) over
//! plain HTTP/1.1 from inside the lb namespace, typed views of a service and its
//! servers, `/metrics` values, the event log, waits for a condition on a service, and
//! `lb-agent server …` / `lb-agent status` run as the operator would.

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{
    net::netns::NetNs,
    util::{
        error::Error,
        json::{Json, JsonError},
    },
};

/// Connect, read and write timeout of one API request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read.
const MAX_ANSWER: u64 = 16 << 20;
/// Pause between two looks at the API while waiting for a condition.
pub const POLL_EVERY: Duration = Duration::from_millis(20);

/// Why an API request or a wait failed: the agent's answer (which callers match on), or
/// a failure of the harness on the way to it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The namespace, the connection, a command or a wait failed.
    #[error(transparent)]
    Harness(#[from] Error),
    #[error("{method} {path}: the agent answered {status}: {body}")]
    Status {
        method: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("{path}: {source}")]
    Json {
        path: String,
        #[source]
        source: JsonError,
    },
    #[error("{path}: the answer has no {what}: {body}")]
    Shape {
        path: String,
        what: String,
        body: String,
    },
}

/// One server as `GET /api/v1/services/{name}` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerView {
    pub address: SocketAddr,
    pub weight: u64,
    /// `up`, `checking`, `unhealthy`, `unavailable`, `draining`, `down`.
    pub state: String,
    /// `idle` / `running` for spares, `None` for other servers.
    pub spare: Option<String>,
    /// Backup level, 0 = primary group.
    pub backup: u64,
    /// In the Maglev table.
    pub active: bool,
    /// New flows the data plane counted for it.
    pub flows: u64,
}

/// One service as `GET /api/v1/services/{name}` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceView {
    pub name: String,
    pub main_weight: u64,
    pub active_weight: u64,
    pub spare_num: u64,
    pub active_backup_level: u64,
    pub fail_open: bool,
    pub servers: Vec<ServerView>,
}

impl ServiceView {
    /// The server at `addr`, if the service has it.
    pub fn server(&self, addr: SocketAddr) -> Option<&ServerView> {
        self.servers.iter().find(|s| s.address == addr)
    }

    /// One line for the service, one per server, with names from `name_of`.
    pub fn describe(&self, name_of: impl Fn(SocketAddr) -> String) -> String {
        let mut out = format!(
            "  service {}: main_weight {}, active_weight {}, spare_num {}, active_backup_level {}, fail_open {}\n",
            self.name,
            self.main_weight,
            self.active_weight,
            self.spare_num,
            self.active_backup_level,
            self.fail_open
        );
        for s in &self.servers {
            out.push_str(&format!(
                "    {:<4} {:<20} weight {} {:<11} {:<13} {:<8} active {:<3}\n",
                name_of(s.address),
                s.address.to_string(),
                s.weight,
                format!("backup {}", s.backup),
                format!("spare {}", s.spare.as_deref().unwrap_or("-")),
                s.state,
                if s.active { "yes" } else { "no" },
            ));
        }
        out
    }

    fn from_json(v: &Json) -> Option<ServiceView> {
        let num = |v: &Json, k: &str| v.get(k).and_then(Json::as_u64);
        let servers = v
            .get("servers")?
            .as_array()?
            .iter()
            .map(|s| {
                Some(ServerView {
                    address: s.get("address")?.as_str()?.parse().ok()?,
                    weight: num(s, "weight")?,
                    state: s.get("state")?.as_str()?.to_owned(),
                    spare: s.get("spare").and_then(Json::as_str).map(str::to_owned),
                    backup: num(s, "backup")?,
                    active: s.get("active")?.as_bool()?,
                    flows: s.get("stats").and_then(|st| num(st, "flows")).unwrap_or(0),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(ServiceView {
            name: v.get("name")?.as_str()?.to_owned(),
            main_weight: num(v, "main_weight")?,
            active_weight: num(v, "active_weight")?,
            spare_num: num(v, "spare_num")?,
            active_backup_level: num(v, "active_backup_level")?,
            fail_open: v.get("fail_open")?.as_bool()?,
            servers,
        })
    }
}

/// One entry of `GET /api/v1/events`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventView {
    /// RFC 3339 UTC with milliseconds.
    pub time: String,
    pub service: String,
    /// `-` for membership notes (spares, levels, cap, fail-open).
    pub server: String,
    pub from: String,
    pub to: String,
    pub cause: String,
}

impl EventView {
    /// Seconds since the Unix epoch of [`time`](Self::time).
    pub fn unix_seconds(&self) -> Option<f64> {
        rfc3339_seconds(&self.time)
    }
}

/// The agent's API at `addr` inside namespace `ns`.
#[derive(Clone, Debug)]
pub struct Api {
    ns: NetNs,
    addr: SocketAddr,
}

impl Api {
    /// The API the harness's agents listen on ([`crate::agent::daemon::API_LISTEN`]) in `ns`.
    pub fn new(ns: &NetNs) -> Api {
        Api::at(
            ns,
            crate::agent::daemon::API_LISTEN
                .parse()
                .expect("API_LISTEN"),
        )
    }

    pub fn at(ns: &NetNs, addr: SocketAddr) -> Api {
        Api {
            ns: ns.clone(),
            addr,
        }
    }

    /// `http://ADDR`, for `lb-agent … --api`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One request; the answer's status and body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, String), ApiError> {
        let addr = self.addr;
        let io = |what: &str| {
            let what = format!("{method} {path}: {what}");
            move |source| -> ApiError {
                Error::Io {
                    what: format!("{what} (agent API at {addr})"),
                    source,
                }
                .into()
            }
        };
        let raw = self.ns.run(|| -> Result<Vec<u8>, ApiError> {
            let mut stream =
                TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT).map_err(io("connect"))?;
            stream
                .set_read_timeout(Some(REQUEST_TIMEOUT))
                .and_then(|()| stream.set_write_timeout(Some(REQUEST_TIMEOUT)))
                .map_err(io("socket options"))?;
            let body = body.unwrap_or("");
            // Changes over TCP need the harness agents' bearer token.
            let head = format!(
                "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
                 Authorization: Bearer {}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                crate::agent::daemon::API_TOKEN,
                body.len()
            );
            stream
                .write_all(head.as_bytes())
                .and_then(|()| stream.write_all(body.as_bytes()))
                .map_err(io("sending"))?;
            let mut raw = Vec::new();
            stream
                .take(MAX_ANSWER)
                .read_to_end(&mut raw)
                .map_err(io("reading the answer"))?;
            Ok(raw)
        })??;
        parse_response(&raw).map_err(|what| {
            Error::Io {
                what: format!("{method} {path}: {what} (agent API at {addr})"),
                source: io::Error::new(io::ErrorKind::InvalidData, "malformed HTTP answer"),
            }
            .into()
        })
    }

    /// Like [`request`](Self::request), failing on a status outside 2xx.
    pub fn request_ok(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<String, ApiError> {
        let (status, text) = self.request(method, path, body)?;
        if !(200..300).contains(&status) {
            return Err(ApiError::Status {
                method: method.to_owned(),
                path: path.to_owned(),
                status,
                body: text,
            });
        }
        Ok(text)
    }

    fn get_json(&self, path: &str) -> Result<(Json, String), ApiError> {
        let text = self.request_ok("GET", path, None)?;
        let v = Json::parse(&text).map_err(|source| ApiError::Json {
            path: path.to_owned(),
            source,
        })?;
        Ok((v, text))
    }

    /// `GET /api/v1/services/{name}`.
    pub fn service(&self, name: &str) -> Result<ServiceView, ApiError> {
        let path = format!("/api/v1/services/{name}");
        let (v, text) = self.get_json(&path)?;
        ServiceView::from_json(&v).ok_or_else(|| ApiError::Shape {
            path,
            what: "service fields (main_weight, servers[].state, …)".into(),
            body: text,
        })
    }

    /// `GET /api/v1/events`.
    pub fn events(&self) -> Result<Vec<EventView>, ApiError> {
        let path = "/api/v1/events";
        let (v, text) = self.get_json(path)?;
        let shape = || ApiError::Shape {
            path: path.to_owned(),
            what: "array of events".into(),
            body: text.clone(),
        };
        v.as_array()
            .ok_or_else(shape)?
            .iter()
            .map(|e| {
                let f = |k: &str| e.get(k).and_then(Json::as_str).map(str::to_owned);
                Some(EventView {
                    time: f("time")?,
                    service: f("service")?,
                    server: f("server")?,
                    from: f("from")?,
                    to: f("to")?,
                    cause: f("cause")?,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(shape)
    }

    /// `GET /metrics`, as text.
    pub fn metrics(&self) -> Result<String, ApiError> {
        self.request_ok("GET", "/metrics", None)
    }

    /// `PATCH /api/v1/services/{service}/servers/{addr}` with a JSON body.
    pub fn patch_server(
        &self,
        service: &str,
        addr: SocketAddr,
        body: &str,
    ) -> Result<(), ApiError> {
        let path = format!("/api/v1/services/{service}/servers/{addr}");
        self.request_ok("PATCH", &path, Some(body)).map(drop)
    }

    /// Looks at service `name` every [`POLL_EVERY`] until `cond` holds; returns what was
    /// seen then and how long it took. `what` says in errors what was waited for.
    pub fn wait_service(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&ServiceView) -> bool,
    ) -> Result<(ServiceView, Duration), ApiError> {
        let start = Instant::now();
        let mut last;
        loop {
            match self.service(name) {
                Ok(view) if cond(&view) => return Ok((view, start.elapsed())),
                Ok(view) => last = view.describe(|a| a.to_string()),
                Err(err) => last = err.to_string(),
            }
            if crate::util::interrupt::requested() {
                return Err(Error::Interrupted {
                    what: what.to_owned(),
                }
                .into());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::Timeout {
                    what: what.to_owned(),
                    waited,
                    last,
                }
                .into());
            }
            thread::sleep(POLL_EVERY);
        }
    }
}

/// The value of the Prometheus sample `name{labels…}` in `text` (every label in `labels`
/// must match; others may be present).
/// The data plane's counter `counter` (its `lb_common::counters::NAMES` name, e.g.
/// `tx_nat_forward`, `drop_no_backend`) in a `/metrics` text, read from the family
/// that shows it (`lb_packets_forwarded_total{reason="nat_forward"}`, …); `rx`, every
/// packet, is the sum of the three packet families.
pub fn counter(text: &str, counter: &str) -> Option<f64> {
    let families = lb_agent::api::families::FAMILIES;
    if counter == "rx" {
        return families
            .iter()
            .filter(|f| f.name.starts_with("lb_packets_"))
            .flat_map(|f| f.members.iter().map(move |(_, v)| (f, *v)))
            .map(|(f, v)| metric(text, f.name, &[(f.label, v)]))
            .sum();
    }
    families.iter().find_map(|f| {
        let (_, value) = f.members.iter().find(|(c, _)| *c == counter)?;
        if f.label.is_empty() {
            metric(text, f.name, &[])
        } else {
            metric(text, f.name, &[(f.label, value)])
        }
    })
}

pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (label_text, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (l, v) = r.split_once('}')?;
                    (l, v)
                }
                None if rest.starts_with(' ') => ("", rest),
                None => return None,
            };
            let have: Vec<(&str, &str)> = label_text
                .split(',')
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.trim(), v.trim().trim_matches('"')))
                })
                .collect();
            if !labels.iter().all(|want| have.contains(want)) {
                return None;
            }
            value.split_whitespace().next()?.parse().ok()
        })
}

/// Runs `program args…` inside `ns` (`ip netns exec`) to completion, at most `timeout`;
/// returns stdout. For `lb-agent server …` and `lb-agent status`.
pub fn cli(
    ns: &NetNs,
    program: &Path,
    args: &[&str],
    timeout: Duration,
) -> Result<String, ApiError> {
    let cmd = format!("{} {}", program.display(), args.join(" "));
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(program)
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    // Outputs are a few lines: they fit the pipes, so waiting before reading is safe.
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Timeout {
                    what: format!("`{cmd}` to finish"),
                    waited: timeout,
                    last: String::new(),
                }
                .into());
            }
            Err(source) => return Err(Error::Spawn { cmd, source }.into()),
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    if !status.success() {
        return Err(Error::Command {
            cmd,
            status: status.to_string(),
            output: format!("{}{}", out, err).trim().to_owned(),
        }
        .into());
    }
    Ok(out)
}

/// Splits a raw HTTP/1.1 answer into status and body (Content-Length, chunked, or
/// until close).
fn parse_response(raw: &[u8]) -> Result<(u16, String), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or("no status line")?;
    let mut chunked = false;
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if k == "content-length" {
            let n: usize = v.parse().map_err(|_| "bad Content-Length")?;
            body = body.get(..n).ok_or("body shorter than Content-Length")?;
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("unterminated chunk size")?;
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(data.get(..size).ok_or("chunk shorter than its size")?);
        data = data.get(size + 2..).ok_or("chunk without CRLF")?;
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.fff]Z` as seconds since the Unix epoch.
pub fn rfc3339_seconds(s: &str) -> Option<f64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.splitn(3, ':');
    let (hh, mm) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let ss: f64 = t.next()?.parse().ok()?;
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3600 + mm * 60) as f64 + ss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_view_from_the_api_json() {
        let text = r#"{"name":"web","vip":"10.77.1.200:80","protocol":"tcp","forwarding":"nat",
            "main_weight":3,"active_weight":1,"spare_num":1,"active_backup_level":0,
            "fail_open":false,"stats":{"packets":1,"bytes":2,"flows":3},
            "servers":[{"address":"10.77.1.11:8080","weight":2,"state":"unhealthy","backup":0,
                "active":false,"health":{"fails":1,"downtime":0,"probes":{}},
                "stats":{"packets":0,"bytes":0,"flows":7}},
              {"address":"10.77.1.14:8080","weight":2,"state":"up","spare":"running",
                "backup":0,"active":true,"mac":"02:77:01:00:00:0e",
                "health":{"fails":0,"downtime":0,"probes":{}},
                "stats":{"packets":0,"bytes":0,"flows":0}}]}"#;
        let v = ServiceView::from_json(&Json::parse(text).unwrap()).unwrap();
        assert_eq!((v.main_weight, v.active_weight, v.spare_num), (3, 1, 1));
        let s2 = v.server("10.77.1.14:8080".parse().unwrap()).unwrap();
        assert_eq!(s2.spare.as_deref(), Some("running"));
        assert!(s2.active);
        let p1 = v.server("10.77.1.11:8080".parse().unwrap()).unwrap();
        assert_eq!(
            (p1.state.as_str(), p1.spare.as_deref(), p1.flows),
            ("unhealthy", None, 7)
        );
        assert!(v.describe(|a| a.to_string()).contains("spare running"));
    }

    #[test]
    fn metrics_by_name_and_labels() {
        let text = "# HELP x\n# TYPE lb_service_fail_open gauge\n\
                    lb_service_fail_open{service=\"web\"} 1\n\
                    lb_service_fail_open{service=\"dns\"} 0\n\
                    lb_packets_dropped_total{reason=\"no_backend\"} 17\n\
                    lb_packets_forwarded_total{reason=\"nat_forward\"} 3\n\
                    lb_packets_passed_total{reason=\"not_vip\"} 2\n\
                    lb_transitions_total 4\n";
        assert_eq!(
            metric(text, "lb_service_fail_open", &[("service", "web")]),
            Some(1.0)
        );
        assert_eq!(
            metric(text, "lb_service_fail_open", &[("service", "dns")]),
            Some(0.0)
        );
        assert_eq!(counter(text, "drop_no_backend"), Some(17.0));
        assert_eq!(counter(text, "tx_nat_forward"), Some(3.0));
        assert_eq!(counter(text, "tx_dsr"), None);
        // `rx` needs every reason of the three packet families, as /metrics shows them.
        assert_eq!(counter(text, "rx"), None);
        let every: String = lb_agent::api::families::FAMILIES
            .iter()
            .filter(|f| f.name.starts_with("lb_packets_"))
            .flat_map(|f| {
                f.members
                    .iter()
                    .map(move |(_, v)| format!("{}{{{}=\"{v}\"}} 2\n", f.name, f.label))
            })
            .collect();
        let reasons = every.lines().count() as f64;
        assert_eq!(counter(&every, "rx"), Some(2.0 * reasons));
        assert_eq!(metric(text, "lb_transitions_total", &[]), Some(4.0));
        assert_eq!(metric(text, "lb_transitions", &[]), None);
        assert_eq!(
            metric(text, "lb_service_fail_open", &[("service", "x")]),
            None
        );
    }

    #[test]
    fn http_answers_with_length_or_chunks() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain).unwrap(), (200, "{}".into()));
        let chunked =
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (404, "abcde".into()));
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn rfc3339_differences() {
        let a = rfc3339_seconds("2024-02-29T23:59:59.500Z").unwrap();
        let b = rfc3339_seconds("2024-03-01T00:00:02.750Z").unwrap();
        assert!((b - a - 3.25).abs() < 1e-6, "{}", b - a);
        assert_eq!(rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(rfc3339_seconds("2024-01-01 00:00:00"), None);
    }
}
