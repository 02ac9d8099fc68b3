//! Reduced XDP programs for `lb-bench --components`: each is the reflector plus one cost
//! component of `lb_xdp`, so that the component's price is measured on the same packets,
//! in the same run, as the floor (BENCHMARKS.md §1). Never attached by the agent.
//!
//! Each parses the packet with the balancer's own `parse`, does its one thing, then swaps
//! the MACs and returns `XDP_TX` — or `XDP_DROP` where the component failed or missed, so
//! the benchmark checks that the case measured what it claims (a hit is a hit).

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    btf_maps::{Array, ProgramArray},
    helpers::{bpf_get_smp_processor_id, bpf_jiffies64, bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use lb_common::{
    BPF_F_MMAPABLE,
    events::PassiveEvent,
    hash::table_hash,
    maps::{BACKEND_F_LIVE, BACKEND_F_SERVING, FlowKey, FlowValue, NatValue},
};

use crate::{
    cache, counters, flow,
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
pub(crate) fn reflect_after(
    ctx: &XdpContext,
    component: impl FnOnce(&Packet, usize) -> bool,
) -> u32 {
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

/// The established path's per-CPU cache step without its counters: the tick, the cache
/// slot's hash, read and key compare (`cache::hit`), the backend's read and
/// `LIVE|SERVING` check, and the MAC rewrite toward it (`retarget_l2`). A miss (the
/// first packet of each tick) fills the slot for backend 1 and goes on, so every call
/// succeeds once `LB_BACKENDS[1]` is live and serving.
#[inline(always)]
fn cache_step(pkt: &Packet) -> bool {
    let tick = crate::clock::tick();
    let id = match cache::hit(&pkt.key, tick) {
        Some(hit) => hit.backend_id,
        None => {
            cache::fill(&pkt.key, 1, tick, crate::nat::Source { addr: 0, port: 0 });
            1
        }
    };
    let Some(b) = flow::any_backend(id) else {
        return false;
    };
    if b.flags & (BACKEND_F_LIVE | BACKEND_F_SERVING) != BACKEND_F_LIVE | BACKEND_F_SERVING {
        return false;
    }
    rewrite::retarget_l2(pkt.eth, &b.mac);
    true
}

/// Parse + [`cache_step`] (its MAC rewrite instead of the swap).
#[xdp]
pub fn lbr_cache(ctx: XdpContext) -> u32 {
    let Parsed::Flow(pkt) = parse::parse(&ctx) else {
        return XDP_PASS;
    };
    if cache_step(&pkt) { XDP_TX } else { XDP_DROP }
}

/// The established dsr path's parts in one program: parse, a VIP index probe (a miss:
/// `lb-components` configures no service; the probe reads one empty way), the cache
/// step, the two stats updates and the one outcome counter a cached dsr packet makes.
/// Against `lb_xdp`'s established dsr case: what the whole costs beyond its parts.
#[xdp]
pub fn lbr_established(ctx: XdpContext) -> u32 {
    let Parsed::Flow(pkt) = parse::parse(&ctx) else {
        return XDP_PASS;
    };
    if !matches!(vip::dest(&pkt.key), Dest::Other) || !cache_step(&pkt) {
        return XDP_DROP;
    }
    counters::service_packet(1, pkt.len, false);
    counters::backend_packet(1, pkt.len, false);
    counters::count(lb_common::counters::TX_DSR_CACHED);
    XDP_TX
}

/// The established dsr path's parts with a VIP index hit (`lb-components` configures
/// the service of its `hit` packet): [`cache_step`], the stats of the service found,
/// the cache outcome. `XDP_DROP` unless the packet is for a service.
#[xdp]
pub fn lbr_est_hit(ctx: XdpContext) -> u32 {
    let Parsed::Flow(pkt) = parse::parse(&ctx) else {
        return XDP_PASS;
    };
    let Dest::Service(svc) = vip::dest(&pkt.key) else {
        return XDP_DROP;
    };
    if !cache_step(&pkt) {
        return XDP_DROP;
    }
    counters::service_packet(svc.service_id, pkt.len, false);
    counters::backend_packet(1, pkt.len, false);
    counters::count(lb_common::counters::TX_DSR_CACHED);
    XDP_TX
}

/// [`lbr_est_hit`] + `validate::to_vip` (the L4 length, TTL and flag checks).
#[xdp]
pub fn lbr_est_checked(ctx: XdpContext) -> u32 {
    let end = ctx.data_end();
    let Parsed::Flow(pkt) = parse::parse(&ctx) else {
        return XDP_PASS;
    };
    let Dest::Service(svc) = vip::dest(&pkt.key) else {
        return XDP_DROP;
    };
    if crate::validate::to_vip(&pkt, end).is_err() || !cache_step(&pkt) {
        return XDP_DROP;
    }
    counters::service_packet(svc.service_id, pkt.len, false);
    counters::backend_packet(1, pkt.len, false);
    counters::count(lb_common::counters::TX_DSR_CACHED);
    XDP_TX
}

/// Parse, the VIP hit and the real `forward::for_service` (the settled-flow path, else
/// `validate` and `to_service`: `LB_FLOWS`, pinned, new flows, all of it inlined), its
/// verdict counted: `lb_xdp`
/// without the ICMP branch and the non-service outcomes. Inlined into the entry point,
/// as `lb_xdp` is (a subprogram would receive `data_end` as a 32-bit argument).
#[xdp]
#[inline(always)]
pub fn lbr_est_service(ctx: XdpContext) -> u32 {
    let end = ctx.data_end();
    let Parsed::Flow(pkt) = parse::parse(&ctx) else {
        return XDP_PASS;
    };
    let Dest::Service(svc) = vip::dest(&pkt.key) else {
        return XDP_DROP;
    };
    let v = crate::forward::for_service(&pkt, svc, end);
    counters::count(v.counter);
    v.action
}

/// Parse + the two stats updates every forwarded packet makes (`service_packet`,
/// `backend_packet`: per-service and per-backend packets and bytes).
#[xdp]
pub fn lbr_stats(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        counters::service_packet(1, pkt.len, false);
        counters::backend_packet(1, pkt.len, false);
        true
    })
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
        slots::claim::<NatTable>(
            &pkt.key,
            &value,
            |_, _| false,
            |_, _| false,
            slots::NO_EVICTION,
        ) == Claim::Fresh
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

/// One cache line of the cold-line arrays.
pub type Line = [u64; 8];

/// The cold-line arrays (`lbr_line*`): one entry here, so that loading the object for the
/// balancer costs nothing; `lb-components` sets both to 150 MiB (`map_max_entries`)
/// before loading and chooses how many lines each program reaches in [`LBR_LINES_N`].
/// Mmapable only so that `lb-components` can bring a case's lines into the caches from
/// userspace first (the kernel backs either kind with 4 KiB vmalloc pages).
#[btf_map]
static LBR_LINES_A: Array<Line, 1, { BPF_F_MMAPABLE as usize }> = Array::new();
/// The second array, for the two-read programs (another table, as `LB_NAT` is for a
/// nat SYN that also reads `LB_FLOWS`).
#[btf_map]
static LBR_LINES_B: Array<Line, 1, { BPF_F_MMAPABLE as usize }> = Array::new();
/// Lines of `LBR_LINES_A` (entry 0) and `LBR_LINES_B` (entry 1) the programs index:
/// the table size measured (1 = always line 0, a hot line); entry 2: the log2 of the
/// stride between the lines of `LBR_LINES_A` that `lbr_line` reads (0: adjacent lines;
/// 6: one line per 4 KiB page).
#[btf_map]
static LBR_LINES_N: Array<u32, 3> = Array::new();

/// Seeds of the two arrays' indexes (the packet's key hashed as `LB_FLOWS` hashes it).
pub(crate) const SEED_A: u32 = 0x6c07_8965;
pub(crate) const SEED_B: u32 = 0x2f69_3a4d;

/// A value no program writes (the read must be used, or LLVM drops it).
pub(crate) const NEVER: u64 = u64::MAX;

/// The line of `LBR_LINES_A`/`_B` (`which` = 0/1) at `hash` spread over the configured
/// lines (`hash * n >> 32`: uniform for any `n`, not only powers of two), times the
/// configured stride in `LBR_LINES_A`.
#[inline(always)]
pub(crate) fn line(which: u32, hash: u32) -> Option<*mut Line> {
    let n = *LBR_LINES_N.get(which)?;
    let i = ((hash as u64 * n as u64) >> 32) as u32;
    if which == 0 {
        let shift = *LBR_LINES_N.get(2)? & 15;
        LBR_LINES_A.get_ptr_mut(i << shift)
    } else {
        LBR_LINES_B.get_ptr_mut(i)
    }
}

/// Word `W` of a line, as a fresh load.
#[inline(always)]
pub(crate) fn word<const W: usize>(l: *mut Line) -> u64 {
    // SAFETY: a map value that lives as long as the program.
    unsafe { core::ptr::read_volatile(&raw const (*l)[W]) }
}

/// Parse + one read of the line the packet's key hashes to in `LBR_LINES_A`: with
/// distinct packets, a new random line per call, as a new flow's bucket is.
#[xdp]
pub fn lbr_line(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        line(0, table_hash(&pkt.key, SEED_A)).is_some_and(|l| word::<0>(l) != NEVER)
    })
}

