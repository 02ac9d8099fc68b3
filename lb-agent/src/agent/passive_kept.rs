//! Passive ejections kept across restarts (docs/restarts.md, "Passive ejections"): a
//! server that passive checks made `unavailable` (`max_fails` within `fail_timeout`)
//! stays out for the rest of its `fail_timeout` when the agent restarts, instead of
//! coming back with the restart. The servers in such a period and when it ends (wall
//! clock) are saved next to the runtime admin state, `<state_file>.passive` (write, fsync,
//! rename), whenever a transition enters or leaves `unavailable`; read at start, applied
//! to the servers the first configuration creates, then dropped.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::{health::ServerHealth, util::durable};

/// Format version written in the file.
const VERSION: u32 = 1;

/// Why the file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PassiveFileError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a passive-state file of this agent: {why}")]
    Format { path: PathBuf, why: String },
}

/// One server in an `unavailable` period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    service: String,
    server: SocketAddr,
    /// End of its `fail_timeout`, milliseconds since the Unix epoch.
    until_unix_ms: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct FileBody {
    version: u32,
    servers: Vec<Entry>,
}

/// A server by service name and address.
type Key = (String, SocketAddr);

/// The passive ejections of the previous run (until the first configuration is applied)
/// and where this run keeps its own.
#[derive(Debug, Default)]
pub struct PassiveKept {
    path: Option<PathBuf>,
    /// Read at start: when each server's `fail_timeout` ends.
    restoring: HashMap<Key, u64>,
    /// What the file holds now (skips writes that change nothing).
    written: BTreeMap<Key, u64>,
    /// A transition entered or left `unavailable` since the last save.
    dirty: bool,
}

/// `<state_file>.passive`.
pub fn path_for(state_file: &Path) -> PathBuf {
    let mut name = state_file.as_os_str().to_owned();
    name.push(".passive");
    PathBuf::from(name)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl PassiveKept {
    /// Keeps ejections in `<state_file>.passive` (nothing without a state file) and reads
    /// the previous run's. A file that cannot be read is logged and ignored.
    pub fn open(state_file: Option<&Path>) -> Self {
        let Some(path) = state_file.map(path_for) else {
            return Self::default();
        };
        let restoring = match read(&path) {
            Ok(entries) => entries,
            Err(err) => {
                warn!(error = %err, "the passive state of the previous run cannot be restored");
                HashMap::new()
            }
        };
        let written = restoring.iter().map(|(k, v)| (k.clone(), *v)).collect();
        PassiveKept {
            path: Some(path),
            restoring,
            written,
            dirty: false,
        }
    }

    /// Puts `server` of `service` back into the `unavailable` period the previous run saved
    /// for it, for what remains of it (at most its `fail_timeout` now, whatever the wall
    /// clock did), and logs it. `None` when there is nothing to restore.
    pub fn restore(
        &self,
        service: &str,
        server: SocketAddr,
        health: &mut ServerHealth,
        now: Instant,
    ) -> Option<Duration> {
        let until = *self.restoring.get(&(service.to_string(), server))?;
        let left = until.saturating_sub(unix_ms(SystemTime::now()));
        let remaining = Duration::from_millis(left).min(health.passive_policy().fail_timeout);
        if !health.restore_unavailable(remaining, now) {
            return None;
        }
        let secs = remaining.as_secs_f64().ceil() as u64;
        info!(
            service,
            server = %server,
            "restored: server {server} unavailable (passive) for another {secs} s"
        );
        Some(remaining)
    }

    /// The first configuration is applied: what was not restored by now is dropped.
    pub fn restored_all(&mut self) {
        if !self.restoring.is_empty() {
            self.restoring.clear();
            self.dirty = true;
        }
    }

    /// A transition entered or left `unavailable`: the next [`save`](Self::save) writes.
    pub fn mark(&mut self) {
        self.dirty = true;
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty && self.path.is_some()
    }

    /// Writes the servers now in an `unavailable` period (`(service, server, end of
    /// fail_timeout)`), if that changed since the last write; errors are logged (the
    /// agent goes on: only a restart's memory of them is lost).
    pub fn save<'a>(&mut self, servers: impl Iterator<Item = (&'a str, SocketAddr, Instant)>) {
        self.dirty = false;
        let Some(path) = &self.path else {
            return;
        };
        let now = Instant::now();
        let wall = SystemTime::now();
        let current: BTreeMap<Key, u64> = servers
            .map(|(service, server, until)| {
                let end = wall + until.saturating_duration_since(now);
                ((service.to_string(), server), unix_ms(end))
            })
            .chain(self.restoring.iter().map(|(k, v)| (k.clone(), *v)))
            .collect();
        if current == self.written {
            return;
        }
        match write(path, &current) {
            Ok(()) => self.written = current,
            Err(err) => warn!(error = %err, "keeping the passive state failed"),
        }
    }
}

