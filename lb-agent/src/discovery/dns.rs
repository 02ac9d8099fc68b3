//! The DNS side of discovery: one hickory resolver (the configured server, or the system's
//! `/etc/resolv.conf`) and the two questions discovery asks — SRV with the targets'
//! addresses, and a name's A or AAAA records.

use std::{collections::BTreeSet, net::IpAddr, net::SocketAddr, sync::Arc, time::Duration};

use hickory_resolver::{
    TokioResolver,
    config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts},
    lookup::Lookup,
    net::{NetError, runtime::TokioRuntimeProvider},
    proto::rr::{Name, RData, RecordType},
};
use tokio::task::JoinSet;

/// What discovery asks DNS for one `resolve = true` server entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Question {
    /// Absolute name asked: `_http._tcp.backends.example.` for SRV, else the host.
    pub name: String,
    /// SRV (then each target's addresses) rather than the name's own addresses.
    pub srv: bool,
    /// AAAA rather than A: the VIP's family.
    pub v6: bool,
}

impl Question {
    fn family(&self) -> RecordType {
        if self.v6 {
            RecordType::AAAA
        } else {
            RecordType::A
        }
    }
}

impl std::fmt::Display for Question {
    /// `_http._tcp.backends.example. SRV (A)` or `backends.example. AAAA`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.srv {
            write!(f, "{} SRV ({})", self.name, self.family())
        } else {
            write!(f, "{} {}", self.name, self.family())
        }
    }
}

/// One address an answer gave.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    pub ip: IpAddr,
    /// The SRV record that named it; `None` for a plain A/AAAA question.
    pub srv: Option<SrvFields>,
}

/// The fields of an SRV record (RFC 2782) that decide a backend's port, level and weight.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SrvFields {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    /// Target host name, for logs and status.
    pub target: String,
}

/// A successful answer to a [`Question`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Sorted and without duplicates, so that two answers compare equal when they say the
    /// same thing in another order.
    pub targets: Vec<Target>,
    /// The smallest TTL among the records used (SRV and address records), unclamped.
    pub ttl: Duration,
}

/// Why a lookup gave no answer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum DnsError {
    #[error("cannot read the system resolver configuration (/etc/resolv.conf): {source}")]
    SystemConfig {
        #[source]
        source: NetError,
    },
    #[error("cannot build the resolver: {source}")]
    Build {
        #[source]
        source: NetError,
    },
    #[error("`{name}` is not a DNS name: {reason}")]
    BadName { name: String, reason: String },
    #[error("{name} {rtype}: no records (NXDOMAIN or an empty answer)")]
    NoRecords { name: String, rtype: RecordType },
    #[error("lookup task failed: {reason}")]
    Task { reason: String },
    #[error("{name} {rtype}: {source}")]
    Lookup {
        name: String,
        rtype: RecordType,
        #[source]
        source: NetError,
    },
}

/// Query timing of the resolver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryOptions {
    /// How long one try waits for a reply.
    pub timeout: Duration,
    /// Tries per query (per server).
    pub attempts: usize,
}

/// A resolver for discovery; cheap to clone (lookups run in background tasks with a clone).
#[derive(Clone)]
pub struct Resolver {
    inner: Arc<TokioResolver>,
}

