//! The split between the two XDP programs: the attached `lb_xdp` serves the hot paths
//! itself (a packet to no service, a nat reply, a settled flow from this CPU's cache,
//! a VIP packet `validate::to_vip` refuses) and hands every other packet to
//! `lb_xdp_full`, the whole path, by a tail call through `LB_PROGRAMS`.
//! docs/internals/fast-path.md, "Two programs".

use aya_ebpf::programs::XdpContext;
use lb_common::{FULL_PATH_INDEX, counters::DROP_NO_FULL_PATH};

use crate::{Verdict, maps::LB_PROGRAMS};

/// Continues this packet in `lb_xdp_full` (which counts its outcome); returns only if
/// the tail call failed (`LB_PROGRAMS` empty: the loader fills it before attaching,
/// so this is a bug or a hand-made load), then the packet is dropped and counted
/// `DROP_NO_FULL_PATH` — a VIP packet handed to the host stack could be answered by
/// it (a reset for a live connection), a drop is retransmitted.
#[inline(always)]
pub fn enter(ctx: &XdpContext) -> Verdict {
    // SAFETY: the tail call replaces this program by `lb_xdp_full` on the same context,
    // or returns without effect.
    unsafe { LB_PROGRAMS.tail_call(ctx, FULL_PATH_INDEX) };
    Verdict::drop(DROP_NO_FULL_PATH)
}
