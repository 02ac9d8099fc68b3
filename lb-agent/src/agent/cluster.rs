//! The agent's cluster component ([`ClusterNode`]): the [`Cluster`] that shares nat
//! connections with the peers of `[cluster]` (docs/internals/cluster-sync.md) and the
//! data plane's side of it ([`PeerStore`]). This node's connections go out as records
//! (established and ended, from the data plane's connection events; refreshed while
//! they carry traffic); the peers' come in as replicas and are installed into the peer
//! tables, in this node's terms (its backend ids, its previous hop toward the client).
//! In cluster mode the services' SNAT addresses are announced like VIPs, and the data
//! plane knows each member's MAC and the shared SNAT port ranges (`LB_CLUSTER`), to send
//! a reply it has no entry for on to the member that owns its port.

use std::{net::IpAddr, time::Duration};

use futures_util::{StreamExt, stream::FuturesUnordered};
use lb_common::{
    events::ConnEvent,
    maps::{
        CLUSTER_HOP_MOVES_MAX, CLUSTER_MEMBERS_MAX, CLUSTER_SNAT_MAX, ClusterMembers, ClusterSnat,
        HopMove,
    },
};
use tracing::{info, warn};

use super::{Agent, Neighbours, ServiceRt, client_hops::ClientHops, neighbours::fmt_mac};
use crate::{
    cluster::{self, Change, Cluster, Record},
    config::{Config, Forwarding, Protocol},
    dataplane::{
        Dataplane, DataplaneError,
        census::nat_clock,
        peers::{PeerConnection, PeerStore},
    },
    neighbour::nexthops::Moved,
    probe::Prober,
    publish::Publisher,
};

/// How long a refresh waits for one member's MAC (the event loop waits meanwhile).
const MEMBER_LOOKUP: Duration = Duration::from_millis(5);

/// The cluster component: the sync, the peer tables, what the refresh scans saw.
pub struct ClusterNode {
    sync: Cluster,
    tables: Box<dyn PeerStore>,
    /// This node's previous hop toward each client seen in a replica (what a reply taken
    /// over before any client packet is sent to).
    client_macs: ClientHops,
    /// The `nat_seconds` of the last refresh scan.
    scanned_at: u32,
    /// What `LB_CLUSTER` holds (or is to hold): members, MACs, shared SNAT addresses.
    members: ClusterMembers,
    /// Whether `members` changed since it was last written.
    members_dirty: bool,
    /// Members (bit by index) whose MAC the last lookup did not find (logged once).
    unresolved: u32,
    /// Next-hop moves followed since the agent started.
    hop_moves_followed: u64,
    /// Connections the peer tables had no room for ([`ClusterNode::install`]).
    peer_table_full: u64,
}

impl ClusterNode {
    pub fn new(sync: Cluster, tables: Box<dyn PeerStore>) -> Self {
        let index = sync.members();
        let members = ClusterMembers {
            count: index.all().len().min(CLUSTER_MEMBERS_MAX) as u8,
            own: index.own_index() as u8,
            ..ClusterMembers::default()
        };
        ClusterNode {
            sync,
            tables,
            client_macs: ClientHops::new(),
            scanned_at: nat_clock(),
            members,
            members_dirty: true,
            unresolved: 0,
            hop_moves_followed: 0,
            peer_table_full: 0,
        }
    }

    /// The shared SNAT addresses of `cfg`'s nat services and their whole port ranges
    /// (before this node's slice is taken), written to `LB_CLUSTER`. check-config gives every
    /// service sharing an address the same range; the first one's is kept.
    pub fn set_shared_snat(&mut self, cfg: &Config) {
        let mut snat = [ClusterSnat::default(); CLUSTER_SNAT_MAX];
        let mut used = 0;
        for svc in cfg
            .services
            .iter()
            .filter(|s| s.forwarding == Forwarding::Nat)
        {
            for ip in &svc.snat_ips {
                let (addr, family) = crate::publish::addr_words(*ip);
                if snat[..used]
                    .iter()
                    .any(|s| s.addr == addr && s.family == family)
                {
                    continue;
                }
                if used == CLUSTER_SNAT_MAX {
                    warn!(snat = %ip, "more shared SNAT addresses than the data plane names; replies to this one are not sent on to their owner");
                    continue;
                }
                snat[used] = ClusterSnat {
                    addr,
                    family,
                    port_min: *svc.snat_ports.start(),
                    port_max: *svc.snat_ports.end(),
                    ..ClusterSnat::default()
                };
                used += 1;
            }
        }
        if snat != self.members.snat {
            self.members.snat = snat;
            self.members.snat_count = used as u8;
            self.members_dirty = true;
        }
        self.write_members();
    }

