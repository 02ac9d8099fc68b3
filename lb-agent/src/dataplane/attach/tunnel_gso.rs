//! `lb_tunnel_gso` on the interface's tc ingress (TCX), beside a program attached in
//! generic mode: it sends out the tunnel services' merged segments, which the XDP
//! program encapsulated and passed (docs/tunnel.md, "Offloads"). The link lives as long
//! as the agent; without it such packets, addressed to another host's MAC, are dropped
//! by the kernel.

use aya::{
    Ebpf,
    programs::{LinkOrder, SchedClassifier, TcAttachType, tc::TcAttach},
};
use lb_common::TUNNEL_GSO_PROGRAM_NAME;

use crate::dataplane::DataplaneError;

/// Loads `lb_tunnel_gso` from `ebpf` and attaches it to the ingress of `ifindex`.
pub fn attach(ebpf: &mut Ebpf, ifindex: u32) -> Result<(), DataplaneError> {
    let name = TUNNEL_GSO_PROGRAM_NAME;
    let prog: &mut SchedClassifier = super::program(ebpf, name)?;
    prog.load()
        .map_err(|source| DataplaneError::Program { name, source })?;
    prog.attach(
        ifindex,
        TcAttach::Tcx {
            attach_type: TcAttachType::Ingress,
            order: LinkOrder::default(),
        },
    )
    .map_err(|source| DataplaneError::Program { name, source })?;
    Ok(())
}
