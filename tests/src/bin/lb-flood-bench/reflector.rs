//! The bed's physical limit: the lab object's bare reflector (`lb_reflect`: swap the
//! MACs, `XDP_TX`) on the lb host's `eth0`, in native mode as lb runs. Its frames go back
//! out of the interface they came in on, toward the sender (counted by a sink on the
//! client's `eth0` in the e2e bed, by the `p-lb` sink on the wire), at the least an XDP
//! program can do per packet.

use std::ffi::CString;

use anyhow::Context;
use aya::{
    Ebpf, EbpfLoader,
    programs::{Xdp, XdpMode},
};
use lb_common::map_names;
use lb_tests::{
    bpf::lab,
    net::{netns::NetNs, topology::HOST_IF},
};

/// `lb_reflect` attached; detached when dropped.
pub struct Reflector {
    /// Owns the program and its link: dropping it detaches the program.
    _ebpf: Ebpf,
}

impl Reflector {
    /// Loads the reflector and attaches it to `HOST_IF` in `ns` (native mode).
    pub fn attach(ns: &NetNs) -> anyhow::Result<Reflector> {
        // Interface names resolve in the caller's namespace: attach from inside `ns`.
        ns.run(|| -> anyhow::Result<Reflector> {
            // The lab object carries the balancer's maps too; only the reflector runs
            // here, so the big tables are made small.
            let mut ebpf = EbpfLoader::new()
                .map_max_entries(map_names::FLOWS, 64)
                .map_max_entries(map_names::NAT, 64)
                .load(lab::OBJECT)
                .context("loading the lab object")?;
            let prog: &mut Xdp = ebpf
                .program_mut(lab::REFLECT_PROGRAM)
                .context("no lb_reflect in the lab object")?
                .try_into()?;
            prog.load().context("loading lb_reflect")?;
            let ifname = CString::new(HOST_IF)?;
            prog.attach(ifname.as_c_str(), XdpMode::Driver)
                .with_context(|| format!("attaching lb_reflect to {HOST_IF} (native)"))?;
            Ok(Reflector { _ebpf: ebpf })
        })?
    }
}
