//! The netlink watch: a socket in the neighbour and IPv4/IPv6 route multicast groups
//! feeds [`NextHops`]; the backends' MACs that change and the neighbours that moved to
//! another link-layer address go to the agent. On overflow (ENOBUFS:
//! events were lost) the neighbour table is dumped again and every route looked up again.

use std::{net::IpAddr, sync::Arc};

use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::{
    NeighbourError,
    decode::{self, Event, RouteChange},
    nexthops::{MacUpdate, NeighbourChanges, NextHops},
    poke,
    rtnl::{Rtnl, ifindex},
};
use crate::netlink::{RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE, RTNLGRP_NEIGH, Subscription};

/// Receive buffer asked for (the kernel caps it at `net.core.rmem_max` without
/// CAP_NET_ADMIN; an overflow only costs a resync).
const RCVBUF: usize = 1 << 20;
/// Batches of updates the agent has not taken yet.
const UPDATES: usize = 64;

/// The agent's side of the watch: tell it which backends to follow.
#[derive(Clone)]
pub struct Follow {
    tx: watch::Sender<Arc<Vec<IpAddr>>>,
}

impl Follow {
    /// Follows exactly these backends from now on.
    pub fn set(&self, backends: Vec<IpAddr>) {
        self.tx.send_replace(Arc::new(backends));
    }

    /// Follows one more backend.
    pub fn add(&self, backend: IpAddr) {
        self.tx.send_if_modified(|list| {
            if list.contains(&backend) {
                return false;
            }
            Arc::make_mut(list).push(backend);
            true
        });
    }
}

/// Subscribes and starts the watch task for `interface`, which makes its route and
/// neighbour requests over `rtnl`; must be called inside a tokio runtime. The changes
/// arrive on the receiver, in batches.
pub fn spawn(
    interface: &str,
    rtnl: Rtnl,
) -> Result<(Follow, mpsc::Receiver<NeighbourChanges>), NeighbourError> {
    spawn_with_buffer(interface, rtnl, RCVBUF)
}

/// [`spawn`] with a receive buffer of `rcvbuf` bytes (tests overflow a small one).
pub fn spawn_with_buffer(
    interface: &str,
    rtnl: Rtnl,
    rcvbuf: usize,
) -> Result<(Follow, mpsc::Receiver<NeighbourChanges>), NeighbourError> {
    let index = ifindex(interface)?;
    let changes = Subscription::open(
        &[RTNLGRP_NEIGH, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE],
        Some(rcvbuf),
    )
    .map_err(|source| NeighbourError::Netlink {
        what: "subscription to neighbour and route changes".into(),
        source,
    })?;
    let (tx, follow_rx) = watch::channel(Arc::new(Vec::new()));
    let (updates_tx, updates) = mpsc::channel(UPDATES);
    let task = Watch {
        ifindex: index,
        lo: ifindex("lo").ok(),
        interface: interface.to_string(),
        rtnl,
        state: NextHops::new(index),
        follow: follow_rx,
        out: updates_tx,
    };
    tokio::spawn(task.run(changes));
    Ok((Follow { tx }, updates))
}

struct Watch {
    ifindex: u32,
    /// Local addresses route through `lo`: the address itself is the next hop.
    lo: Option<u32>,
    interface: String,
    rtnl: Rtnl,
    state: NextHops,
    follow: watch::Receiver<Arc<Vec<IpAddr>>>,
    out: mpsc::Sender<NeighbourChanges>,
}

impl Watch {
    async fn run(mut self, mut changes: Subscription) {
        let mut updates = self.resync().await;
        info!(interface = %self.interface, "watching neighbour and route changes over netlink");
        loop {
            let batch = NeighbourChanges {
                backends: std::mem::take(&mut updates),
                moved: self.state.take_moved(),
            };
            if !batch.is_empty() {
                debug!(?batch, "neighbour changes to the agent");
                if self.out.send(batch).await.is_err() {
                    return; // the agent is gone
                }
            }
            let mut routes: Vec<RouteChange> = Vec::new();
            let mut overflow = false;
            tokio::select! {
                changed = self.follow.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let list = self.follow.borrow_and_update().clone();
                    let fresh = self.state.set_backends(&list);
                    updates.extend(self.route_lookups(fresh).await);
                }
                ready = changes.ready() => {
                    // Everything queued now, then one pass over the route changes.
                    let read = ready.and_then(|ready| {
                        ready.read_all(|datagram| self.take(datagram, &mut updates, &mut routes))
                    });
                    match read {
                        Ok(lost) => overflow = lost,
                        Err(err) => {
                            warn!(error = %err, "netlink watch failed: backend MACs are no longer followed");
                            return;
                        }
                    }
                }
            }
            if overflow {
                warn!(interface = %self.interface, "netlink events lost (receive buffer overflow): reading the neighbour and route tables again");
                updates.extend(self.resync().await);
            } else if !routes.is_empty() {
                let affected: Vec<IpAddr> = self
                    .state
                    .backends()
                    .filter(|b| routes.iter().any(|r| r.covers(*b)))
                    .collect();
                updates.extend(self.route_lookups(affected).await);
            }
        }
    }

    /// Applies one datagram's events: neighbour changes at once, route changes
    /// collected for one pass of lookups.
    fn take(&mut self, buf: &[u8], updates: &mut Vec<MacUpdate>, routes: &mut Vec<RouteChange>) {
        let events = match decode::datagram(buf) {
            Ok(events) => events,
            Err(err) => return debug!(error = %err, "netlink datagram skipped"),
        };
        for ev in events {
            match ev {
                Event::Neigh(e) => {
                    debug!(?e, "neighbour event");
                    updates.extend(self.state.neigh(e));
                }
                Event::NeighGone { ifindex, addr } => {
                    updates.extend(self.state.neigh_gone(ifindex, addr));
                }
                Event::Route(r) => routes.push(r),
            }
        }
    }

    /// Reads the neighbour table and every followed backend's route again.
    async fn resync(&mut self) -> Vec<MacUpdate> {
        let mut updates = match self.rtnl.neighbours(self.ifindex).await {
            Ok(entries) => self.state.replace_table(&entries),
            Err(err) => {
                warn!(error = %err, "neighbour table dump failed");
                Vec::new()
            }
        };
        let all: Vec<IpAddr> = self.state.backends().collect();
        updates.extend(self.route_lookups(all).await);
        updates
    }

    /// Looks up the routes of `backends`; a new next hop not resolved yet is poked so
    /// the kernel resolves it (its answer arrives as a neighbour event).
    async fn route_lookups(&mut self, backends: Vec<IpAddr>) -> Vec<MacUpdate> {
        let mut updates = Vec::new();
        for b in backends {
            let hop = match self.rtnl.route(b).await {
                Ok(r) if r.oif.is_none() || r.oif == Some(self.ifindex) || r.oif == self.lo => {
                    Some(r.gateway.unwrap_or(b))
                }
                Ok(_) => None,
                Err(err) => {
                    debug!(backend = %b, error = %err, "route lookup failed");
                    None
                }
            };
            updates.extend(self.state.set_route(b, hop));
        }
        for (_, hop) in self.state.pending() {
            poke(hop);
        }
        updates
    }
}
