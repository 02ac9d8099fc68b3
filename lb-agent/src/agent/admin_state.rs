//! Runtime admin state (docs/admin-state.md): what the operator changed through the API —
//! `drain`, `down`, `weight`, `spare` of a server, servers added at runtime — kept apart
//! from the file, re-applied after every reload, saved to `agent.state_file` (write,
//! fsync, rename) and restored at start. It lasts until cleared through the API (`up`,
//! `undrain`, `set` back to the file's value, `server reset`, removing an added server).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::server::{Configured, ServerRt};
use crate::{
    api::{NewServer, ServerPatch},
    config::{ServiceConfig, check_server},
    membership::Admin,
    util::durable,
};

/// Format version written in the state file.
const VERSION: u32 = 1;

/// Runtime changes of one server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerOverride {
    /// A weight that differs from the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare: Option<bool>,
    /// `drain` or `down`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<AdminMark>,
    /// Set for a server added at runtime (the file does not list it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added: Option<Added>,
}

impl ServerOverride {
    fn is_empty(&self) -> bool {
        *self == ServerOverride::default()
    }

    /// `web 10.0.1.1:80: down, weight 5`.
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(a) = self.added {
            parts.push(format!(
                "added (weight {}, spare {}, backup {})",
                a.weight, a.spare, a.backup
            ));
        }
        match self.admin {
            Some(AdminMark::Drain) => parts.push("drain".into()),
            Some(AdminMark::Down) => parts.push("down".into()),
            None => {}
        }
        if let Some(w) = self.weight {
            parts.push(format!("weight {w}"));
        }
        if let Some(s) = self.spare {
            parts.push(format!("spare {s}"));
        }
        parts.join(", ")
    }
}

/// A runtime admin state other than up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdminMark {
    Drain,
    Down,
}

/// A server added at runtime, as added (later `set`s update it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Added {
    pub weight: u32,
    pub spare: bool,
    pub backup: u32,
}

/// Every runtime change, by service name and server address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminState {
    pub version: u32,
    pub services: BTreeMap<String, BTreeMap<SocketAddr, ServerOverride>>,
}

impl Default for AdminState {
    fn default() -> Self {
        AdminState {
            version: VERSION,
            services: BTreeMap::new(),
        }
    }
}

/// Why the state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a state file of this agent: {why}")]
    Format { path: PathBuf, why: String },
}

/// What re-applying the state to a config did, for the log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReapplyReport {
    /// `service server: what` re-applied.
    pub applied: Vec<String>,
    /// `service server: what (why)` dropped.
    pub dropped: Vec<String>,
}

impl ReapplyReport {
    /// Logs what is in force and (as a warning) what was dropped.
    pub fn log(&self) {
        if !self.applied.is_empty() {
            tracing::info!(
                count = self.applied.len(),
                servers = self.applied.join("; "),
                "runtime admin state in force"
            );
        }
        if !self.dropped.is_empty() {
            tracing::warn!(
                count = self.dropped.len(),
                servers = self.dropped.join("; "),
                "runtime admin state dropped"
            );
        }
    }
}

impl AdminState {
    /// [`AdminState::save`] to `path` if set; a failure is logged (the change is in
    /// force, it just will not survive a restart).
    pub fn save_logged(&self, path: Option<&Path>) {
        if let Some(path) = path
            && let Err(err) = self.save(path)
        {
            tracing::warn!(error = %err, "saving the runtime admin state failed: it will not survive a restart");
        }
    }

    pub fn is_empty(&self) -> bool {
        self.services.values().all(BTreeMap::is_empty)
    }

    /// Reads `path`; a missing file is an empty state.
    pub fn load(path: &Path) -> Result<AdminState, StateFileError> {
        let read = durable::read_if_present(path).map_err(|source| StateFileError::Io {
            what: "reading",
            path: path.to_path_buf(),
            source,
        })?;
        let Some(text) = read else {
            return Ok(Self::default());
        };
        let state: AdminState =
            serde_json::from_str(&text).map_err(|e| StateFileError::Format {
                path: path.to_path_buf(),
                why: e.to_string(),
            })?;
        if state.version != VERSION {
            return Err(StateFileError::Format {
                path: path.to_path_buf(),
                why: format!("version {} (this agent writes {VERSION})", state.version),
            });
        }
        Ok(state)
    }

    /// Writes `path` atomically: a temporary file in the same directory, fsync, rename,
    /// fsync of the directory. The directory is created (0700) when missing.
    pub fn save(&self, path: &Path) -> Result<(), StateFileError> {
        let mut state = self.clone();
        state.version = VERSION;
        state.services.retain(|_, s| !s.is_empty());
        let text = serde_json::to_string_pretty(&state).expect("plain data serializes");
        durable::write_atomic(path, "tmp", text.as_bytes()).map_err(|(what, source)| {
            StateFileError::Io {
                what,
                path: path.to_path_buf(),
                source,
            }
        })
    }

