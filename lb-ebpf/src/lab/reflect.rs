//! `lb_reflect`: the bare XDP_TX reflector, the floor the benchmarks compare the balancer with.

use aya_ebpf::{
    bindings::xdp_action::{XDP_PASS, XDP_TX},
    macros::xdp,
    programs::XdpContext,
};

use crate::{
    parse::{ETH_DST, ETH_HLEN, ETH_SRC},
    pkt::ptr_at,
};

/// Swaps the Ethernet addresses and transmits: the cheapest possible XDP_TX program,
/// the floor the balancer's per-packet cost is compared with.
#[xdp]
pub fn lb_reflect(ctx: XdpContext) -> u32 {
    let Some(eth) = ptr_at::<ETH_HLEN>(ctx.data(), ctx.data_end()) else {
        return XDP_PASS;
    };
    // Byte-array copies, not `Hdr::mac`'s scalar accesses: the cheaper of the two in
    // this program, and the code BENCHMARKS.md's floor figures are of.
    let at = eth.as_ptr();
    // SAFETY: the 14 bytes of the Ethernet header were bounds-checked above.
    unsafe {
        let dst = core::ptr::read_unaligned(at.add(ETH_DST).cast::<[u8; 6]>());
        let src = core::ptr::read_unaligned(at.add(ETH_SRC).cast::<[u8; 6]>());
        core::ptr::write_unaligned(at.add(ETH_DST).cast::<[u8; 6]>(), src);
        core::ptr::write_unaligned(at.add(ETH_SRC).cast::<[u8; 6]>(), dst);
    }
    XDP_TX
}
