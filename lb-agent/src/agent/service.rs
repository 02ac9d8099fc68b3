//! A virtual service at runtime ([`ServiceRt`]): its configuration, servers, membership
//! and last outcome, the servers removed but still departing, its own local faults and
//! probe durations, and what its next recompute must take in (its marks).

use std::{collections::BTreeMap, net::SocketAddr};

use tokio::time::Instant;

use super::{
    departing, local_faults, probe_durations, server::ServerRt, server_table::ServerTable,
};
use crate::{
    config::ServiceConfig,
    membership::{Outcome, Policy, ServiceMembership},
};

/// A virtual service at runtime.
pub(super) struct ServiceRt {
    pub cfg: ServiceConfig,
    pub(super) membership: ServiceMembership,
    pub(super) servers: ServerTable,
    pub(super) outcome: Option<Outcome>,
    /// Servers removed from the configuration whose established flows may still run.
    pub(super) departing: BTreeMap<SocketAddr, departing::Departing>,
    /// Probe runs of this service without a verdict because of a local fault.
    pub(super) local_faults: local_faults::LocalFaults,
    /// Something only this service's membership depends on changed (a verdict, a due
    /// recheck, an admin patch): [`Agent::recompute_marked`] recomputes it.
    pub(super) marked: bool,
    /// Marked for something other than health verdicts (a due recheck, an admin patch,
    /// a departing backend's end, a reload): membership over every server.
    pub(super) marked_whole: bool,
    /// Servers whose health changed since the last recompute: when they are all that
    /// changed, membership and the publish are updated for them alone.
    pub(super) changed_health: Vec<SocketAddr>,
    /// Probe durations over all servers, by probe (`/metrics`).
    pub(super) probe_durations: probe_durations::ProbeDurations,
}

impl ServiceRt {
    /// Something else than a verdict changed: the next recompute takes every server.
    pub(super) fn mark(&mut self) {
        self.marked = true;
        self.marked_whole = true;
    }

    /// `addr`'s health changed.
    pub(super) fn mark_server(&mut self, addr: SocketAddr) {
        self.marked = true;
        self.changed_health.push(addr);
    }

    /// Recomputed: nothing is pending.
    pub(super) fn unmark(&mut self) {
        self.marked = false;
        self.marked_whole = false;
        self.changed_health.clear();
    }

    pub(super) fn policy(&self) -> Policy {
        Policy {
            backup_switch: self.cfg.backup_switch,
            max_unhealthy_percent: self.cfg.max_unhealthy_percent,
            fail_open: self.cfg.fail_open,
        }
    }

    /// Membership updated for the servers whose health changed alone, when that is all
    /// that changed and no whole-service decision moves (`ServiceMembership::update`):
    /// the indices of the servers whose role changed. `None`: compute over every server.
    pub(super) fn update_membership(
        &mut self,
        now: Instant,
        work: &mut MembershipWork,
    ) -> Option<Vec<usize>> {
        if self.marked_whole || self.changed_health.is_empty() {
            return None;
        }
        let policy = self.policy();
        let outcome = self.outcome.as_mut()?;
        self.changed_health.sort_unstable();
        self.changed_health.dedup();
        let inputs = self
            .changed_health
            .iter()
            .map(|a| self.servers.get(a).map(ServerRt::member_input))
            .collect::<Option<Vec<_>>>()?;
        work.inputs += inputs.len();
        let moved = self.membership.update(&inputs, &policy, now, outcome)?;
        work.updated += 1;
        Some(moved)
    }
}

/// What the last recompute did with membership (tests and benchmarks check its scope).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MembershipWork {
    /// Services whose membership was updated for their changed servers alone.
    pub updated: usize,
    /// Services whose membership was computed over every server.
    pub computed: usize,
    /// Server inputs read: the changed servers of an update, every server of a
    /// computation.
    pub inputs: usize,
}
