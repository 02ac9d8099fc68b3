//! DNS discovery of backends: `resolve = true` server entries (SRV or A/AAAA), the
//! answers kept between lookups, and re-resolution when their TTL runs out.
//!
//! # What an entry stands for
//!
//! - `address = "backends.example"`, `service = "_http._tcp"`, `resolve = true`: the SRV
//!   records of `_http._tcp.backends.example`; each target's A (IPv4 VIP) or AAAA (IPv6
//!   VIP) records give backends `address:srv_port`. Level, weight and spare follow
//!   [`rules::expand`]: `backup = "prio"` makes the SRV priority the level; `backup = N`
//!   (0 when absent) is the level of the lowest priority, the next distinct priority is
//!   N + 1, and so on (Angie's "relative" rule); weight = entry `weight` × SRV weight
//!   (0 counts as 1), capped at [`crate::config::MAX_WEIGHT`].
//! - `address = "web.example:8080"`, `resolve = true`: the name's A/AAAA records, each with
//!   the entry's port, level and weight.
//! - Names without `resolve` are looked up once per load through the system resolver
//!   (`getaddrinfo`, so `/etc/hosts` works); IP entries stand for themselves.
//!
//! Names are asked as absolute names (no search domains), to `agent.resolver` when set,
//! else to the servers of `/etc/resolv.conf`.
//!
//! # When to ask again
//!
//! An answer is used for its smallest record TTL clamped to [`Options::min_ttl`],
//! [`Options::max_ttl`] (1 s … 1 h), then asked again in the background. DNS never empties
//! an entry: a lookup that fails — timeout, SERVFAIL, NXDOMAIN, an answer with no usable
//! record — keeps the last good answer and is retried after a backoff (1 s doubling to
//! 30 s). (nginx drops the servers on NXDOMAIN; here health checks remove dead backends,
//! and a zone briefly broken during a deploy does not empty the service.) An entry that
//! never had an answer stands for nothing until a lookup succeeds.
//!
//! # Use
//!
//! [`Discovery::expand`] looks every name of a service up now (load and reload);
//! [`Discovery::ready`] waits until an answer expires or a background lookup is back,
//! [`Discovery::poll`] takes the answers and starts the lookups that are due, and
//! [`Discovery::expand_cached`] gives a service's backends from the answers held.
//! The agent wraps these in `Agent::{resolve_ready, reresolve}`.

mod dns;
pub mod rules;

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    time::Duration,
};

use tokio::{task::JoinSet, time::Instant};
use tracing::{debug, info, warn};

pub use dns::{Answer, DnsError, QueryOptions, Question, Resolver, SrvFields, Target};
pub use rules::{Expanded, Skipped};

use crate::config::{ServerAddress, ServerConfig, ServiceConfig};

/// Timing of discovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Shortest time an answer is used (a smaller TTL, 0 included, counts as this).
    pub min_ttl: Duration,
    /// Longest time an answer is used, whatever its TTL.
    pub max_ttl: Duration,
    /// Wait before the first retry of a failed lookup; doubles per further failure.
    pub min_backoff: Duration,
    /// Longest wait between retries.
    pub max_backoff: Duration,
    /// Timeout and tries of each DNS query.
    pub query: QueryOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(3600),
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            query: QueryOptions {
                timeout: Duration::from_secs(2),
                attempts: 2,
            },
        }
    }
}

/// One question's state.
#[derive(Debug)]
struct Entry {
    /// The last good answer; `None` until one lookup succeeded.
    answer: Option<Answer>,
    /// When to ask again.
    next: Instant,
    /// Consecutive failed lookups (the backoff exponent).
    failures: u32,
    /// Generation of the background lookup running for it, if any; an answer from an
    /// older lookup (overtaken by a reload's own lookup) is dropped.
    in_flight: Option<u64>,
}

/// A background lookup that came back.
type Finished = (Question, u64, Result<Answer, DnsError>);

/// The answers of every resolved name, and the lookups that refresh them.
pub struct Discovery {
    opts: Options,
    /// `agent.resolver` the resolver is (to be) built for.
    server: Option<SocketAddr>,
    /// Built on first use; `None` again when `server` or the options change.
    resolver: Option<Resolver>,
    entries: BTreeMap<Question, Entry>,
    /// Names without `resolve`, as looked up at the last load: (host, port, IPv6?).
    once: HashMap<(String, u16, bool), Vec<SocketAddr>>,
    lookups: JoinSet<Finished>,
    /// What each running lookup asks (to settle it as failed should its task die).
    running: HashMap<tokio::task::Id, (Question, u64)>,
    /// Lookups that came back and wait for [`Discovery::poll`].
    finished: Vec<Finished>,
    generation: u64,
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery::new(Options::default())
    }
}

impl Discovery {
    pub fn new(opts: Options) -> Self {
        Discovery {
            opts,
            server: None,
            resolver: None,
            entries: BTreeMap::new(),
            once: HashMap::new(),
            lookups: JoinSet::new(),
            running: HashMap::new(),
            finished: Vec::new(),
            generation: 0,
        }
    }

