//! Reduced XDP programs for `lb-bench --components`: each is the reflector plus one cost
//! component of `lb_xdp`, so that the component's price is measured on the same packets,
//! in the same run, as the floor (BENCHMARKS.md §1). Never attached by the agent.
//!
//! Each parses the packet with the balancer's own `parse`, does its one thing, then swaps
//! the MACs and returns `XDP_TX` — or `XDP_DROP` where the component failed or missed, so
//! the benchmark checks that the case measured what it claims (a hit is a hit).

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    helpers::{bpf_jiffies64, bpf_ktime_get_ns},
    macros::xdp,
    programs::XdpContext,
};
use lb_common::{
    events::PassiveEvent,
    maps::{FlowValue, NatValue},
};

use crate::{
    counters, flow,
    maps::LB_EVENTS,
    nat::NatTable,
    parse::{self, ETH_DST, ETH_HLEN, ETH_SRC, Packet, Parsed},
    pkt::ptr_at,
    rewrite,
    slots::{self, Claim},
    vip::{self, Dest},
};

/// Parses, runs `component` on a TCP/UDP packet, swaps the MACs: `XDP_TX` if the
/// component succeeded, `XDP_DROP` if not; anything else is passed.
#[inline(always)]
fn reflect_after(ctx: &XdpContext, component: impl FnOnce(&Packet, usize) -> bool) -> u32 {
    let end = ctx.data_end();
    let Parsed::Flow(pkt) = parse::parse(ctx) else {
        return XDP_PASS;
    };
    let ok = component(&pkt, end);
    let Some(eth) = ptr_at::<ETH_HLEN>(ctx.data(), end) else {
        return XDP_PASS;
    };
    let dst = eth.mac::<ETH_DST>();
    let src = eth.mac::<ETH_SRC>();
    eth.set_mac::<ETH_DST>(&src);
    eth.set_mac::<ETH_SRC>(&dst);
    if ok { XDP_TX } else { XDP_DROP }
}

/// `XDP_TX` and nothing else (not even the MAC swap).
#[xdp]
pub fn lbr_tx(_ctx: XdpContext) -> u32 {
    XDP_TX
}

/// The balancer's parse (with its `LB_CONFIG` MAC check and flow key), then reflect.
#[xdp]
pub fn lbr_parse(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |_, _| true)
}

/// Parse + the VIP index lookup (`vip::dest`: hash, bucket read, nat port range);
/// `XDP_DROP` unless the packet is for no service and no nat source address.
#[xdp]
pub fn lbr_vip(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| matches!(vip::dest(&pkt.key), Dest::Other))
}

/// Parse + one outcome counter (a per-CPU array increment).
#[xdp]
pub fn lbr_counter(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |_, _| {
        counters::count(lb_common::counters::PASS_NOT_VIP);
        true
    })
}

/// Parse + `bpf_jiffies64` (the verifier inlines it).
#[xdp]
pub fn lbr_jiffies(ctx: XdpContext) -> u32 {
    // SAFETY: a helper without preconditions.
    reflect_after(&ctx, |_, _| unsafe { bpf_jiffies64() } != 0)
}

/// Parse + `bpf_ktime_get_ns` (a helper call).
#[xdp]
pub fn lbr_ktime(ctx: XdpContext) -> u32 {
    // SAFETY: a helper without preconditions.
    reflect_after(&ctx, |_, _| unsafe { bpf_ktime_get_ns() } != 0)
}

/// Parse + one `LB_FLOWS` lookup with the packet's 40-byte key, as `flow::lookup` does
/// (`XDP_DROP` on a miss).
#[xdp]
pub fn lbr_flow_lookup(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| flow::lookup(&pkt.key).is_some())
}

/// Parse + one claim of a new key in `LB_FLOWS`, as `flow::pin` does (`XDP_DROP` if
/// the key exists or the claim evicted a flow: the benchmark's table must have room).
#[xdp]
pub fn lbr_flow_insert(ctx: XdpContext) -> u32 {
    let value = FlowValue {
        backend_id: 1,
        ..FlowValue::default()
    };
    reflect_after(&ctx, |pkt, _| {
        Claim::from_code(flow::lb_flow_claim(&pkt.key, &value, 0)) == Claim::Fresh
    })
}

/// Parse + what a new flow does in `LB_FLOWS`: the lookup (a miss) and the claim of
/// a way in the bucket it just read (`XDP_DROP` if the key was found or the claim did
/// not take a free way).
#[xdp]
pub fn lbr_flow_open(ctx: XdpContext) -> u32 {
    let value = FlowValue {
        backend_id: 1,
        ..FlowValue::default()
    };
    reflect_after(&ctx, |pkt, _| {
        flow::lookup(&pkt.key).is_none()
            && Claim::from_code(flow::lb_flow_claim(&pkt.key, &value, 0)) == Claim::Fresh
    })
}

/// Parse + one claim of a new key in `LB_NAT` (bucket lock, way scan, slot write, as
/// `nat::allocate` claims a reverse entry); `XDP_DROP` if the key exists or its bucket
/// is full of live entries (the benchmark's table holds none that may be reused).
#[xdp]
pub fn lbr_nat_insert(ctx: XdpContext) -> u32 {
    let value = NatValue::default();
    reflect_after(&ctx, |pkt, _| {
        slots::claim::<NatTable>(&pkt.key, &value, false, |_, _| false, slots::NO_EVICTION)
            == Claim::Fresh
    })
}

/// Parse + one `LB_NAT` lookup (`XDP_DROP` on a miss), as a nat reply does.
#[xdp]
pub fn lbr_nat_lookup(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| crate::nat::entry(&pkt.key).is_some())
}

/// Parse + nat's address/port rewrite with both RFC 1624 checksum updates (the
/// packet's own tuple reversed, as a translation to somewhere else).
#[xdp]
pub fn lbr_translate(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, end| {
        let Some(l4) = pkt.l4(end) else {
            return false;
        };
        let k = &pkt.key;
        rewrite::translate(pkt, l4, &k.dst, k.dport, &k.src, k.sport, end).is_some()
    })
}

/// Parse + one ring-buffer record as `events::emit` sends it (`bpf_ringbuf_output`);
/// `XDP_DROP` when the ring is full (the benchmark drains it between blocks).
#[xdp]
pub fn lbr_ring_output(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        let event = PassiveEvent {
            kind: 1,
            backend_id: pkt.key.sport as u32,
            service_id: 0,
            _pad: 0,
            timestamp_ns: 0,
        };
        LB_EVENTS.output(&event, 0).is_ok()
    })
}