    /// Records member `index`'s MAC (`None`: not known).
    fn set_member_mac(&mut self, index: usize, mac: Option<[u8; 6]>) {
        let mac = mac.unwrap_or_default();
        if let Some(slot) = self.members.macs.get_mut(index)
            && *slot != mac
        {
            *slot = mac;
            self.members_dirty = true;
        }
    }

    /// Adds next-hop MAC moves to `LB_CLUSTER` (the latest [`CLUSTER_HOP_MOVES_MAX`]):
    /// a move back to a MAC drops the move away from it, and a move from the MAC an
    /// earlier move went to carries that one along, so no reply is sent round a chain.
    fn add_hop_moves(&mut self, moves: &[HopMove]) {
        let count = usize::from(self.members.hop_move_count);
        let mut kept: Vec<HopMove> = self.members.hop_moves[..count].to_vec();
        for m in moves {
            kept.retain(|k| k.old != m.new && k.old != m.old);
            for k in &mut kept {
                if k.new == m.old {
                    k.new = m.new;
                }
            }
            kept.push(*m);
        }
        let kept = &kept[kept.len().saturating_sub(CLUSTER_HOP_MOVES_MAX)..];
        let mut hop_moves = [HopMove::default(); CLUSTER_HOP_MOVES_MAX];
        hop_moves[..kept.len()].copy_from_slice(kept);
        self.members.hop_moves = hop_moves;
        self.members.hop_move_count = kept.len() as u8;
        self.members_dirty = true;
    }

    /// Writes `LB_CLUSTER` if it changed.
    fn write_members(&mut self) {
        if !self.members_dirty {
            return;
        }
        match self.tables.set_members(&self.members) {
            Ok(()) => self.members_dirty = false,
            Err(err) => warn!(error = %err, "cluster: writing LB_CLUSTER failed"),
        }
    }

    pub fn sync(&self) -> &Cluster {
        &self.sync
    }

    /// The status page's cluster section: the sync's, and the next-hop moves replies
    /// follow.
    pub fn status(&self) -> cluster::ClusterStatus {
        let count = usize::from(self.members.hop_move_count);
        cluster::ClusterStatus {
            next_hop_moves_followed: self.hop_moves_followed,
            peer_table_full: self.peer_table_full,
            next_hop_moves: self.members.hop_moves[..count]
                .iter()
                .map(|m| cluster::NextHopMove {
                    old: fmt_mac(m.old),
                    new: fmt_mac(m.new),
                })
                .collect(),
            ..self.sync.status()
        }
    }

