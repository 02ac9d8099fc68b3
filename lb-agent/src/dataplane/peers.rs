//! Cluster mode, the data plane's side of shared connections: another node's connections
//! installed into, refreshed in and removed from `LB_PEER_FLOWS` and `LB_PEER_NAT`, which
//! the XDP program reads when a packet of one of them reaches this node and takes over
//! (docs/internals/fast-path.md, "Cluster mode"; written through `mmap`, [`PeerTable`]), and the members (`LB_CLUSTER`) a reply
//! no table knows is sent on to. The program never writes them.

use aya::maps::{Array, MapData};
use lb_common::{
    map_names,
    maps::{ClusterMembers, FlowKey, NatValue, PeerFlow},
    table::TableLayout,
};

use super::{
    DataplaneError,
    census::TableReader,
    tables::peer_table::{Located, PeerTable},
};

/// One connection another node made, in this node's terms (its backend id here): what
/// `LB_PEER_FLOWS` and `LB_PEER_NAT` hold of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerConnection {
    /// The client's 5-tuple (client -> VIP).
    pub client: FlowKey,
    /// The backend and source (SNAT address index and port) it is pinned to.
    pub flow: PeerFlow,
    /// The reply's 5-tuple (backend -> SNAT address and port).
    pub reply: FlowKey,
    /// Its reverse entry. `client_mac` is the MAC a reply taken over before any client
    /// packet is sent to (this node's previous hop toward the client; a client packet
    /// brings its own); `last_seen` is ignored (the program ages a taken-over entry from
    /// its own clock).
    pub nat: NatValue,
}

impl PeerConnection {
    /// The connection `client` -> VIP whose reply is `reply`, in connection `state`
    /// (`NAT_S_*`), pinned to this node's `backend_id` and the service's SNAT address
    /// `nat_addr` (an index); `client_mac` as [`PeerConnection::nat`] says.
    pub fn new(
        client: FlowKey,
        reply: FlowKey,
        state: u8,
        backend_id: u32,
        nat_addr: u8,
        client_mac: [u8; 6],
    ) -> Self {
        PeerConnection {
            client,
            flow: PeerFlow {
                backend_id,
                nat_port: reply.dport,
                nat_addr,
                _pad: 0,
            },
            reply,
            nat: NatValue {
                client_addr: client.src,
                vip_addr: client.dst,
                client_port: client.sport,
                vip_port: client.dport,
                backend_id,
                client_mac,
                state,
                ..NatValue::default()
            },
        }
    }
}

/// What the agent's cluster component reads and writes of the data plane: the other
/// nodes' connections in, this node's active ones out. [`ClusterTables`] is the real
/// one; the agent tests use [`crate::testing::MemoryPeers`].
pub trait PeerStore: Send {
    /// Installs (or replaces) other nodes' connections.
    fn install(&mut self, conns: &[PeerConnection]) -> Result<(), DataplaneError>;
    /// Removes other nodes' connections, each by its client and reply 5-tuples (either
    /// entry may be gone already).
    fn remove(&mut self, keys: &[(FlowKey, FlowKey)]) -> Result<(), DataplaneError>;
    /// This node's own nat entries (`LB_NAT`, reply 5-tuple and value) that carried a
    /// packet at `since` or later (`nat_seconds`).
    fn nat_seen_since(&self, since: u32) -> Result<Vec<(FlowKey, NatValue)>, DataplaneError>;
    /// Writes the members, their MACs and the shared SNAT addresses (`LB_CLUSTER`).
    fn set_members(&mut self, members: &ClusterMembers) -> Result<(), DataplaneError>;
}

/// The real data plane's side of cluster mode: the peer tables and a reader of `LB_NAT`.
pub struct ClusterTables {
    peers: PeerTables,
    reader: TableReader,
}

impl ClusterTables {
    pub fn new(peers: PeerTables, reader: TableReader) -> Self {
        Self { peers, reader }
    }
}

impl PeerStore for ClusterTables {
    fn install(&mut self, conns: &[PeerConnection]) -> Result<(), DataplaneError> {
        self.peers.install(conns)
    }

    fn remove(&mut self, keys: &[(FlowKey, FlowKey)]) -> Result<(), DataplaneError> {
        self.peers.remove(keys);
        Ok(())
    }

    fn set_members(&mut self, members: &ClusterMembers) -> Result<(), DataplaneError> {
        self.peers.set_members(members)
    }

    fn nat_seen_since(&self, since: u32) -> Result<Vec<(FlowKey, NatValue)>, DataplaneError> {
        self.reader
            .nat_seen_since(since)
            .map_err(|source| DataplaneError::Io {
                what: "reading LB_NAT for the cluster's refresh",
                source,
            })
    }
}

/// How many connections ahead of the one being written [`PeerWriter`] reads the buckets
/// of (`PeerTable::prefetch`): in tables of a million connections each bucket is a cache
/// and TLB miss, and a batch overlaps them rather than waits for each in turn.
const AHEAD: usize = 8;

/// `LB_PEER_FLOWS` and `LB_PEER_NAT`, written through `mmap` ([`PeerTable`]).
pub struct PeerWriter {
    flows: PeerTable<PeerFlow>,
    nat: PeerTable<NatValue>,
}

