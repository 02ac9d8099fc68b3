//! The running agent's flow table (`LB_FLOWS`) read from outside: the program attached
//! to the lb host's `eth0` names its maps (the agent's own code finds them, as a restart
//! does), and the whole table is read in `BPF_MAP_LOOKUP_BATCH` chunks. For scenarios
//! that check which backend every one of a million flows is pinned to.

use std::os::fd::{AsFd, OwnedFd};

use lb_agent::dataplane::{
    DataplaneError,
    adopt::{self, flow_tables},
    census, if_index,
};
use lb_common::{
    maps::{FlowKey, FlowValue},
    table::{FlowBucket, SLOT_LIVE, TableLayout},
};

use crate::{netns::NetNs, topology::HOST_IF};

/// Why the table could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error("no XDP program on the lb host's {HOST_IF}")]
    NoProgram,
    #[error("the program on {HOST_IF} has no LB_FLOWS")]
    NoTable,
    #[error("reading LB_FLOWS")]
    Read(#[source] std::io::Error),
}

/// `LB_FLOWS` of the program on `eth0` in the lb namespace, open for reads.
#[derive(Debug)]
pub struct FlowTable {
    fd: OwnedFd,
    buckets: u32,
    /// Its buckets and seeds, as the agent recorded them in `LB_CONFIG`.
    pub layout: TableLayout,
}

impl FlowTable {
    /// Opens the table of the program attached to `eth0` in `lb`.
    pub fn open(lb: &NetNs) -> Result<FlowTable, SnapshotError> {
        lb.run(|| -> Result<FlowTable, SnapshotError> {
            let index = if_index(HOST_IF)?;
            let program =
                adopt::attached_program(index, HOST_IF)?.ok_or(SnapshotError::NoProgram)?;
            let t = flow_tables::previous_tables(&program)?;
            let flows = t.flows.ok_or(SnapshotError::NoTable)?;
            let fd = flows
                .fd()
                .as_fd()
                .try_clone_to_owned()
                .map_err(SnapshotError::Read)?;
            Ok(FlowTable {
                fd,
                buckets: t.layout.flow_buckets,
                layout: t.layout,
            })
        })?
    }

    /// Calls `f` with every live way's key and value (whatever its age).
    pub fn for_each(&self, mut f: impl FnMut(&FlowKey, &FlowValue)) -> Result<(), SnapshotError> {
        census::read_chunks::<FlowBucket>(&self.fd, self.buckets, |chunk| {
            for b in chunk {
                for way in &b.ways {
                    if way.word & SLOT_LIVE != 0 {
                        f(&way.key, &way.value);
                    }
                }
            }
        })
        .map_err(SnapshotError::Read)
    }
}
