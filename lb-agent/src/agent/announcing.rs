//! VIP announcement from the agent ([`Announcement`]): the announcer
//! ([`crate::announce`], which owns the routes) started, refreshed, drained and
//! re-decided from the services' last membership, each change logged; and the traffic
//! total that tells a drained node when it went quiet.

use std::{collections::HashMap, net::IpAddr};

use tokio::time::Instant;

use super::{Agent, Neighbours, ServiceRt};
use crate::{
    announce::{Announcer, Change, Serve, VipRoutes, bird_sessions::Sessions},
    api::AdminError,
    dataplane::Dataplane,
    probe::Prober,
    publish::Role,
    view::AnnounceStatus,
};

/// The announcer and the node's traffic as last polled.
#[derive(Default)]
pub(super) struct Announcement {
    announcer: Announcer,
    /// Packets seen on every backend so far.
    traffic_total: u64,
    /// When `traffic_total` last moved (a drained node is quiet since then).
    traffic_moved: Option<Instant>,
    /// Cluster mode: the nat services' SNAT addresses are announced like their VIPs.
    snat_addresses: bool,
}

impl Announcement {
    /// From now on, announces each nat service's SNAT addresses as it announces the
    /// service's VIP (cluster mode).
    pub fn announce_snat_addresses(&mut self) {
        self.snat_addresses = true;
    }

    /// Re-decides every VIP's announcement from `services`' last membership (a service
    /// serves when it is fail-open or has an active server whose MAC is known); in
    /// cluster mode its SNAT addresses follow the same decision.
    pub fn update(
        &mut self,
        services: &[ServiceRt],
        macs: &HashMap<IpAddr, [u8; 6]>,
    ) -> Vec<Change> {
        let snat = self.snat_addresses;
        let input = services
            .iter()
            .flat_map(|svc| {
                let serve = match &svc.outcome {
                    Some(o) if o.fail_open => Serve::FailOpen,
                    Some(o)
                        if o.roles.iter().any(|&(addr, role)| {
                            role == Role::Active && macs.contains_key(&addr.ip())
                        }) =>
                    {
                        Serve::Serving
                    }
                    _ => Serve::Nothing,
                };
                let snat_ips = if snat {
                    svc.cfg.snat_ips.as_slice()
                } else {
                    &[]
                };
                std::iter::once(svc.cfg.vip.ip())
                    .chain(snat_ips.iter().copied())
                    .map(move |ip| (ip, serve))
            })
            .collect();
        self.announcer.update(input)
    }

    /// The packets forwarded to every backend so far, as polled at `now`.
    pub fn saw_traffic(&mut self, total: u64, now: Instant) {
        if total != self.traffic_total || self.traffic_moved.is_none() {
            self.traffic_total = total;
            self.traffic_moved = Some(now);
        }
    }

    /// What status shows at `now`.
    pub fn status(&self, now: Instant) -> AnnounceStatus {
        let mut status = self.announcer.status();
        status.quiet_seconds = self
            .traffic_moved
            .map(|t| now.saturating_duration_since(t).as_secs_f64());
        status
    }
}

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// Starts announcing VIPs through `routes` (call once the XDP program is attached,
    /// so a VIP never attracts traffic before the node can forward it). Routes already
    /// there stay (a restart withdraws nothing); `drain_file` keeps the node's drain
    /// across restarts (docs/multi-node.md).
    pub fn start_announcing(
        &mut self,
        routes: Box<dyn VipRoutes + Send>,
        drain_file: Option<std::path::PathBuf>,
    ) {
        self.announcement.announcer.start(routes, drain_file);
        self.announce();
        self.snapshot.changed();
    }

    /// Restarts the lifetime of the announced VIP addresses (the dead-man switch: see
    /// [`crate::announce::Announcer::refresh`]).
    pub fn refresh_announcements(&mut self) {
        self.announcement.announcer.refresh();
        self.snapshot.changed();
    }

    /// Drains (withdraws every VIP, keeps forwarding what still arrives) or undrains the
    /// node; the next snapshot shows it.
    pub fn set_node_drained(&mut self, drained: bool) -> Result<(), AdminError> {
        let announcer = &mut self.announcement.announcer;
        if !announcer.is_on() {
            return Err(AdminError::Invalid(
                "announcing is off: set `announce_interface` in [agent]".into(),
            ));
        }
        let changes = announcer.set_drained(drained).map_err(|e| {
            AdminError::Invalid(format!("keeping the node's drain state failed: {e}"))
        })?;
        self.events.announcements(changes);
        self.events.note(
            "-",
            if drained {
                "node drained"
            } else {
                "node undrained"
            },
        );
        self.snapshot.changed_by_admin();
        Ok(())
    }

    /// Records the routing daemon's sessions as last read (status only).
    pub fn set_bgp_sessions(&mut self, sessions: Sessions) {
        self.announcement.announcer.set_bgp(Some(sessions));
        self.snapshot.changed();
    }

    /// Re-decides every VIP's announcement from the services' last membership.
    pub(super) fn announce(&mut self) {
        let changes = self.announcement.update(&self.services, self.macs.known());
        self.events.announcements(changes);
    }
}