    pub fn sync_mut(&mut self) -> &mut Cluster {
        &mut self.sync
    }
}

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// Runs `node` as this agent's cluster component: from now on the nat services'
    /// SNAT addresses are announced like VIPs (the peers share them, and the backend
    /// side's routers spread replies over the nodes that announce them).
    pub fn start_cluster(&mut self, node: ClusterNode) {
        self.cluster = Some(node);
        self.announcement.announce_snat_addresses();
        self.announce();
        self.snapshot.changed();
    }

    /// The sync component, when `[cluster]` is configured.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref().map(ClusterNode::sync)
    }

    /// The sync component, to take its changes.
    pub fn cluster_mut(&mut self) -> Option<&mut Cluster> {
        self.cluster.as_mut().map(ClusterNode::sync_mut)
    }

    /// The data plane's connection events: this node's connections, established or
    /// ended, shared with the peers.
    pub fn on_conn_events(&mut self, batch: &[ConnEvent]) {
        let Some(node) = &self.cluster else {
            return;
        };
        let records: Vec<Record> = batch.iter().filter_map(cluster::record_of_event).collect();
        node.sync.publish(&records);
    }

    /// This node's own nat entries that carried traffic since the last scan are
    /// refreshed at the peers: a connection another node made and that now lives here
    /// keeps its port at its owner, and every replica stays alive while it is used. The
    /// members' MACs are looked up again (a member replaced, or not answering before).
    pub async fn refresh_cluster(&mut self) {
        self.resolve_members(MEMBER_LOOKUP).await;
        let Some(node) = &mut self.cluster else {
            return;
        };
        node.client_macs.age();
        let now = nat_clock();
        let seen = match node.tables.nat_seen_since(node.scanned_at) {
            Ok(seen) => seen,
            Err(err) => {
                warn!(error = %err, "cluster refresh: reading LB_NAT failed");
                return;
            }
        };
        node.scanned_at = now;
        let records: Vec<Record> = seen
            .iter()
            .map(|(reply, nat)| {
                // `nat_seconds` are 2^30 ns: about 1.07 s each.
                let age_ms = now.wrapping_sub(nat.last_seen).min(3600) * 1074;
                cluster::refresh_of_entry(reply, nat, age_ms)
            })
            .collect();
        node.sync.publish(&records);
    }

    /// Neighbours on the attached interface that moved to another link-layer address
    /// (a router's NIC swapped, a VRRP failover). A move of a neighbour that may stand
    /// between this node and clients is followed: the cached clients' next hops take the
    /// new MAC (replicas installed from now on name it), and `LB_CLUSTER` carries the
    /// move, so a reply whose entry names the old MAC goes to the new one
    /// (`ClusterMembers::hop_moves`). A backend's own move is left to the backend table,
    /// unless a cached client's next hop is that MAC too.
    pub fn follow_neighbour_moves(&mut self, moved: &[Moved]) {
        let Some(node) = &mut self.cluster else {
            return;
        };
        let backends = self.macs.known();
        let moves: Vec<HopMove> = moved
            .iter()
            .filter(|m| {
                node.client_macs.one_behind(m.old).is_some() || !backends.contains_key(&m.addr)
            })
            .map(|m| HopMove {
                old: m.old,
                new: m.new,
            })
            .collect();
        if moves.is_empty() {
            return;
        }
        node.client_macs.follow(&moves);
        node.add_hop_moves(&moves);
        node.hop_moves_followed += moves.len() as u64;
        node.write_members();
        for m in &moves {
            info!(old = %fmt_mac(m.old), new = %fmt_mac(m.new), "a neighbour moved to another MAC; replies taken over that named the old one follow it");
        }
    }

    /// Looks up each peer's MAC on the attached interface (from its cluster address) and
    /// writes `LB_CLUSTER` if anything changed: a reply whose port a peer owns is sent to
    /// that MAC. A peer not resolved within `wait` keeps no MAC; its replies are not sent
    /// on until a later refresh finds it.
    pub async fn resolve_members(&mut self, wait: Duration) {
        let Some(node) = &self.cluster else {
            return;
        };
        let peers: Vec<(usize, IpAddr)> = node
            .sync
            .members()
            .peers()
            .map(|(i, m)| (i, m.address.ip()))
            .collect();
        let neighbours = self.macs.neighbours().clone();
        let mut found = Vec::with_capacity(peers.len());
        for (index, ip) in peers {
            // Bounded by `wait`: a MAC the kernel does not know yet is being resolved (the
            // lookup asked for it) and found at a later refresh.
            let mac = match tokio::time::timeout(wait, neighbours.resolve(ip)).await {
                Ok(mac) => mac,
                Err(_) => Err(format!(
                    "not resolved within {wait:?}; asked again at the next refresh"
                )),
            };
            found.push((index, ip, mac));
        }
        let Some(node) = &mut self.cluster else {
            return;
        };
        for (index, ip, mac) in found {
            let bit = 1u32 << index;
            match mac {
                Ok(mac) => {
                    node.unresolved &= !bit;
                    node.set_member_mac(index, Some(mac));
                }
                Err(why) => {
                    if node.unresolved & bit == 0 {
                        warn!(peer = %ip, %why, "no MAC for a cluster member; replies to its ports are not sent on to it until it answers");
                    }
                    node.unresolved |= bit;
                    node.set_member_mac(index, None);
                }
            }
        }
        node.write_members();
    }

    /// Replicas the peers sent (or that expired): installed into, or removed from, the
    /// peer tables, in batches. A replica of a service or backend this node does not
    /// have is skipped (the configs differ; one warning per batch). The next hops
    /// toward clients not seen before are looked up together first, the wait bounded
    /// by [`CLIENT_LOOKUP`].
    pub async fn on_cluster_changes(&mut self, changes: Vec<Change>) {
        let Some(node) = &self.cluster else {
            return;
        };
        let mut unknown: Vec<IpAddr> = changes
            .iter()
            .filter_map(|c| match c {
                Change::Upsert(r) if !node.client_macs.fresh(&r.client.ip()) => Some(r.client.ip()),
                _ => None,
            })
            .collect();
        unknown.sort_unstable();
        unknown.dedup();
        let found = if unknown.is_empty() {
            Vec::new()
        } else {
            resolve_clients(self.macs.neighbours().as_ref(), unknown, CLIENT_LOOKUP).await
        };
        let Some(node) = &mut self.cluster else {
            return;
        };
        node.learn_client_macs(found);
        // Room for the whole batch at once (a list grown by doubling copies its entries
        // again at each step).
        let mut installs = Vec::with_capacity(changes.len());
        let mut removes = Vec::new();
        let mut skipped: Option<(usize, Record)> = None;
        for change in changes {
            match change {
                Change::Upsert(record) => {
                    if !removes.is_empty() {
                        node.remove(&std::mem::take(&mut removes));
                    }
                    let mac = node
                        .client_macs
                        .get(&record.client.ip())
                        .unwrap_or_default();
                    match peer_connection(&record, &self.services, self.publishing.publisher(), mac)
                    {
                        Some(conn) => installs.push(conn),
                        None => skipped.get_or_insert((0, record)).0 += 1,
                    }
                }
                Change::Remove(record) => {
                    if !installs.is_empty() {
                        node.install(&std::mem::take(&mut installs));
                    }
                    removes.push((cluster::client_key(&record), cluster::reply_key(&record)));
                }
            }
        }
        node.install(&installs);
        node.remove(&removes);
        if let Some((count, first)) = skipped {
            warn!(count, vip = %first.vip, backend = %first.backend, "peers' connections name a service or backend this node does not have; skipped");
        }
    }
}

