//! The pass-through XDP program (`lb_pass`) on the switch side of every veth pair, which
//! native-mode `XDP_TX` on a veth needs on the peer (DESIGN.md §2, "veth caveat").

use std::ffi::CString;

use aya::{
    Ebpf, EbpfLoader,
    programs::{ProgramError, Xdp, XdpMode},
};
use lb_common::{PASS_PROGRAM_NAME, map_names};

use crate::net::netns::{NetNs, NetnsError};

/// Why the pass program could not be loaded or attached.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("loading the XDP object (lb_agent::EBPF_OBJECT)")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("the XDP object has no XDP program {PASS_PROGRAM_NAME:?}")]
    Missing,
    #[error("{PASS_PROGRAM_NAME} is not an XDP program")]
    NotXdp(#[source] Box<ProgramError>),
    #[error("loading {PASS_PROGRAM_NAME} into the kernel")]
    Verify(#[source] Box<ProgramError>),
    #[error("attaching {PASS_PROGRAM_NAME} to {ifname} in network namespace {ns} ({mode:?} mode)")]
    Attach {
        ifname: String,
        ns: String,
        mode: XdpMode,
        #[source]
        source: Box<ProgramError>,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

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
pub fn attach(ns: &NetNs, ifnames: &[&str], mode: XdpMode) -> Result<PassPrograms, PassError> {
    // Interface names resolve in the caller's namespace, so attach from a thread inside `ns`.
    ns.run(|| {
        // The object carries the balancer's maps too; only lb_pass is used here, so the
        // big tables are made small.
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(map_names::FLOWS, 64)
            .map_max_entries(map_names::NAT, 64)
            .load(lb_agent::EBPF_OBJECT)
            .map_err(|e| PassError::Load(Box::new(e)))?;
        let program: &mut Xdp = ebpf
            .program_mut(PASS_PROGRAM_NAME)
            .ok_or(PassError::Missing)?
            .try_into()
            .map_err(|e| PassError::NotXdp(Box::new(e)))?;
        program.load().map_err(|e| PassError::Verify(Box::new(e)))?;
        for ifname in ifnames {
            let name = CString::new(*ifname).map_err(|e| PassError::Attach {
                ifname: (*ifname).to_owned(),
                ns: ns.name().to_owned(),
                mode,
                source: Box::new(ProgramError::IOError(e.into())),
            })?;
            program
                .attach(name.as_c_str(), mode)
                .map_err(|source| PassError::Attach {
                    ifname: (*ifname).to_owned(),
                    ns: ns.name().to_owned(),
                    mode,
                    source: Box::new(source),
                })?;
        }
        Ok(PassPrograms { _ebpf: ebpf })
    })?
}
