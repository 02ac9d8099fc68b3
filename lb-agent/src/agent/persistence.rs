//! What the agent keeps across restarts ([`Persistence`]): the runtime admin state and
//! its state file (`admin_state.rs`), and the passive ejections kept next to it
//! (`passive_kept.rs`); both written durably (`crate::util::durable`).

use std::{net::SocketAddr, path::PathBuf};

use super::{
    ServiceRt,
    admin_state::{AdminState, ReapplyReport},
    passive_kept::PassiveKept,
    server::{Configured, ServerRt},
    server_table::ServerTable,
};
use crate::config::ServiceConfig;

/// The runtime admin state, where it is saved, and the passive ejections kept.
#[derive(Debug, Default)]
pub(super) struct Persistence {
    /// Runtime admin changes, re-applied at every `apply_config`.
    admin_state: AdminState,
    /// Where `admin_state` is saved; `None`: not kept across restarts.
    state_file: Option<PathBuf>,
    /// Passive ejections kept across restarts, next to `state_file`.
    passive_kept: PassiveKept,
}

impl Persistence {
    /// Keeps the admin state in `path` from now on, starting from `state`, and the
    /// passive ejections next to it (reading the previous run's).
    pub fn keep(&mut self, path: Option<PathBuf>, state: AdminState) {
        self.passive_kept = PassiveKept::open(path.as_deref());
        self.state_file = path;
        self.admin_state = state;
    }

    /// The runtime admin state as it stands (what the state file holds).
    pub fn admin_state(&self) -> &AdminState {
        &self.admin_state
    }

    /// The runtime admin state, for an admin request to record its change in (then
    /// [`Persistence::save_admin_state`]).
    pub fn admin_state_mut(&mut self) -> &mut AdminState {
        &mut self.admin_state
    }

    /// Saves the admin state if it is kept; a failure is logged.
    pub fn save_admin_state(&self) {
        self.admin_state.save_logged(self.state_file.as_deref());
    }

    /// Re-applies the admin state of `svc` to `servers`; `start` makes a server added at
    /// runtime, restoring its passive ejection from what it is given.
    pub fn reapply(
        &mut self,
        svc: &ServiceConfig,
        servers: &mut ServerTable,
        mut start: impl FnMut(SocketAddr, Configured, &PassiveKept) -> ServerRt,
        report: &mut ReapplyReport,
    ) {
        let kept = &self.passive_kept;
        self.admin_state
            .apply(svc, servers, |addr, conf| start(addr, conf, kept), report);
    }

    /// A configuration was applied with the services `names`: the state of the others
    /// is dropped, what is in force and what was dropped is logged (and the file
    /// rewritten if something was dropped), and the previous run's passive ejections not
    /// restored by now are forgotten.
    pub fn applied<'a>(
        &mut self,
        names: impl IntoIterator<Item = &'a str>,
        report: &mut ReapplyReport,
    ) {
        self.admin_state.keep_services(names, report);
        report.log();
        self.passive_kept.restored_all();
        if !report.dropped.is_empty() {
            self.save_admin_state();
        }
    }

    /// The previous run's passive ejections, which new servers start with.
    pub fn passive_kept(&self) -> &PassiveKept {
        &self.passive_kept
    }

    /// A transition entered or left `unavailable`: the ejections kept change.
    pub fn ejections_changed(&mut self) {
        self.passive_kept.mark();
    }

    /// Writes the servers of `services` now in an `unavailable` period, if that changed
    /// since the last write.
    pub fn save_ejections(&mut self, services: &[ServiceRt]) {
        if !self.passive_kept.is_dirty() {
            return;
        }
        let servers = services.iter().flat_map(|s| {
            s.servers.values().filter_map(|v| {
                let until = v.health.unavailable_until()?;
                Some((s.cfg.name.as_str(), v.addr, until))
            })
        });
        self.passive_kept.save(servers);
    }
}
