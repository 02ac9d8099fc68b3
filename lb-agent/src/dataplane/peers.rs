//! Cluster mode, the data plane's side of shared connections: another node's connections
//! installed into, refreshed in and removed from `LB_PEER_FLOWS` and `LB_PEER_NAT`, which
//! the XDP program reads when a packet of one of them reaches this node and takes over
//! (docs/internals/fast-path.md, "Cluster mode"), and the members (`LB_CLUSTER`) a reply
//! no table knows is sent on to. The program never writes them.

use aya::maps::{Array, HashMap, MapData, MapError};
use lb_common::{
    map_names,
    maps::{ClusterMembers, FlowKey, NatValue, PeerFlow},
};

use super::{DataplaneError, batch, census::TableReader};

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
        self.peers.remove(keys)
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

/// `LB_PEER_FLOWS`, `LB_PEER_NAT` and `LB_CLUSTER`.
pub struct PeerTables {
    flows: HashMap<MapData, FlowKey, PeerFlow>,
    nat: HashMap<MapData, FlowKey, NatValue>,
    members: Array<MapData, ClusterMembers>,
}

impl PeerTables {
    pub(super) fn new(
        flows: HashMap<MapData, FlowKey, PeerFlow>,
        nat: HashMap<MapData, FlowKey, NatValue>,
        members: Array<MapData, ClusterMembers>,
    ) -> Self {
        Self {
            flows,
            nat,
            members,
        }
    }

    /// Writes `LB_CLUSTER`: the members, their MACs and the shared SNAT addresses.
    pub fn set_members(&mut self, members: &ClusterMembers) -> Result<(), DataplaneError> {
        self.members
            .set(0, members, 0)
            .map_err(|source| map_error(map_names::CLUSTER, source))
    }

    /// Installs (or replaces) connections in both tables, a batch call per table: the
    /// reverse entries first, so that a client packet taking a flow over finds its own.
    /// An entry the kernel refuses (a table full) is skipped; the others are written.
    pub fn install(&mut self, conns: &[PeerConnection]) -> Result<(), DataplaneError> {
        let (replies, nats): (Vec<FlowKey>, Vec<NatValue>) =
            conns.iter().map(|c| (c.reply, c.nat)).unzip();
        let nat = batch::update_all(&self.nat, &replies, &nats);
        let (clients, flows): (Vec<FlowKey>, Vec<PeerFlow>) =
            conns.iter().map(|c| (c.client, c.flow)).unzip();
        let flow = batch::update_all(&self.flows, &clients, &flows);
        nat.map_err(|r| refused(map_names::PEER_NAT, r))?;
        flow.map_err(|r| refused(map_names::PEER_FLOWS, r))
    }

    /// Removes connections from both tables, a batch call per table (an entry already
    /// gone is passed over).
    pub fn remove(&mut self, keys: &[(FlowKey, FlowKey)]) -> Result<(), DataplaneError> {
        let (clients, replies): (Vec<FlowKey>, Vec<FlowKey>) = keys.iter().copied().unzip();
        let flow = batch::delete_all(&self.flows, &clients);
        let nat = batch::delete_all(&self.nat, &replies);
        flow.map_err(|r| refused(map_names::PEER_FLOWS, r))?;
        nat.map_err(|r| refused(map_names::PEER_NAT, r))
    }

    /// The installed connection whose client 5-tuple is `client`, with its reverse
    /// entry found by `reply`, if both are there.
    pub fn get(
        &self,
        client: &FlowKey,
        reply: &FlowKey,
    ) -> Result<Option<(PeerFlow, NatValue)>, DataplaneError> {
        let flow = lookup(&self.flows, map_names::PEER_FLOWS, client)?;
        let nat = lookup(&self.nat, map_names::PEER_NAT, reply)?;
        Ok(flow.zip(nat))
    }

    /// How many connections are installed (entries of `LB_PEER_FLOWS`).
    pub fn len(&self) -> usize {
        self.flows.keys().filter(Result::is_ok).count()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn map_error(name: &'static str, source: MapError) -> DataplaneError {
    DataplaneError::Map { name, source }
}

fn is_missing(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(e) => e.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

fn refused(name: &'static str, refused: batch::Refused) -> DataplaneError {
    DataplaneError::Refused {
        name,
        count: refused.count,
        source: refused.first,
    }
}

fn lookup<V: aya::Pod>(
    map: &HashMap<MapData, FlowKey, V>,
    name: &'static str,
    key: &FlowKey,
) -> Result<Option<V>, DataplaneError> {
    match map.get(key, 0) {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_missing(&e) => Ok(None),
        Err(e) => Err(map_error(name, e)),
    }
}