impl PeerWriter {
    /// Maps the two tables of a program loaded with `layout` (their hashes are
    /// `LB_FLOWS`' and `LB_NAT`'s, with the same seeds).
    pub fn new(flows: MapData, nat: MapData, layout: &TableLayout) -> Result<Self, DataplaneError> {
        Ok(Self {
            flows: PeerTable::new(flows, map_names::PEER_FLOWS, layout.flow_seed)?,
            nat: PeerTable::new(nat, map_names::PEER_NAT, layout.nat_seed)?,
        })
    }

    /// Installs (or replaces) connections in both tables: each reverse entry before its
    /// flow, so that a client packet taking a flow over finds its own. A connection
    /// whose reverse entry finds no room is not installed (nor its flow); one whose flow
    /// finds none keeps its reverse entry (its replies are still taken over). The others
    /// are written.
    pub fn install(&mut self, conns: &[PeerConnection]) -> Result<(), DataplaneError> {
        let located = self.locate_ahead(conns.iter().map(|c| (&c.client, &c.reply)));
        let (mut nat_full, mut flow_full) = (0, 0);
        for (i, (c, (flow, nat))) in conns.iter().zip(&located).enumerate() {
            self.prefetch(&located, i + AHEAD);
            if !self.nat.put_at(&c.reply, &c.nat, nat) {
                nat_full += 1;
            } else if !self.flows.put_at(&c.client, &c.flow, flow) {
                flow_full += 1;
            }
        }
        full(map_names::PEER_NAT, nat_full)?;
        full(map_names::PEER_FLOWS, flow_full)
    }

    /// Removes connections from both tables (an entry already gone is passed over).
    pub fn remove(&mut self, keys: &[(FlowKey, FlowKey)]) {
        let located = self.locate_ahead(keys.iter().map(|(client, reply)| (client, reply)));
        for (i, ((client, reply), (flow, nat))) in keys.iter().zip(&located).enumerate() {
            self.prefetch(&located, i + AHEAD);
            self.flows.remove_at(client, flow);
            self.nat.remove_at(reply, nat);
        }
    }

    /// Where each connection (client and reply 5-tuples) may live in `LB_PEER_FLOWS` and
    /// `LB_PEER_NAT`; the buckets of the first [`AHEAD`] are read ahead.
    fn locate_ahead<'a>(
        &self,
        keys: impl Iterator<Item = (&'a FlowKey, &'a FlowKey)>,
    ) -> Vec<(Located, Located)> {
        let located: Vec<_> = keys
            .map(|(client, reply)| (self.flows.locate(client), self.nat.locate(reply)))
            .collect();
        for i in 0..AHEAD {
            self.prefetch(&located, i);
        }
        located
    }

    /// Starts reading the buckets of connection `i` of `located`, if there is one.
    fn prefetch(&self, located: &[(Located, Located)], i: usize) {
        if let Some((flow, nat)) = located.get(i) {
            self.flows.prefetch(flow);
            self.nat.prefetch(nat);
        }
    }

    /// The installed connection whose client 5-tuple is `client`, with its reverse
    /// entry found by `reply`, if both are there.
    pub fn get(&self, client: &FlowKey, reply: &FlowKey) -> Option<(PeerFlow, NatValue)> {
        self.flows.get(client).zip(self.nat.get(reply))
    }

    /// How many connections are installed (entries of `LB_PEER_FLOWS`).
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }
}

/// `LB_PEER_FLOWS`, `LB_PEER_NAT` and `LB_CLUSTER`.
pub struct PeerTables {
    writer: PeerWriter,
    members: Array<MapData, ClusterMembers>,
}

impl PeerTables {
    pub(super) fn new(writer: PeerWriter, members: Array<MapData, ClusterMembers>) -> Self {
        Self { writer, members }
    }

    /// Writes `LB_CLUSTER`: the members, their MACs and the shared SNAT addresses.
    pub fn set_members(&mut self, members: &ClusterMembers) -> Result<(), DataplaneError> {
        self.members
            .set(0, members, 0)
            .map_err(|source| DataplaneError::Map {
                name: map_names::CLUSTER,
                source,
            })
    }

    /// [`PeerWriter::install`].
    pub fn install(&mut self, conns: &[PeerConnection]) -> Result<(), DataplaneError> {
        self.writer.install(conns)
    }

    /// [`PeerWriter::remove`].
    pub fn remove(&mut self, keys: &[(FlowKey, FlowKey)]) {
        self.writer.remove(keys);
    }

    /// [`PeerWriter::get`].
    pub fn get(&self, client: &FlowKey, reply: &FlowKey) -> Option<(PeerFlow, NatValue)> {
        self.writer.get(client, reply)
    }

    /// [`PeerWriter::len`].
    pub fn len(&self) -> usize {
        self.writer.len()
    }

    /// Whether no connection is installed.
    pub fn is_empty(&self) -> bool {
        self.writer.is_empty()
    }
}

fn full(name: &'static str, count: usize) -> Result<(), DataplaneError> {
    if count == 0 {
        Ok(())
    } else {
        Err(DataplaneError::TableFull { name, count })
    }
}
