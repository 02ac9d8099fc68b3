//! `lb-agent decap attach|detach`: lb's own decapsulation program (`lb_decap`) on a
//! backend, for hosts without the kernel's ipip / fou modules. It strips the outer
//! headers of tunnel packets addressed to one of the host's addresses
//! (`LB_DECAP_ADDRS`, filled at attach) and passes the inner packet up the stack.
//! Attached through netlink, it stays after the command exits. docs/tunnel.md.

use std::{net::IpAddr, os::fd::AsFd};

use aya::{EbpfLoader, maps::HashMap, programs::Xdp};
use lb_common::{DECAP_PROGRAM_NAME, FAMILY_V4, FAMILY_V6, map_names, maps::DecapAddr};

use super::{AttachMode, xdp};
use crate::dataplane::{DataplaneError, adopt::AttachedProgram, bpf::map_err};
use crate::netlink::XdpAttached;

/// The object's large maps, created at their smallest: the decap command loads only
/// `lb_decap`, which uses none of them.
const SHRUNK_MAPS: [&str; 9] = [
    map_names::VIP_INDEX,
    map_names::MAGLEV,
    map_names::MAGLEV_GEN,
    map_names::BACKENDS,
    map_names::FLOWS,
    map_names::NAT,
    map_names::SOURCES,
    map_names::SERVICE_STATS,
    map_names::BACKEND_STATS,
];

/// The key of `addr` in `LB_DECAP_ADDRS`.
pub fn decap_key(addr: IpAddr) -> DecapAddr {
    let (addr, family) = match addr {
        IpAddr::V4(a) => ([u32::from_ne_bytes(a.octets()), 0, 0, 0], FAMILY_V4),
        IpAddr::V6(a) => {
            let o = a.octets();
            (
                std::array::from_fn(|i| {
                    u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
                }),
                FAMILY_V6,
            )
        }
    };
    DecapAddr {
        addr,
        family,
        _pad: [0; 3],
    }
}

/// Whether `program` is `lb_decap` (kernel names are cut to 15 bytes; this one fits).
pub fn is_decap(program: &AttachedProgram) -> bool {
    program.name == DECAP_PROGRAM_NAME
}

/// Loads `lb_decap` with `addrs` in its address map and attaches it to `ifindex`,
/// replacing a `lb_decap` already there (`previous`). Returns the mode in use.
pub fn attach_decap(
    ifindex: u32,
    interface: &str,
    addrs: &[IpAddr],
    mode: AttachMode,
    previous: Option<&AttachedProgram>,
) -> Result<XdpAttached, DataplaneError> {
    let mut loader = EbpfLoader::new();
    for name in SHRUNK_MAPS {
        loader.map_max_entries(name, 1);
    }
    let mut ebpf = loader
        .load(crate::EBPF_OBJECT)
        .map_err(DataplaneError::Load)?;
    {
        let name = map_names::DECAP_ADDRS;
        let map = ebpf
            .map_mut(name)
            .ok_or(DataplaneError::MissingMap { name })?;
        let mut map: HashMap<_, DecapAddr, u32> = HashMap::try_from(map).map_err(map_err(name))?;
        for a in addrs {
            map.insert(&decap_key(*a), &1, 0).map_err(map_err(name))?;
        }
    }
    let name = DECAP_PROGRAM_NAME;
    let prog: &mut Xdp = super::program(&mut ebpf, name)?;
    prog.load()
        .map_err(|source| DataplaneError::Program { name, source })?;
    let fd = prog
        .fd()
        .map_err(|source| DataplaneError::Program { name, source })?;
    // The decapsulator has no mode flag.
    xdp::attach(fd.as_fd(), ifindex, interface, mode, previous, &mut || {
        Ok(())
    })
}