/// How long a batch of replicas waits for the next hops toward its new clients (the
/// event loop waits meanwhile). A client not resolved in time is installed without a
/// MAC (a reply taken over before the client's next packet waits for that packet) and
/// looked up again with its next replica.
const CLIENT_LOOKUP: Duration = Duration::from_millis(5);

/// Looks `ips` up together, for at most `wait`: those answered, with their MAC or why
/// not.
async fn resolve_clients<N: Neighbours>(
    neighbours: &N,
    ips: Vec<IpAddr>,
    wait: Duration,
) -> Vec<(IpAddr, Result<[u8; 6], String>)> {
    let mut lookups: FuturesUnordered<_> = ips
        .into_iter()
        .map(|ip| async move { (ip, neighbours.resolve(ip).await) })
        .collect();
    let mut found = Vec::new();
    let _ = tokio::time::timeout(wait, async {
        while let Some(answer) = lookups.next().await {
            found.push(answer);
        }
    })
    .await;
    found
}

impl ClusterNode {
    /// Keeps the next hops found toward clients; one warning for those that have none
    /// (a MAC known before stays in use).
    fn learn_client_macs(&mut self, found: Vec<(IpAddr, Result<[u8; 6], String>)>) {
        let mut missing: Option<(usize, IpAddr, String)> = None;
        for (ip, mac) in found {
            match mac {
                Ok(mac) => self.client_macs.learn(ip, mac),
                Err(why) => missing.get_or_insert((0, ip, why)).0 += 1,
            }
        }
        if let Some((count, client, why)) = missing {
            warn!(count, %client, %why, "no next hop toward replicas' clients; their replies wait for a client packet");
        }
    }

    fn install(&mut self, conns: &[PeerConnection]) {
        if conns.is_empty() {
            return;
        }
        match self.tables.install(conns) {
            Ok(()) => {}
            Err(DataplaneError::TableFull { count, .. }) => {
                let before = self.peer_table_full;
                self.peer_table_full += count as u64;
                // Logged when the total passes a power of two: a table that stays full
                // does not flood the log.
                if before.checked_ilog2() != self.peer_table_full.checked_ilog2() {
                    warn!(
                        count,
                        total = self.peer_table_full,
                        "cluster: the peer tables had no room for other nodes' connections (more than agent.max_flows replicated)"
                    );
                }
            }
            Err(err) => warn!(error = %err, "cluster: writing the peer tables failed"),
        }
    }

    fn remove(&mut self, keys: &[(lb_common::maps::FlowKey, lb_common::maps::FlowKey)]) {
        if keys.is_empty() {
            return;
        }
        if let Err(err) = self.tables.remove(keys) {
            warn!(error = %err, "cluster: removing from the peer tables failed");
        }
    }
}

/// `record` in this node's terms: its backend id here, the SNAT address's index in the
/// service's `snat_ips`; `None` when this node has no such service, backend or address.
fn peer_connection(
    record: &Record,
    services: &[ServiceRt],
    publisher: &Publisher,
    client_mac: [u8; 6],
) -> Option<PeerConnection> {
    let protocol = match record.protocol {
        lb_common::IPPROTO_TCP => Protocol::Tcp,
        lb_common::IPPROTO_UDP => Protocol::Udp,
        _ => return None,
    };
    let svc = services
        .iter()
        .find(|s| s.cfg.vip == record.vip.addr() && s.cfg.protocol == protocol)?;
    let backend_id = publisher.backend_id(&svc.cfg.name, &record.backend.addr())?;
    let nat_addr = svc
        .cfg
        .snat_ips
        .iter()
        .position(|ip| *ip == record.snat.ip())?;
    Some(PeerConnection::new(
        cluster::client_key(record),
        cluster::reply_key(record),
        record.state,
        backend_id,
        u8::try_from(nat_addr).ok()?,
        client_mac,
    ))
}
