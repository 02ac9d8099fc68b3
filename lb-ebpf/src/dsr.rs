//! L2 direct server return: only the MACs change; the backend holds the VIP itself.

use aya_ebpf::bindings::xdp_action::XDP_TX;
use lb_common::{counters::TX_DSR, maps::Backend};

use crate::{Verdict, parse::Packet, rewrite::retarget_l2};

/// Sends the packet to the backend's MAC unchanged otherwise.
#[inline(always)]
pub fn forward(pkt: &Packet, backend: &Backend) -> Verdict {
    forward_with(pkt, backend, TX_DSR)
}

/// [`forward`], counted as `counter` (the settled-flow path's cache outcome).
#[inline(always)]
pub fn forward_with(pkt: &Packet, backend: &Backend, counter: u32) -> Verdict {
    retarget_l2(pkt.eth, &backend.mac);
    Verdict::new(XDP_TX, counter)
}