    /// Uses `server` (`agent.resolver`; `None`: `/etc/resolv.conf`) from now on.
    pub fn with_resolver(&mut self, server: Option<SocketAddr>) -> &mut Self {
        if self.server != server {
            self.server = server;
            self.resolver = None;
        }
        self
    }

    /// Changes the timing; answers held are kept.
    pub fn set_options(&mut self, opts: Options) {
        if opts.query != self.opts.query {
            self.resolver = None;
        }
        self.opts = opts;
    }

    pub fn options(&self) -> Options {
        self.opts
    }

    /// The backends `svc`'s server entries stand for, every name looked up now
    /// (`resolve = true` ones through DNS, the others through the system resolver). In
    /// entry order; an address already given by an earlier entry keeps that entry's settings.
    pub async fn expand(&mut self, svc: &ServiceConfig) -> Vec<Expanded> {
        for server in &svc.servers {
            if let Some(q) = question(server, svc.vip) {
                self.ask_now(&q).await;
            } else if let ServerAddress::Name { host, port } = &server.address {
                let port = port.unwrap_or(svc.vip.port());
                let addrs = system_lookup(&svc.name, host, port, svc.vip.is_ipv6()).await;
                self.once
                    .insert((host.clone(), port, svc.vip.is_ipv6()), addrs);
            }
        }
        self.expand_held(svc, true)
    }

    /// The backends `svc`'s entries stand for from the answers held (no lookup).
    pub fn expand_cached(&self, svc: &ServiceConfig) -> Vec<Expanded> {
        self.expand_held(svc, false)
    }

    fn expand_held(&self, svc: &ServiceConfig, log: bool) -> Vec<Expanded> {
        let mut out: Vec<Expanded> = Vec::new();
        // First entry wins for an address; a set, not a scan of `out` per entry (that
        // would be quadratic: ~0.15 s per apply of 100,000 servers).
        let mut seen = std::collections::HashSet::new();
        for server in &svc.servers {
            let found: Vec<Expanded> = match (&server.address, question(server, svc.vip)) {
                (_, Some(q)) => match self.entries.get(&q).and_then(|e| e.answer.as_ref()) {
                    Some(answer) => {
                        let (found, skipped) =
                            rules::expand(server, svc.vip, svc.forwarding, answer);
                        if log {
                            for s in skipped {
                                warn!(service = svc.name, question = %q, target = s.target, reason = s.reason, "DNS record skipped");
                            }
                        }
                        found
                    }
                    None => Vec::new(),
                },
                (ServerAddress::Socket(sa), None) => vec![fixed(server, *sa)],
                (ServerAddress::Name { host, port }, None) => {
                    let port = port.unwrap_or(svc.vip.port());
                    self.once
                        .get(&(host.clone(), port, svc.vip.is_ipv6()))
                        .into_iter()
                        .flatten()
                        .map(|&a| fixed(server, a))
                        .collect()
                }
            };
            for e in found {
                if seen.insert(e.addr) {
                    out.push(e);
                }
            }
        }
        out
    }

