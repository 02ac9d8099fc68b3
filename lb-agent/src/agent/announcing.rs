//! VIP announcement from the agent: starts, refreshes, drains and re-decides the
//! announcer ([`crate::announce`], which owns the routes) from the services' last
//! membership, and logs each change.

use super::{Agent, Neighbors};
use crate::{api::AdminError, dataplane::Dataplane, probe::Prober};

impl<D: Dataplane, P: Prober, N: Neighbors> Agent<D, P, N> {
    /// Starts announcing VIPs through `routes` (call once the XDP program is attached,
    /// so a VIP never attracts traffic before the node can forward it). Routes already
    /// there stay (a restart withdraws nothing); `drain_file` keeps the node's drain
    /// across restarts (docs/multi-node.md).
    pub fn start_announcing(
        &mut self,
        routes: Box<dyn crate::announce::VipRoutes + Send>,
        drain_file: Option<std::path::PathBuf>,
    ) {
        self.announcer.start(routes, drain_file);
        self.announce();
        self.snapshot_dirty = true;
    }

    /// Restarts the lifetime of the announced VIP addresses (the dead-man switch: see
    /// [`crate::announce::Announcer::refresh`]).
    pub fn refresh_announcements(&mut self) {
        self.announcer.refresh();
        self.snapshot_dirty = true;
    }

    /// Drains (withdraws every VIP, keeps forwarding what still arrives) or undrains the
    /// node; the next snapshot shows it.
    pub fn set_node_drained(&mut self, drained: bool) -> Result<(), AdminError> {
        if !self.announcer.is_on() {
            return Err(AdminError::Invalid(
                "announcing is off: set `announce_interface` in [agent]".into(),
            ));
        }
        let changes = self.announcer.set_drained(drained).map_err(|e| {
            AdminError::Invalid(format!("keeping the node's drain state failed: {e}"))
        })?;
        self.log_announcements(changes);
        self.record_note(
            "-",
            if drained {
                "node drained"
            } else {
                "node undrained"
            },
        );
        self.snapshot_changed_by_admin();
        Ok(())
    }

    /// Records the routing daemon's sessions as last read (status only).
    pub fn set_bgp_sessions(&mut self, sessions: crate::announce::bird::Sessions) {
        self.announcer.set_bgp(Some(sessions));
        self.snapshot_dirty = true;
    }

    /// Re-decides every VIP's announcement from the services' last membership.
    pub(super) fn announce(&mut self) {
        let input = self
            .services
            .iter()
            .map(|svc| {
                let serve = match &svc.outcome {
                    Some(o) if o.fail_open => crate::announce::Serve::FailOpen,
                    Some(o)
                        if o.roles.iter().any(|&(addr, role)| {
                            role == crate::publish::Role::Active
                                && self.macs.contains_key(&addr.ip())
                        }) =>
                    {
                        crate::announce::Serve::Serving
                    }
                    _ => crate::announce::Serve::Nothing,
                };
                (svc.cfg.vip.ip(), serve)
            })
            .collect();
        let changes = self.announcer.update(input);
        self.log_announcements(changes);
    }
}
