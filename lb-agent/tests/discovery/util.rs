//! An in-process authoritative DNS server for the discovery tests: hickory-server on
//! 127.0.0.1 port 0, serving records the test sets (and changes) while it runs, with
//! failure modes switched on and off (NXDOMAIN, SERVFAIL, silence). Helpers build configs
//! whose `agent.resolver` points at it.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    str::FromStr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use hickory_proto::{
    op::{Header, HeaderCounts, Metadata, ResponseCode},
    rr::{
        LowerName, Name, RData, Record,
        rdata::{A, AAAA, SRV},
    },
};
use hickory_server::{
    Server,
    net::runtime::Time,
    server::{Request, RequestHandler, ResponseHandler, ResponseInfo},
    zone_handler::MessageResponseBuilder,
};
use lb_agent::{
    config::{self, Config},
    discovery::{Options, QueryOptions},
};
use tokio::net::UdpSocket;

/// How the server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// From the records set (NXDOMAIN for a name it has no record of).
    Answer,
    /// NXDOMAIN for every name.
    NxDomain,
    /// SERVFAIL for every question.
    ServFail,
    /// No reply at all: the resolver times out.
    Silent,
}

struct Zone {
    records: Mutex<Vec<Record>>,
    mode: Mutex<Mode>,
    queries: AtomicUsize,
}

struct Handler(Arc<Zone>);

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        self.0.queries.fetch_add(1, Ordering::SeqCst);
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = true;
        let not_sent = |metadata| {
            ResponseInfo::from(Header {
                metadata,
                counts: HeaderCounts::default(),
            })
        };
        let Some(query) = request.queries.queries().first() else {
            return not_sent(metadata);
        };
        let mode = *self.0.mode.lock().unwrap();
        let answers: Vec<Record> = match mode {
            Mode::Silent => return not_sent(metadata),
            Mode::NxDomain => {
                metadata.response_code = ResponseCode::NXDomain;
                Vec::new()
            }
            Mode::ServFail => {
                metadata.response_code = ResponseCode::ServFail;
                Vec::new()
            }
            Mode::Answer => {
                let records = self.0.records.lock().unwrap();
                let named: Vec<&Record> = records
                    .iter()
                    .filter(|r| LowerName::from(&r.name) == *query.name())
                    .collect();
                if named.is_empty() {
                    metadata.response_code = ResponseCode::NXDomain;
                }
                named
                    .into_iter()
                    .filter(|r| r.record_type() == query.query_type())
                    .cloned()
                    .collect()
            }
        };
        let response = MessageResponseBuilder::new(&request.queries, None).build(
            metadata,
            answers.iter(),
            [],
            [],
            [],
        );
        match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(_) => not_sent(metadata),
        }
    }
}

/// The server; stops when dropped.
pub struct TestDns {
    pub addr: SocketAddr,
    zone: Arc<Zone>,
    _server: Server<Handler>,
}

impl TestDns {
    /// Serves `records` on 127.0.0.1, a free port.
    pub async fn start(records: Vec<Record>) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("binding a UDP socket on 127.0.0.1");
        let addr = socket.local_addr().expect("a bound socket has an address");
        let zone = Arc::new(Zone {
            records: Mutex::new(records),
            mode: Mutex::new(Mode::Answer),
            queries: AtomicUsize::new(0),
        });
        let mut server = Server::new(Handler(zone.clone()));
        server.register_socket(socket);
        TestDns {
            addr,
            zone,
            _server: server,
        }
    }

    /// Replaces every record.
    pub fn set(&self, records: Vec<Record>) {
        *self.zone.records.lock().unwrap() = records;
    }

    pub fn mode(&self, mode: Mode) {
        *self.zone.mode.lock().unwrap() = mode;
    }

    /// Questions received so far.
    pub fn queries(&self) -> usize {
        self.zone.queries.load(Ordering::SeqCst)
    }
}

fn name(s: &str) -> Name {
    Name::from_str(s).unwrap_or_else(|e| panic!("`{s}` is not a DNS name: {e}"))
}

/// `name TTL IN SRV priority weight port target`.
pub fn srv(owner: &str, ttl: u32, priority: u16, weight: u16, port: u16, target: &str) -> Record {
    Record::from_rdata(
        name(owner),
        ttl,
        RData::SRV(SRV::new(priority, weight, port, name(target))),
    )
}

/// `name TTL IN A ip` or `AAAA` by the address's family.
pub fn addr(owner: &str, ttl: u32, ip: &str) -> Record {
    let ip: IpAddr = ip.parse().unwrap_or_else(|_| panic!("`{ip}` is not an IP"));
    let data = match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    };
    Record::from_rdata(name(owner), ttl, data)
}

/// Parses config text; panics with the error.
pub fn parse(text: &str) -> Config {
    config::parse(text, Path::new("discovery-test.toml"))
        .unwrap_or_else(|e| panic!("test config must parse: {e}\n--- text ---\n{text}"))
}

/// `[agent]` with `resolver` = `dns`, then one `web` service on `vip` with `servers`
/// (`[[service.server]]` tables as text). nat through 10.0.0.2 / fd00::2 unless `dsr`.
pub fn config(dns: SocketAddr, vip: &str, dsr: bool, servers: &str) -> Config {
    let v6 = vip.starts_with('[');
    let forwarding = if dsr {
        "forwarding = \"dsr\"".to_string()
    } else if v6 {
        "snat_ip = \"fd00::2\"".to_string()
    } else {
        "snat_ip = \"10.0.0.2\"".to_string()
    };
    parse(&format!(
        "[agent]\nresolver = \"{dns}\"\n\n[[service]]\nname = \"web\"\nvip = \"{vip}\"\n{forwarding}\n\n{servers}"
    ))
}

/// Short timings so that TTL expiry, backoff and timeouts take a fraction of a second.
pub fn quick() -> Options {
    Options {
        min_ttl: Duration::from_millis(200),
        max_ttl: Duration::from_secs(3600),
        min_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_millis(800),
        query: QueryOptions {
            timeout: Duration::from_millis(300),
            attempts: 1,
        },
    }
}