impl Resolver {
    /// Asks `server` when given (UDP, TCP for truncated replies), else the servers of
    /// `/etc/resolv.conf`. The resolver's own cache is off: discovery keeps the answers
    /// and decides when to ask again.
    pub fn new(server: Option<SocketAddr>, q: QueryOptions) -> Result<Self, DnsError> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = match server {
            Some(addr) => {
                let mut udp = ConnectionConfig::udp();
                udp.port = addr.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = addr.port();
                let ns = NameServerConfig::new(addr.ip(), true, vec![udp, tcp]);
                let mut b = TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, Vec::new(), vec![ns]),
                    provider,
                );
                b.options_mut().use_hosts_file = ResolveHosts::Never;
                b
            }
            None => TokioResolver::builder(provider)
                .map_err(|source| DnsError::SystemConfig { source })?,
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.timeout = q.timeout;
        opts.attempts = q.attempts;
        opts.cache_size = 0;
        let inner = builder
            .build()
            .map_err(|source| DnsError::Build { source })?;
        Ok(Resolver {
            inner: Arc::new(inner),
        })
    }

    /// Asks `q`: an SRV question resolves every target (concurrently) to the VIP's family.
    /// A target without addresses is left out; any other failure fails the whole answer,
    /// so that a half-answered question never replaces a complete one.
    pub async fn ask(&self, q: &Question) -> Result<Answer, DnsError> {
        if !q.srv {
            let (ips, ttl) = self.addresses(&q.name, q.family()).await?;
            let targets = ips.into_iter().map(|ip| Target { ip, srv: None });
            return Ok(answer(targets, ttl));
        }
        let lookup = self.lookup(&q.name, RecordType::SRV).await?;
        let mut ttl = min_ttl(&lookup);
        let srvs: Vec<SrvFields> = lookup
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::SRV(srv) if !srv.target.is_root() => Some(SrvFields {
                    priority: srv.priority,
                    weight: srv.weight,
                    port: srv.port,
                    target: srv.target.to_ascii(),
                }),
                _ => None,
            })
            .collect();
        let hosts: BTreeSet<String> = srvs.iter().map(|s| s.target.clone()).collect();
        let mut jobs = JoinSet::new();
        for host in hosts {
            let me = self.clone();
            let rtype = q.family();
            jobs.spawn(async move {
                let r = me.addresses(&host, rtype).await;
                (host, r)
            });
        }
        let mut targets = Vec::new();
        while let Some(done) = jobs.join_next().await {
            let (host, result) = done.expect("address lookups do not panic");
            let ips = match result {
                Ok((ips, t)) => {
                    ttl = ttl.min(t);
                    ips
                }
                Err(DnsError::NoRecords { .. }) => Vec::new(),
                Err(e) => return Err(e),
            };
            for s in srvs.iter().filter(|s| s.target == host) {
                targets.extend(ips.iter().map(|&ip| Target {
                    ip,
                    srv: Some(s.clone()),
                }));
            }
        }
        Ok(answer(targets, ttl))
    }

    /// A name's addresses of one family and their smallest TTL.
    async fn addresses(
        &self,
        name: &str,
        rtype: RecordType,
    ) -> Result<(Vec<IpAddr>, Duration), DnsError> {
        let lookup = self.lookup(name, rtype).await?;
        let ips: Vec<IpAddr> = lookup
            .answers()
            .iter()
            .filter(|r| r.record_type() == rtype)
            .filter_map(|r| r.data.ip_addr())
            .collect();
        if ips.is_empty() {
            return Err(DnsError::NoRecords {
                name: name.to_string(),
                rtype,
            });
        }
        Ok((ips, min_ttl(&lookup)))
    }

    async fn lookup(&self, name: &str, rtype: RecordType) -> Result<Lookup, DnsError> {
        let fqdn = Name::from_ascii(name).map_err(|e| DnsError::BadName {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        self.inner
            .lookup(fqdn, rtype)
            .await
            .map_err(|source| match source {
                e if e.is_no_records_found() || e.is_nx_domain() => DnsError::NoRecords {
                    name: name.to_string(),
                    rtype,
                },
                source => DnsError::Lookup {
                    name: name.to_string(),
                    rtype,
                    source,
                },
            })
    }
}

/// `name` made absolute (trailing dot), so that no search domain is tried.
pub fn absolute(name: &str) -> String {
    if name.ends_with('.') {
        name.to_string()
    } else {
        format!("{name}.")
    }
}

fn min_ttl(lookup: &Lookup) -> Duration {
    let secs = lookup.answers().iter().map(|r| r.ttl).min().unwrap_or(0);
    Duration::from_secs(u64::from(secs))
}

fn answer(targets: impl IntoIterator<Item = Target>, ttl: Duration) -> Answer {
    let mut targets: Vec<Target> = targets.into_iter().collect();
    targets.sort();
    targets.dedup();
    Answer { targets, ttl }
}
