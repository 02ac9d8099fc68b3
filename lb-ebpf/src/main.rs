//! lb's XDP data plane: `lb_xdp` balances TCP/UDP to backends (dsr, nat or tunnel) — the hot
//! paths itself, every other packet through a tail call into `lb_xdp_full` ([`full_path`]) —, `lb_pass`
//! passes everything (for veth peers). The benchmarks' and test beds' programs (`lb_reflect`,
//! `lbr_*`, `lbt_*`) are in [`lab`], built only with the `lab` feature, which the product
//! build never enables.
//!
//! Layout: [`parse`] headers, [`vip`] which service a packet is for, [`partial_csum`] the
//! partial checksums native mode completes, [`validate`] what a VIP packet must pass, [`cached_flow`] a
//! cached flow's short path, [`forward`] the VIP path over [`flow`] (flow table and Maglev), [`dsr`] and [`nat`] the two
//! forwarding modes, [`rewrite`] header and checksum rewrites, [`icmp`] errors about
//! nat flows (believed signals, translation by [`icmp_nat`]), [`events`] and
//! [`counters`] the outputs, [`tunnel`] the ipip/gue encapsulation, [`too_big`] its
//! ICMP answer and [`tunnel_gso`] the tc program that sends merged segments out, [`decap`] the backends' `lb_decap`, [`clock`] the flow clock, [`maps`] every map, [`hash`] the flow
//! hash as the stack budget wants it, [`layout`] the tables' sizes and seeds set at load, [`stack_order`] its ordering hint, [`pkt`]
//! bounds-checked packet access.
#![no_std]
#![no_main]
// `slots` needs 64-bit atomics, which this target's `core::sync::atomic` leaves out.
#![feature(core_intrinsics, asm_experimental_arch)]
#![allow(internal_features)]
// Map keys and values are passed by reference on purpose: a by-value argument is one
// more copy on a 512-byte BPF stack.
#![allow(clippy::needless_borrows_for_generic_args)]

mod cache;
mod cached_flow;
mod clock;
mod conn_events;
mod counters;
mod decap;
mod dsr;
mod events;
mod flow;
mod forward;
mod full_path;
mod hash;
mod icmp;
mod icmp_nat;
#[cfg(feature = "lab")]
mod lab;
mod layout;
mod maps;
mod nat;
mod parse;
mod partial_csum;
mod peer;
mod peer_bounce;
mod pkt;
mod rewrite;
mod slots;
mod source;
mod stack_order;
mod too_big;
mod tunnel;
mod tunnel_gso;
mod validate;
mod vip;

use crate::{parse::Parsed, vip::Dest};
use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    macros::xdp,
    programs::XdpContext,
};
use lb_common::counters::{PASS_MALFORMED, PASS_NOT_VIP};

/// What to do with a packet, and the one outcome counter it increments.
#[derive(Clone, Copy)]
pub struct Verdict {
    pub action: u32,
    pub counter: u32,
}

impl Verdict {
    #[inline(always)]
    pub const fn new(action: u32, counter: u32) -> Self {
        Self { action, counter }
    }

    #[inline(always)]
    pub const fn pass(counter: u32) -> Self {
        Self::new(XDP_PASS, counter)
    }

    #[inline(always)]
    pub const fn drop(counter: u32) -> Self {
        Self::new(XDP_DROP, counter)
    }
}

/// The load balancer's entry, the program attached to the interface. Inlined into the
/// entry point the macro generates: called as a BPF subprogram it receives `data_end`
/// as a 32-bit argument whose zero-extension the verifier rejects (pointer arithmetic
/// on pkt_end). Serves the hot paths ([`hot`]); every other packet continues in
/// [`lb_xdp_full`] ([`full_path::enter`]), which counts its outcome.
#[xdp]
#[inline(always)]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    let verdict = match hot(&ctx) {
        Some(v) => v,
        None => full_path::enter(&ctx),
    };
    let verdict = tunnel::finish(&ctx, verdict);
    counters::count(verdict.counter);
    verdict.action
}

/// The whole path, from the start (parsing again): what `lb_xdp` hands over by a tail
/// call — new flows, handshakes and closes, flows this CPU has not cached, ICMP errors.
#[xdp]
#[inline(always)]
pub fn lb_xdp_full(ctx: XdpContext) -> u32 {
    let mut verdict = balance(&ctx);
    if verdict.action == peer::HANDOFF {
        verdict = peer::enter(&ctx);
    }
    let verdict = tunnel::finish(&ctx, verdict);
    counters::count(verdict.counter);
    verdict.action
}

/// Cluster mode: takes over a connection another node made, whose packet `lb_xdp_full`
/// handed over ([`peer`]), and continues in `lb_xdp_full` (which counts the outcome);
/// a take-over that failed counts its own.
#[xdp]
#[inline(always)]
pub fn lb_xdp_peer(ctx: XdpContext) -> u32 {
    let verdict = match peer::adopt(&ctx) {
        Some(v) => v,
        None => full_path::enter(&ctx),
    };
    counters::count(verdict.counter);
    verdict.action
}

/// What `lb_xdp` decides itself: a packet parsing passes, one to no service, a nat
/// reply, a VIP packet `validate::to_vip` refuses, a settled flow this CPU cached;
/// `None`: the packet needs the whole path.
#[inline(always)]
fn hot(ctx: &XdpContext) -> Option<Verdict> {
    let end = ctx.data_end();
    match parse::parse(ctx) {
        Parsed::Pass(counter) => Some(Verdict::pass(counter)),
        Parsed::Icmp(_) => None,
        Parsed::Flow(pkt) => match destination(&pkt, end) {
            Dest::Service(svc) => match validate::to_vip(&pkt, end) {
                Ok(l4) => cached_flow::forward(&pkt, l4, svc, end),
                Err(refused) => Some(refused),
            },
            Dest::NatCandidate => peer::settled_reply_missed(nat::settled_reply(&pkt, end)),
            Dest::Other => Some(not_ours(&pkt, end)),
        },
    }
}

#[inline(always)]
fn balance(ctx: &XdpContext) -> Verdict {
    let end = ctx.data_end();
    match parse::parse(ctx) {
        Parsed::Pass(counter) => Verdict::pass(counter),
        Parsed::Icmp(icmp) => icmp::handle(&icmp, end),
        Parsed::Flow(pkt) => match destination(&pkt, end) {
            Dest::Service(svc) => forward::for_service(&pkt, svc, end),
            Dest::NatCandidate => peer::reply_missed(nat::reply(&pkt, end)),
            Dest::Other => not_ours(&pkt, end),
        },
    }
}

/// Where a TCP/UDP packet is going ([`vip::dest`]); one for a service or a nat source
/// address has its checksum completed if it is partial ([`partial_csum`]).
#[inline(always)]
fn destination(pkt: &parse::Packet, end: usize) -> Dest {
    let dest = vip::dest(&pkt.key);
    if !matches!(dest, Dest::Other) {
        partial_csum::complete(pkt, end);
    }
    dest
}

/// A TCP/UDP packet to no service and no nat source address: the same outcome
/// `nat::reply` gives a packet it finds no entry for.
#[inline(always)]
fn not_ours(pkt: &parse::Packet, end: usize) -> Verdict {
    match pkt.l4(end) {
        Some(_) => Verdict::pass(PASS_NOT_VIP),
        None => Verdict::pass(PASS_MALFORMED),
    }
}

/// Passes every packet (attached to veth peers so that XDP_TX toward them is delivered).
#[xdp]
pub fn lb_pass(_ctx: XdpContext) -> u32 {
    XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