/// Parse + one read of each of four adjacent lines (a 256-byte block, as the four ways'
/// words of an `LB_FLOWS` bucket are 72 bytes apart): the line index is rounded down to
/// a multiple of four.
#[xdp]
pub fn lbr_line4(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        let Some(n) = LBR_LINES_N.get(0) else {
            return false;
        };
        let i = ((table_hash(&pkt.key, SEED_A) as u64 * *n as u64) >> 32) as u32 & !3;
        let (Some(a), Some(b), Some(c), Some(d)) = (
            LBR_LINES_A.get_ptr_mut(i),
            LBR_LINES_A.get_ptr_mut(i + 1),
            LBR_LINES_A.get_ptr_mut(i + 2),
            LBR_LINES_A.get_ptr_mut(i + 3),
        ) else {
            return false;
        };
        (word::<0>(a) | word::<1>(b) | word::<2>(c) | word::<3>(d)) != NEVER
    })
}

/// Parse + one read in each array, the second index independent of the first read
/// (both misses can be in flight at once).
#[xdp]
pub fn lbr_line2_indep(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        let (ha, hb) = (table_hash(&pkt.key, SEED_A), table_hash(&pkt.key, SEED_B));
        let (Some(a), Some(b)) = (line(0, ha), line(1, hb)) else {
            return false;
        };
        word::<0>(a).wrapping_add(word::<0>(b)) != NEVER
    })
}