    /// Forgets answers no entry of `services` asks for any more.
    pub fn retain<'a>(&mut self, services: impl IntoIterator<Item = &'a ServiceConfig>) {
        let mut wanted = std::collections::BTreeSet::new();
        let mut once = std::collections::HashSet::new();
        for svc in services {
            for server in &svc.servers {
                match (question(server, svc.vip), &server.address) {
                    (Some(q), _) => {
                        wanted.insert(q);
                    }
                    (None, ServerAddress::Name { host, port }) => {
                        let port = port.unwrap_or(svc.vip.port());
                        once.insert((host.clone(), port, svc.vip.is_ipv6()));
                    }
                    (None, ServerAddress::Socket(_)) => {}
                }
            }
        }
        self.entries.retain(|q, _| wanted.contains(q));
        self.once.retain(|k, _| once.contains(k));
    }

    /// When the next held answer expires or the next retry is due (lookups running in the
    /// background are not counted: their return is what [`Discovery::ready`] waits for).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter(|e| e.in_flight.is_none())
            .map(|e| e.next)
            .min()
    }

    /// Completes when [`Discovery::poll`] has work: an answer expired, a retry is due, or
    /// a background lookup came back. Cancel-safe (a lookup that came back is kept).
    pub async fn ready(&mut self) {
        if !self.finished.is_empty() {
            return;
        }
        let deadline = self.next_deadline();
        tokio::select! {
            Some(done) = self.lookups.join_next_with_id(), if !self.lookups.is_empty() => {
                match done {
                    Ok((id, f)) => {
                        self.running.remove(&id);
                        self.finished.push(f);
                    }
                    Err(err) => {
                        warn!(error = %err, "DNS lookup task failed");
                        if let Some((q, generation)) = self.running.remove(&err.id()) {
                            let reason = err.to_string();
                            self.finished.push((q, generation, Err(DnsError::Task { reason })));
                        }
                    }
                }
            }
            _ = sleep_until(deadline) => {}
        }
    }

    /// Takes the lookups that came back and starts those that are due, in the background.
    /// Returns whether some answer changed (then [`Discovery::expand_cached`] differs).
    pub fn poll(&mut self, now: Instant) -> bool {
        let mut changed = false;
        for (q, generation, result) in std::mem::take(&mut self.finished) {
            let Some(entry) = self.entries.get_mut(&q) else {
                continue;
            };
            if entry.in_flight != Some(generation) {
                continue;
            }
            entry.in_flight = None;
            changed |= settle(&self.opts, &q, entry, result, now);
        }
        let due: Vec<Question> = self
            .entries
            .iter()
            .filter(|(_, e)| e.in_flight.is_none() && e.next <= now)
            .map(|(q, _)| q.clone())
            .collect();
        for q in due {
            let resolver = match self.resolver() {
                Ok(r) => r,
                Err(err) => {
                    let entry = self.entries.get_mut(&q).expect("due entries exist");
                    settle(&self.opts, &q, entry, Err(err), now);
                    continue;
                }
            };
            self.generation += 1;
            let generation = self.generation;
            self.entries
                .get_mut(&q)
                .expect("due entries exist")
                .in_flight = Some(generation);
            debug!(question = %q, "DNS answer expired: asking again");
            let asked = q.clone();
            let task = self.lookups.spawn(async move {
                let result = resolver.ask(&asked).await;
                (asked, generation, result)
            });
            self.running.insert(task.id(), (q, generation));
        }
        changed
    }

    /// Background lookups running now.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// The answer held for `q`, if any.
    pub fn answer(&self, q: &Question) -> Option<&Answer> {
        self.entries.get(q).and_then(|e| e.answer.as_ref())
    }

    /// Looks `q` up and waits for the answer (a background lookup for it is overtaken).
    async fn ask_now(&mut self, q: &Question) {
        let result = match self.resolver() {
            Ok(r) => r.ask(q).await,
            Err(err) => Err(err),
        };
        let now = Instant::now();
        let entry = self.entries.entry(q.clone()).or_insert(Entry {
            answer: None,
            next: now,
            failures: 0,
            in_flight: None,
        });
        entry.in_flight = None;
        settle(&self.opts, q, entry, result, now);
    }

    fn resolver(&mut self) -> Result<Resolver, DnsError> {
        if let Some(r) = &self.resolver {
            return Ok(r.clone());
        }
        let r = Resolver::new(self.server, self.opts.query)?;
        self.resolver = Some(r.clone());
        Ok(r)
    }
}

/// Records a lookup's outcome in `entry`; whether the answer held changed.
fn settle(
    opts: &Options,
    q: &Question,
    entry: &mut Entry,
    result: Result<Answer, DnsError>,
    now: Instant,
) -> bool {
    match result {
        Ok(answer) if !answer.targets.is_empty() => {
            let wait = rules::refresh_after(answer.ttl, opts.min_ttl, opts.max_ttl);
            let changed = entry.answer.as_ref().map(|a| &a.targets) != Some(&answer.targets);
            if changed {
                info!(question = %q, targets = answer.targets.len(), ttl_s = answer.ttl.as_secs(), "DNS answer");
            }
            entry.answer = Some(answer);
            entry.failures = 0;
            entry.next = now + wait;
            changed
        }
        other => {
            entry.failures = entry.failures.saturating_add(1);
            let wait = rules::backoff(entry.failures, opts.min_backoff, opts.max_backoff);
            entry.next = now + wait;
            let error = match other {
                Err(e) => e.to_string(),
                Ok(_) => "no usable record".to_string(),
            };
            if entry.answer.is_some() {
                warn!(question = %q, error, retry_in_ms = wait.as_millis() as u64, "DNS lookup failed: keeping the last answer");
            } else {
                warn!(question = %q, error, retry_in_ms = wait.as_millis() as u64, "DNS lookup failed: no backends from this entry until it succeeds");
            }
            false
        }
    }
}

/// The DNS question of a `resolve = true` entry (`None` for others).
pub fn question(server: &ServerConfig, vip: SocketAddr) -> Option<Question> {
    if !server.resolve {
        return None;
    }
    let ServerAddress::Name { host, .. } = &server.address else {
        return None;
    };
    let name = match &server.service {
        Some(s) => format!("{s}.{host}"),
        None => host.clone(),
    };
    Some(Question {
        name: dns::absolute(&name),
        srv: server.service.is_some(),
        v6: vip.is_ipv6(),
    })
}

/// An address entry with its own settings.
fn fixed(server: &ServerConfig, addr: SocketAddr) -> Expanded {
    let backup = match server.backup {
        crate::config::BackupLevel::Level(l) => l,
        crate::config::BackupLevel::Prio => 0,
    };
    Expanded {
        addr,
        weight: server.weight,
        backup,
        spare: server.spare,
    }
}

/// A name without `resolve`, through the system resolver, in the VIP's family.
async fn system_lookup(service: &str, host: &str, port: u16, v6: bool) -> Vec<SocketAddr> {
    match tokio::net::lookup_host((host, port)).await {
        Ok(it) => it.filter(|a| a.is_ipv6() == v6).collect(),
        Err(err) => {
            warn!(service, host, error = %err, "cannot resolve server name");
            Vec::new()
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