    /// Records an applied PATCH of `server` (its values after the change).
    pub(super) fn record_patch(&mut self, service: &str, server: &ServerRt, patch: &ServerPatch) {
        let ov = self.entry(service, server.addr);
        if patch.reset == Some(true) {
            ov.weight = None;
            ov.spare = None;
            ov.admin = None;
        }
        match (&mut ov.added, server.configured) {
            (Some(added), _) => {
                added.weight = server.weight;
                added.spare = server.spare;
            }
            (None, Some(file)) => {
                ov.weight = (server.weight != file.weight).then_some(server.weight);
                ov.spare = (server.spare != file.spare).then_some(server.spare);
            }
            (None, None) => {}
        }
        ov.admin = match server.admin {
            Admin::Up => None,
            Admin::Drain => Some(AdminMark::Drain),
            Admin::Down => Some(AdminMark::Down),
        };
        self.prune(service, server.addr);
    }

    /// Records a server added at runtime.
    pub(super) fn record_add(&mut self, service: &str, new: &NewServer) {
        *self.entry(service, new.address) = ServerOverride {
            added: Some(Added {
                weight: new.weight,
                spare: new.spare && new.backup == 0,
                backup: new.backup,
            }),
            ..Default::default()
        };
    }

    /// Records a removal: an added server is forgotten; a server the file lists loses its
    /// overrides (it is back, with the file's settings, at the next reload or restart).
    pub(super) fn record_remove(&mut self, service: &str, addr: SocketAddr) {
        if let Some(s) = self.services.get_mut(service) {
            s.remove(&addr);
        }
    }

    /// Whether `addr` of `service` was added at runtime (and not removed since).
    pub fn is_added(&self, service: &str, addr: SocketAddr) -> bool {
        self.services
            .get(service)
            .and_then(|s| s.get(&addr))
            .is_some_and(|o| o.added.is_some())
    }

    fn entry(&mut self, service: &str, addr: SocketAddr) -> &mut ServerOverride {
        self.services
            .entry(service.to_string())
            .or_default()
            .entry(addr)
            .or_default()
    }

    fn prune(&mut self, service: &str, addr: SocketAddr) {
        if let Some(s) = self.services.get_mut(service) {
            if s.get(&addr).is_some_and(ServerOverride::is_empty) {
                s.remove(&addr);
            }
            if s.is_empty() {
                self.services.remove(service);
            }
        }
    }

    /// Applies the state of `svc` to its servers as the file gave them; `make` creates a
    /// server added at runtime. Overrides of servers that are gone are dropped (and
    /// reported), as are additions the file now lists itself or that the service's rules
    /// refuse.
    pub(super) fn apply(
        &mut self,
        svc: &ServiceConfig,
        servers: &mut super::server_table::ServerTable,
        mut make: impl FnMut(SocketAddr, Configured) -> ServerRt,
        report: &mut ReapplyReport,
    ) {
        let Some(overrides) = self.services.get_mut(&svc.name) else {
            return;
        };
        overrides.retain(|&addr, ov| {
            let name = format!("{} {addr}", svc.name);
            if let Some(added) = ov.added {
                if servers.get(&addr).is_some_and(|s| s.configured.is_some()) {
                    report.dropped.push(format!(
                        "{name}: added at runtime (now listed in the file, whose entry applies)"
                    ));
                    ov.added = None;
                } else if let Err(e) =
                    check_server(svc, addr, added.weight, added.spare, added.backup)
                {
                    servers.remove(&addr);
                    report
                        .dropped
                        .push(format!("{name}: {} (refused now: {e})", ov.describe()));
                    return false;
                } else if !servers.contains_key(&addr) {
                    let conf = Configured {
                        weight: added.weight,
                        spare: added.spare,
                        backup: added.backup,
                    };
                    let mut server = make(addr, conf);
                    server.configured = None;
                    servers.insert(addr, server);
                }
            }
            let Some(server) = servers.get_mut(&addr) else {
                report.dropped.push(format!(
                    "{name}: {} (no longer in the config)",
                    ov.describe()
                ));
                return false;
            };
            if let Some(w) = ov.weight {
                server.weight = w;
            }
            if let Some(s) = ov.spare {
                if s && server.backup != 0 {
                    report.dropped.push(format!(
                        "{name}: spare (the file now puts it on backup level {})",
                        server.backup
                    ));
                    ov.spare = None;
                } else {
                    server.spare = s;
                }
            }
            server.admin = match ov.admin {
                None => Admin::Up,
                Some(AdminMark::Drain) => Admin::Drain,
                Some(AdminMark::Down) => Admin::Down,
            };
            if !ov.is_empty() {
                report.applied.push(format!("{name}: {}", ov.describe()));
            }
            !ov.is_empty()
        });
    }

    /// Drops the state of services not in `names`, reporting it.
    pub(super) fn keep_services<'a>(
        &mut self,
        names: impl IntoIterator<Item = &'a str>,
        report: &mut ReapplyReport,
    ) {
        let names: std::collections::BTreeSet<&str> = names.into_iter().collect();
        self.services.retain(|svc, overrides| {
            if names.contains(svc.as_str()) {
                return true;
            }
            for (addr, ov) in overrides.iter() {
                report.dropped.push(format!(
                    "{svc} {addr}: {} (service no longer in the config)",
                    ov.describe()
                ));
            }
            false
        });
    }
}
