//! The pass-through XDP program (`lb_pass`) on the switch side of every veth pair, which
//! native-mode `XDP_TX` on a veth needs on the peer (DESIGN.md §2, "veth caveat").

use std::ffi::CString;

use aya::{
    Ebpf, EbpfLoader,
    programs::{Xdp, XdpMode},
};
use lb_common::{PASS_PROGRAM_NAME, map_names};

use crate::{net::netns::NetNs, util::error::Error};

/// `lb_pass` attached to some interfaces; detached when dropped.
pub struct PassPrograms {
    /// Owns the program and its links: dropping it detaches every attachment.
    _ebpf: Ebpf,
}

impl std::fmt::Debug for PassPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PassPrograms")
    }
}

/// Loads `lb_pass` once and attaches it to each of `ifnames` in `ns` in `mode`.
pub fn attach(ns: &NetNs, ifnames: &[&str], mode: XdpMode) -> Result<PassPrograms, Error> {
    // Interface names resolve in the caller's namespace, so attach from a thread inside `ns`.
    ns.run(|| {
        // The object carries the balancer's maps too; only lb_pass is used here, so the
        // big tables are made small.
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(map_names::FLOWS, 64)
            .map_max_entries(map_names::NAT, 64)
            .load(lb_agent::EBPF_OBJECT)
            .map_err(Error::bpf("loading the XDP object (lb_agent::EBPF_OBJECT)"))?;
        let program: &mut Xdp = ebpf
            .program_mut(PASS_PROGRAM_NAME)
            .ok_or_else(|| {
                Error::Unexpected(format!(
                    "the XDP object has no XDP program {PASS_PROGRAM_NAME:?}"
                ))
            })?
            .try_into()
            .map_err(Error::bpf(format!(
                "{PASS_PROGRAM_NAME} is not an XDP program"
            )))?;
        program.load().map_err(Error::bpf(format!(
            "loading {PASS_PROGRAM_NAME} into the kernel"
        )))?;
        for ifname in ifnames {
            let what = format!(
                "attaching {PASS_PROGRAM_NAME} to {ifname} in network namespace {} \
                 ({mode:?} mode)",
                ns.name()
            );
            let name = CString::new(*ifname).map_err(Error::bpf(what.clone()))?;
            program
                .attach(name.as_c_str(), mode)
                .map_err(Error::bpf(what))?;
        }
        Ok(PassPrograms { _ebpf: ebpf })
    })?
}
