//! L2 direct server return: only the MACs change; the backend holds the VIP itself.

use aya_ebpf::bindings::xdp_action::XDP_TX;
use lb_common::{counters::TX_DSR, maps::Backend};

use crate::{Verdict, parse::Packet, rewrite::retarget_l2};

/// Sends the packet to the backend's MAC unchanged otherwise.
#[inline(always)]
pub fn forward(pkt: &Packet, backend: &Backend) -> Verdict {
    retarget_l2(pkt.eth, &backend.mac);
    Verdict::new(XDP_TX, TX_DSR)
}