fn read(path: &Path) -> Result<HashMap<Key, u64>, PassiveFileError> {
    let read = durable::read_if_present(path).map_err(|source| PassiveFileError::Io {
        what: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    let Some(text) = read else {
        return Ok(HashMap::new());
    };
    let body: FileBody = serde_json::from_str(&text).map_err(|e| PassiveFileError::Format {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    if body.version != VERSION {
        return Err(PassiveFileError::Format {
            path: path.to_path_buf(),
            why: format!("version {} (this agent writes {VERSION})", body.version),
        });
    }
    Ok(body
        .servers
        .into_iter()
        .map(|e| ((e.service, e.server), e.until_unix_ms))
        .collect())
}

fn write(path: &Path, servers: &BTreeMap<Key, u64>) -> Result<(), PassiveFileError> {
    let body = FileBody {
        version: VERSION,
        servers: servers
            .iter()
            .map(|((service, server), until)| Entry {
                service: service.clone(),
                server: *server,
                until_unix_ms: *until,
            })
            .collect(),
    };
    let text = serde_json::to_string_pretty(&body).expect("plain data serializes");
    durable::write_atomic(path, "passive.tmp", text.as_bytes()).map_err(|(what, source)| {
        PassiveFileError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{HealthState, PassivePolicy, StartState};

    /// A directory of its own under the system's temporary one, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("lb-passive-kept-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn addr() -> SocketAddr {
        "10.0.0.1:80".parse().unwrap()
    }

    fn health(fail_timeout: Duration, now: Instant) -> ServerHealth {
        let policy = PassivePolicy {
            max_fails: 1,
            fail_timeout,
        };
        ServerHealth::new(&[], policy, StartState::New, now)
    }

    /// A server ejected by passive checks, saved, read by the next run: it is
    /// `unavailable` for what remained of its `fail_timeout`, then `up`.
    #[tokio::test(start_paused = true)]
    async fn an_ejection_outlives_a_restart_for_the_rest_of_its_fail_timeout() {
        let dir = TempDir::new("outlives");
        let state = dir.path().join("admin-state.json");
        let timeout = Duration::from_secs(30);

        let mut first = PassiveKept::open(Some(&state));
        let t0 = Instant::now();
        let mut h = health(timeout, t0);
        assert!(h.on_passive_failure(t0).is_some(), "ejected");
        let until = h.unavailable_until().expect("in its fail_timeout");
        first.mark();
        first.save([("web", addr(), until)].into_iter());
        assert!(path_for(&state).exists());

        // 12 s later (wall clock: the file holds an absolute end) the agent restarts.
        tokio::time::advance(Duration::from_secs(12)).await;
        let text = std::fs::read_to_string(path_for(&state)).unwrap();
        let mut body: FileBody = serde_json::from_str(&text).unwrap();
        body.servers[0].until_unix_ms -= 12_000;
        std::fs::write(path_for(&state), serde_json::to_string(&body).unwrap()).unwrap();

        let mut second = PassiveKept::open(Some(&state));
        let now = Instant::now();
        let mut h = health(timeout, now);
        assert_eq!(h.state(), HealthState::Up, "a fresh server starts up");
        let remaining = second
            .restore("web", addr(), &mut h, now)
            .expect("restored");
        assert!(
            remaining <= Duration::from_secs(18) && remaining > Duration::from_secs(17),
            "{remaining:?}"
        );
        assert_eq!(h.state(), HealthState::Unavailable);
        assert!(!h.usable());
        assert_eq!(
            second.restore(
                "web",
                "10.0.0.2:80".parse().unwrap(),
                &mut health(timeout, now),
                now
            ),
            None
        );
        second.restored_all();

        tokio::time::advance(remaining - Duration::from_millis(1)).await;
        assert_eq!(
            h.tick(Instant::now()),
            None,
            "still out just before the end"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        let t = h.tick(Instant::now()).expect("back at the end");
        assert_eq!(t.to, HealthState::Up);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ended_or_stretched_ejection_is_bounded_by_the_fail_timeout() {
        let dir = TempDir::new("bounded");
        let state = dir.path().join("s.json");
        let wall = unix_ms(SystemTime::now());
        let mut servers = BTreeMap::new();
        servers.insert(("web".to_string(), addr()), wall.saturating_sub(1_000));
        servers.insert(("api".to_string(), addr()), wall + 3_600_000);
        write(&path_for(&state), &servers).unwrap();
        let kept = PassiveKept::open(Some(&state));
        let now = Instant::now();
        let timeout = Duration::from_secs(10);
        let mut h = health(timeout, now);
        assert_eq!(kept.restore("web", addr(), &mut h, now), None, "over");
        assert_eq!(h.state(), HealthState::Up);
        assert_eq!(
            kept.restore("api", addr(), &mut h, now),
            Some(timeout),
            "a clock step cannot stretch it past fail_timeout"
        );
        let mut off = ServerHealth::new(
            &[],
            PassivePolicy {
                max_fails: 0,
                fail_timeout: timeout,
            },
            StartState::New,
            now,
        );
        let kept = PassiveKept::open(Some(&state));
        assert_eq!(
            kept.restore("api", addr(), &mut off, now),
            None,
            "passive checks off"
        );
    }

    #[test]
    fn a_damaged_file_restores_nothing() {
        let dir = TempDir::new("damaged");
        let state = dir.path().join("s.json");
        std::fs::write(path_for(&state), "{not json").unwrap();
        assert!(matches!(
            read(&path_for(&state)),
            Err(PassiveFileError::Format { .. })
        ));
        let kept = PassiveKept::open(Some(&state));
        assert!(kept.restoring.is_empty());
        assert!(PassiveKept::open(None).path.is_none());
    }
}
