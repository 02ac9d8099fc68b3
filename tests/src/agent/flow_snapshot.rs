//! The running agent's flow and nat tables (`LB_FLOWS`, `LB_NAT`) read from outside: the
//! program attached to an interface names its maps (the agent's own code finds them, as a
//! restart does), and the whole table is read in `BPF_MAP_LOOKUP_BATCH` chunks. For
//! scenarios that check which backend every one of a million flows is pinned to, or which
//! translations several nodes hold.

use std::os::fd::{AsFd, OwnedFd};

use lb_agent::dataplane::{
    adopt::{self, flow_tables},
    census, if_index,
};
use lb_common::{
    maps::{FlowKey, FlowValue, NatValue},
    table::{FlowBucket, NatBucket, SLOT_LIVE, TableLayout},
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
        let t = attached_tables(lb, HOST_IF)?;
        let flows = t.flows.ok_or_else(|| {
            Error::Unexpected(format!("the program on {HOST_IF} has no LB_FLOWS"))
        })?;
        Ok(FlowTable {
            fd: owned(&flows, "LB_FLOWS")?,
            buckets: t.layout.flow_buckets,
            layout: t.layout,
        })
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

/// `LB_NAT` of the program on an interface, open for reads.
#[derive(Debug)]
pub struct NatTable {
    fd: OwnedFd,
    buckets: u32,
}

impl NatTable {
    /// Opens the table of the program attached to `ifname` in `ns`.
    pub fn open(ns: &NetNs, ifname: &str) -> Result<NatTable, Error> {
        let t = attached_tables(ns, ifname)?;
        let nat = t
            .nat
            .ok_or_else(|| Error::Unexpected(format!("the program on {ifname} has no LB_NAT")))?;
        Ok(NatTable {
            fd: owned(&nat, "LB_NAT")?,
            buckets: t.layout.nat_buckets,
        })
    }

    /// Calls `f` with every live way's key (the reply's 5-tuple) and value.
    pub fn for_each(&self, mut f: impl FnMut(&FlowKey, &NatValue)) -> Result<(), Error> {
        census::read_chunks::<NatBucket>(&self.fd, self.buckets, |chunk| {
            for b in chunk {
                for way in &b.ways {
                    if way.word & SLOT_LIVE != 0 {
                        f(&way.key, &way.value);
                    }
                }
            }
        })
        .map_err(Error::io("reading LB_NAT"))
    }
}

/// The tables of the lb program attached to `ifname` in `ns`.
fn attached_tables(ns: &NetNs, ifname: &str) -> Result<flow_tables::PreviousTables, Error> {
    let ifname = ifname.to_owned();
    ns.run(move || -> Result<_, Error> {
        let index = if_index(&ifname)?;
        let program = adopt::attached_program(index, &ifname)?
            .ok_or_else(|| Error::Unexpected(format!("no XDP program on {ifname}")))?;
        Ok(flow_tables::previous_tables(&program)?)
    })?
}

/// A descriptor of `map` of its own, so the table outlives the loader's handle.
fn owned(map: &aya::maps::MapData, name: &str) -> Result<OwnedFd, Error> {
    map.fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(Error::io(format!("reading {name}")))
}