/// Parse + one read in each array, the second index taken from the first read's value
/// (the second miss starts only when the first has returned).
#[xdp]
pub fn lbr_line2_dep(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        let Some(a) = line(0, table_hash(&pkt.key, SEED_A)) else {
            return false;
        };
        let v = word::<0>(a);
        let Some(b) = line(1, table_hash(&pkt.key, SEED_B) ^ v as u32) else {
            return false;
        };
        word::<0>(b) != NEVER
    })
}

/// `BPF_CMPXCHG` on word 0 of a line: whether it held `old` (it now holds `new`).
/// Assembly for the reason given in `slots`.
#[inline(always)]
pub(crate) fn cas(l: *mut Line, old: u64, new: u64) -> bool {
    let mut seen = old;
    // SAFETY: word 0 of a map value, 8-byte aligned; touches only it and r0.
    unsafe {
        core::arch::asm!(
            "r0 = cmpxchg_64({p} + 0, r0, {n})",
            p = in(reg) &raw mut (*l)[0],
            n = in(reg) new,
            inout("r0") seen,
            options(nostack),
        );
    }
    seen == old
}

/// Parse + a claim's memory work on one random line of `LBR_LINES_A`: read word 0,
/// compare-and-swap it (the lock), write the packet's key into the line, then the word
/// again with an atomic exchange (the unlock) — what a table claim adds to its cold
/// read, without the way scan.
#[xdp]
pub fn lbr_line_claim(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        let Some(l) = line(0, table_hash(&pkt.key, SEED_A)) else {
            return false;
        };
        let old = word::<0>(l);
        if old == NEVER || !cas(l, old, old | 2) {
            return false;
        }
        // SAFETY: the line is a map value; `FlowKey` is 40 bytes, within words 1..6.
        unsafe {
            core::ptr::write_unaligned((&raw mut (*l)[1]).cast::<FlowKey>(), pkt.key);
            core::intrinsics::atomic_xchg::<u64, { core::intrinsics::AtomicOrdering::SeqCst }>(
                &raw mut (*l)[0],
                (old & !2).wrapping_add(4),
            );
        }
        true
    })
}

