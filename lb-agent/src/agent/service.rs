//! A virtual service at runtime ([`ServiceRt`]): its configuration, servers, membership
//! and last outcome, the servers removed but still departing, its own local faults and
//! probe durations, what its next recompute must take in (its marks), and its share of
//! the tick and of the counters poll.

use std::{collections::BTreeMap, net::SocketAddr};

use tokio::time::Instant;

use super::{
    departing, local_faults, probe_durations, server::ServerRt, server_table::ServerTable,
};
use lb_common::maps::BackendStats;

use crate::{
    config::ServiceConfig,
    health::{StartState, Transition},
    membership::{Outcome, Policy, ServiceMembership},
    publish::Publisher,
    util::ordered_join,
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
    /// A service new to this run, with `servers` started.
    pub(super) fn new(cfg: ServiceConfig, servers: ServerTable) -> Self {
        ServiceRt {
            cfg,
            membership: ServiceMembership::new(),
            servers,
            outcome: None,
            departing: BTreeMap::new(),
            local_faults: Default::default(),
            marked: false,
            marked_whole: false,
            changed_health: Vec::new(),
            probe_durations: Default::default(),
        }
    }

    /// How a server added to this running service at `addr` starts: held back until
    /// every probe passes; added back while its removed backend is still departing, it
    /// keeps that backend's established flows meanwhile.
    pub(super) fn added_start(&self, addr: SocketAddr) -> StartState {
        if self.departing.contains_key(&addr) {
            StartState::Returning
        } else {
            StartState::Added
        }
    }

    /// Runs what is due at `now`: health expiries (their transitions pushed to
    /// `transitions` as (service, server, transition)), a due membership recheck, the
    /// end of departing backends. Returns whether the service is marked.
    pub(super) fn tick(
        &mut self,
        now: Instant,
        transitions: &mut Vec<(String, String, Transition)>,
    ) -> bool {
        for server in self.servers.values_mut() {
            if let Some(t) = server.health.tick(now) {
                server.signals.set_healthy(server.health.usable());
                transitions.push((self.cfg.name.clone(), server.addr.to_string(), t));
                self.marked = true;
                self.changed_health.push(server.addr);
            }
        }
        if self
            .outcome
            .as_ref()
            .and_then(|o| o.recheck_at)
            .is_some_and(|at| at <= now)
        {
            self.mark();
        }
        let departing = self.departing.len();
        self.departing.retain(|_, d| d.deadline() > now);
        if self.departing.len() != departing {
            self.mark();
        }
        self.marked
    }

    /// The earliest of its servers' health deadlines, its membership recheck and its
    /// departing backends' ends.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.servers
            .values()
            .filter_map(|v| v.health.next_deadline())
            .chain(self.outcome.as_ref().and_then(|o| o.recheck_at))
            .chain(self.departing.values().map(departing::Departing::deadline))
            .min()
    }

    /// Takes in the data plane's per-backend counters `all` (indexed by backend id, as
    /// `publisher` gave the ids) read at `now`: new successful connections reset passive
    /// failure counts, new packets keep departing backends alive.
    pub(super) fn absorb_counters(
        &mut self,
        publisher: &Publisher,
        all: &[BackendStats],
        now: Instant,
    ) {
        // Servers and published backends are both in address order: one pass, and a
        // server whose counters did not move costs one comparison.
        let ids = publisher.backend_ids_in_order(&self.cfg.name);
        for (server, id) in ordered_join::join(self.servers.iter_mut(), ids) {
            let Some(&stats) = id.and_then(|id| all.get(id as usize)) else {
                continue;
            };
            if stats == server.last_stats {
                continue;
            }
            let (ok, _) = server.absorb_stats(stats, now);
            if ok > 0 {
                server.health.on_passive_success(now);
            }
        }
        let ids = publisher.backend_ids_in_order(&self.cfg.name);
        for (d, id) in ordered_join::join(self.departing.iter_mut(), ids) {
            if let Some(stats) = id.and_then(|id| all.get(id as usize)) {
                d.saw_packets(stats.packets, now);
            }
        }
    }

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
