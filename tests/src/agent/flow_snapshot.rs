//! The running agent's flow table (`LB_FLOWS`) read from outside: the program attached
//! to the lb host's `eth0` names its maps (the agent's own code finds them, as a restart
//! does), and the whole table is read in `BPF_MAP_LOOKUP_BATCH` chunks. For scenarios
//! that check which backend every one of a million flows is pinned to.

use std::os::fd::{AsFd, OwnedFd};

use lb_agent::dataplane::{
    adopt::{self, flow_tables},
    census, if_index,
};
use lb_common::{
    maps::{FlowKey, FlowValue},
    table::{FlowBucket, SLOT_LIVE, TableLayout},
};

use crate::{
    net::{netns::NetNs, topology::HOST_IF},
    util::error::Error,
};

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
    pub fn open(lb: &NetNs) -> Result<FlowTable, Error> {
        lb.run(|| -> Result<FlowTable, Error> {
            let index = if_index(HOST_IF)?;
            let program = adopt::attached_program(index, HOST_IF)?.ok_or_else(|| {
                Error::Unexpected(format!("no XDP program on the lb host's {HOST_IF}"))
            })?;
            let t = flow_tables::previous_tables(&program)?;
            let flows = t.flows.ok_or_else(|| {
                Error::Unexpected(format!("the program on {HOST_IF} has no LB_FLOWS"))
            })?;
            let fd = flows
                .fd()
                .as_fd()
                .try_clone_to_owned()
                .map_err(Error::io("reading LB_FLOWS"))?;
            Ok(FlowTable {
                fd,
                buckets: t.layout.flow_buckets,
                layout: t.layout,
            })
        })?
    }

    /// Calls `f` with every live way's key and value (whatever its age).
    pub fn for_each(&self, mut f: impl FnMut(&FlowKey, &FlowValue)) -> Result<(), Error> {
        census::read_chunks::<FlowBucket>(&self.fd, self.buckets, |chunk| {
            for b in chunk {
                for way in &b.ways {
                    if way.word & SLOT_LIVE != 0 {
                        f(&way.key, &way.value);
                    }
                }
            }
        })
        .map_err(Error::io("reading LB_FLOWS"))
    }
}
