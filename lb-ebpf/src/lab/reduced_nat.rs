//! Reduced programs for the nat new flow's two cold misses (`LB_FLOWS`, then `LB_NAT`):
//! what placed between two
//! independent cold reads keeps them from overlapping, and the real lookup/claim pair in
//! two orders. Benchmark only (`lb-components`), never attached.

use aya_ebpf::{btf_maps::Array, macros::btf_map, macros::xdp, programs::XdpContext};
use lb_common::{hash::table_hash, maps::NatValue};

use crate::{
    flow::{self, FlowTable},
    lab::reduced::{Line, NEVER, SEED_A, SEED_B, cas, line, reflect_after, word},
    nat::{NatTable, lb_nat_claim},
    slots::{self, Claim},
};

/// One hot line for the compare-and-swap between the two reads.
#[btf_map]
static LBRN_HOT: Array<Line, 1> = Array::new();

/// The two reads of `lbr_line2_indep` with `between` run after the first has issued:
/// line A, `between(hash B)` (its result picks line B), line B.
#[inline(always)]
fn two_reads(ctx: &XdpContext, between: impl FnOnce(u32) -> Option<u32>) -> u32 {
    reflect_after(ctx, |pkt, _| {
        let (ha, hb) = (table_hash(&pkt.key, SEED_A), table_hash(&pkt.key, SEED_B));
        let Some(a) = line(0, ha) else {
            return false;
        };
        let va = word::<0>(a);
        let Some(hb) = between(hb) else {
            return false;
        };
        let Some(b) = line(1, hb) else {
            return false;
        };
        va.wrapping_add(word::<0>(b)) != NEVER
    })
}

/// A BPF global function (a real call and `ret`, through the kernel's return thunk)
/// that hands its argument back.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lbrn_ident(x: u64) -> u64 {
    x ^ 1
}

/// A BPF global function that reads line B itself (as `lb_nat_claim` reads its bucket
/// behind a call).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lbrn_read_b(hb: u64) -> u64 {
    line(1, hb as u32).map_or(NEVER, word::<0>)
}

/// The two reads with a global-function call between them (line B's index is its
/// result).
#[xdp]
pub fn lbrn_call(ctx: XdpContext) -> u32 {
    two_reads(&ctx, |hb| Some(lbrn_ident(hb as u64) as u32))
}

/// Line A, then a global function that reads line B.
#[xdp]
pub fn lbrn_call_read(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        let (ha, hb) = (table_hash(&pkt.key, SEED_A), table_hash(&pkt.key, SEED_B));
        let Some(a) = line(0, ha) else {
            return false;
        };
        let va = word::<0>(a);
        va.wrapping_add(lbrn_read_b(hb as u64)) != NEVER
    })
}

/// The two reads with a `BPF_CMPXCHG` on a hot line between them (a `lock cmpxchg`:
/// the bucket lock a claim takes).
#[xdp]
pub fn lbrn_cas(ctx: XdpContext) -> u32 {
    two_reads(&ctx, |hb| {
        let hot = LBRN_HOT.get_ptr_mut(0)?;
        // Word 0 stays 0: the locked instruction without a change.
        cas(hot, 0, 0);
        Some(hb)
    })
}

/// The two reads with a branch on the first read's value between them (always the
/// same way: predicted).
#[xdp]
pub fn lbrn_branch(ctx: XdpContext) -> u32 {
    reflect_after(&ctx, |pkt, _| {
        let (ha, hb) = (table_hash(&pkt.key, SEED_A), table_hash(&pkt.key, SEED_B));
        let Some(a) = line(0, ha) else {
            return false;
        };
        if word::<0>(a) == NEVER {
            return false;
        }
        let Some(b) = line(1, hb) else {
            return false;
        };
        word::<0>(b) != NEVER
    })
}

macro_rules! x4 {
    ($s:expr) => {
        concat!($s, $s, $s, $s)
    };
}

/// 32 BPF ALU instructions in one dependent chain on `x`.
#[inline(always)]
fn alu32(x: u32) -> u32 {
    let mut v = x as u64;
    // SAFETY: register arithmetic only.
    unsafe {
        core::arch::asm!(
            x4!(x4!("{v} ^= 0x55\n{v} += 3\n")),
            v = inout(reg) v,
            options(nostack, nomem, pure),
        );
    }
    v as u32
}

/// 128 BPF ALU instructions in one dependent chain on `x`.
#[inline(always)]
fn alu128(x: u32) -> u32 {
    let mut v = x as u64;
    // SAFETY: register arithmetic only.
    unsafe {
        core::arch::asm!(
            x4!(x4!(x4!("{v} ^= 0x55\n{v} += 3\n"))),
            v = inout(reg) v,
            options(nostack, nomem, pure),
        );
    }
    v as u32
}

/// The two reads with 32 ALU instructions between them (line B's index depends on
/// them).
#[xdp]
pub fn lbrn_alu32(ctx: XdpContext) -> u32 {
    two_reads(&ctx, |hb| Some(alu32(hb)))
}

/// The two reads with 128 ALU instructions between them.
#[xdp]
pub fn lbrn_alu128(ctx: XdpContext) -> u32 {
    two_reads(&ctx, |hb| Some(alu128(hb)))
}

/// The two reads with 256 ALU instructions between them.
#[xdp]
pub fn lbrn_alu256(ctx: XdpContext) -> u32 {
    two_reads(&ctx, |hb| Some(alu128(alu128(hb))))
}

/// The two reads with 512 ALU instructions between them.
#[xdp]
pub fn lbrn_alu512(ctx: XdpContext) -> u32 {
    two_reads(&ctx, |hb| Some(alu128(alu128(alu128(alu128(hb))))))
}

/// A second key for the `LB_NAT` claim of the `lbrn_open_*` programs: the packet's own
/// with another destination port (its bucket is unrelated to its `LB_FLOWS` bucket,
/// as a reply key's is).
#[inline(always)]
fn nat_key(key: &lb_common::maps::FlowKey, salt: u16) -> lb_common::maps::FlowKey {
    let mut k = *key;
    k.dport ^= salt;
    k
}

/// What a nat SYN does in the two tables, in today's order: the `LB_FLOWS` lookup (a
/// miss), then the `LB_NAT` claim of an independent key (`XDP_DROP` if the lookup hit
/// or the claim found its bucket busy).
#[xdp]
pub fn lbrn_open_serial(ctx: XdpContext) -> u32 {
    let value = NatValue::default();
    reflect_after(&ctx, |pkt, _| {
        let k2 = nat_key(&pkt.key, 0x5a5a);
        flow::lookup(&pkt.key).is_none()
            && Claim::from_code(lb_nat_claim(&k2, &value, 0, 0)) != Claim::Busy
    })
}

/// [`lbrn_open_serial`] with both buckets' way words loaded first, back to back
/// (`slots::prefetch2`).
#[xdp]
pub fn lbrn_open_both(ctx: XdpContext) -> u32 {
    let value = NatValue::default();
    reflect_after(&ctx, |pkt, _| {
        let k2 = nat_key(&pkt.key, 0x3c3c);
        slots::prefetch2::<FlowTable, NatTable>(&pkt.key, &k2);
        flow::lookup(&pkt.key).is_none()
            && Claim::from_code(lb_nat_claim(&k2, &value, 0, 0)) != Claim::Busy
    })
}