/// Parse + `bpf_ktime_get_coarse_ns` (a helper call; the tick's time, no clocksource read).
#[xdp]
pub fn lbr_ktime_coarse(ctx: XdpContext) -> u32 {
    // SAFETY: a helper without preconditions.
    reflect_after(&ctx, |_, _| unsafe { bpf_ktime_get_coarse_ns() } != 0)
}

/// Parse + `bpf_get_smp_processor_id` (the verifier inlines it on x86-64).
#[xdp]
pub fn lbr_cpu_id(ctx: XdpContext) -> u32 {
    // SAFETY: a helper without preconditions.
    reflect_after(&ctx, |_, _| unsafe { bpf_get_smp_processor_id() } < 4096)
}

/// [`lbr_line`] with a prefetch of the line first (`core::intrinsics::prefetch_read_data`):
/// BPF has no prefetch instruction, so LLVM's BPF backend emits nothing for it and
/// this program is `lbr_line` again (`lb-components --xlated FILE --program
/// lbr_line_prefetch` shows no instruction for it).
#[xdp]
pub fn lbr_line_prefetch(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        let Some(l) = line(0, table_hash(&pkt.key, SEED_A)) else {
            return false;
        };
        core::intrinsics::prefetch_read_data::<Line, 3>(l);
        word::<0>(l) != NEVER
    })
}

/// `lbr_tx` at 0 and `lbr_vip` at 1, filled by `lb-components`: the targets of the
/// tail-call programs below.
#[btf_map]
static LBR_TAIL: ProgramArray<2> = ProgramArray::new();

/// A tail call into `lbr_tx` (`LBR_TAIL[0]`): the tail call's own price, next to
/// `lbr_tx`. `XDP_DROP` if it failed.
#[xdp]
pub fn lbr_tail_tx(ctx: XdpContext) -> u32 {
    // SAFETY: replaces this program by `lbr_tx` on the same context, or returns.
    unsafe { LBR_TAIL.tail_call(&ctx, 0) };
    XDP_DROP
}

/// Parses and misses the VIP index, then tail-calls `lbr_vip` (`LBR_TAIL[1]`), which
/// parses and misses again and reflects: next to `lbr_vip`, what a packet `lb_xdp`
/// hands to `lb_xdp_full` pays for the hand-over (the tail call, the second parse and
/// VIP probe). `XDP_DROP` if the tail call failed.
#[xdp]
pub fn lbr_tail_vip(ctx: XdpContext) -> u32 {
    let Parsed::Flow(pkt) = parse::parse(&ctx) else {
        return XDP_PASS;
    };
    if !matches!(vip::dest(&pkt.key), Dest::Other) {
        return XDP_PASS;
    }
    // SAFETY: as in `lbr_tail_tx`.
    unsafe { LBR_TAIL.tail_call(&ctx, 1) };
    XDP_DROP
}
