//! The flow table and backend choice: pinned flows, Maglev slot lookup, liveness.
//!
//! Rules for a pinned backend (`forward::keeps`): one in traffic (`BACKEND_F_SERVING`)
//! keeps every flow; one that left traffic for a health or membership reason
//! (`BACKEND_F_LIVE` only) keeps its TCP connections, while a SYN and UDP flows re-hash;
//! without `BACKEND_F_LIVE` (down, removed, MAC unknown) every flow re-hashes through the
//! service's current Maglev table and is re-pinned. If that table offers no live backend
//! the packet is dropped (`DROP_NO_BACKEND`) and the flow entry is kept, so it returns
//! to its backend if that one comes back before the entry ages out. A table slot's
//! backend is taken as serving (the agent puts only serving backends in the table).

use lb_common::{
    MAGLEV_BLOCK_SLOTS, NO_BACKEND,
    counters::{DROP_BAD_BACKEND, DROP_NO_BACKEND, FLOW_EVICTED, FLOW_UNPINNED},
    hash::{SEED_MAGLEV, table_hash},
    maglev_block_index,
    maps::{
        BACKEND_F_LIVE, Backend, FLOW_F_UNCONFIRMED, FLOW_F_UNPROVEN, FlowKey, FlowValue,
        ServiceMeta,
    },
    table::{FlowBucket, flow_reclaimable},
};

use crate::{
    counters,
    hash::flow_hash,
    layout,
    maps::{LB_BACKENDS, LB_FLOWS, LB_MAGLEV, LB_MAGLEV_GEN},
    slots::{self, Claim},
};

/// How long an established flow must have been silent before a nat SYN may take its
/// way (docs/internals/fast-path.md, "Floods"): a flood cannot push out flows that are talking,
/// and a real client's SYN is refused only while all four flows of its bucket are.
pub const NAT_SYN_EVICTS_IDLE_NS: u64 = 10_000_000_000;

/// `last_seen_ns` is rewritten at most this often, to spare cache-line writes.
pub const REFRESH_NS: u64 = 1_000_000_000;

/// `LB_FLOWS` as a [`slots::Table`].
pub struct FlowTable;

impl slots::Table for FlowTable {
    type Value = FlowValue;

    #[inline(always)]
    fn hash(key: &FlowKey) -> u32 {
        table_hash(key, layout::flow_seed())
    }

    #[inline(always)]
    fn index(hash: u32) -> u32 {
        hash & layout::flow_mask()
    }

    #[inline(always)]
    fn at(index: u32) -> Option<*mut FlowBucket> {
        LB_FLOWS.get_ptr_mut(index)
    }
}

// As `LB_NAT`'s (see `nat`), the bucket scans are BPF global functions: the verifier
// checks each once, not once per caller (the flow is looked up from the forward path,
// the nat reply path and the ICMP path).

/// `slots::find` in `LB_FLOWS`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_flow_find(key: *const FlowKey) -> u64 {
    if key.is_null() {
        return slots::NOT_FOUND;
    }
    slots::find::<FlowTable>(key)
}

/// `slots::claim_admitted` in `LB_FLOWS`: a free way, else one whose flow is idle or
/// whose handshake or proof failed (`flow_reclaimable` at `now_ns`), else the way of the
/// oldest unconfirmed flow (displaced), else the way of the confirmed flow idle longest
/// (evicted). An unconfirmed flow (`FLOW_F_UNCONFIRMED`: a SYN's waiting for its
/// handshake, or one opened by another packet waiting for its proof) takes a free way
/// only while fewer than `PENDING_WAYS_MAX` ways of its bucket hold unconfirmed flows,
/// and a confirmed flow's way never in dsr, in nat only one silent for
/// `NAT_SYN_EVICTS_IDLE_NS`. A key already present (another CPU pinned it meanwhile) is
/// kept. The result is `Claim::code`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_flow_claim(key: *const FlowKey, value: *const FlowValue, now_ns: u64) -> u64 {
    if key.is_null() || value.is_null() {
        return Claim::Busy.code();
    }
    // SAFETY: non-NULL pointers the verifier checked to cover the types' sizes.
    let (key, value) = unsafe { (&*key, &*value) };
    let age = |v: &FlowValue| {
        // Signed: another CPU's clock may have written a stamp a tick ahead.
        let idle = now_ns.wrapping_sub(v.last_seen_ns) as i64;
        if idle > 0 { idle as u64 } else { 0 }
    };
    let pending = |v: &FlowValue| v.flags & FLOW_F_UNCONFIRMED != 0;
    // An unconfirmed flow takes a confirmed flow's way only in nat (unpinned, its next
    // packet would get another source: the connection would fail), and only one silent
    // for `NAT_SYN_EVICTS_IDLE_NS`; in dsr never (unpinned, it is forwarded by its
    // Maglev choice, and a later packet pins it).
    let limit = if !pending(value) {
        0
    } else if value.nat_port != 0 {
        NAT_SYN_EVICTS_IDLE_NS
    } else {
        u64::MAX
    };
    slots::claim_admitted::<FlowTable>(
        key,
        value,
        |_, _| false,
        |v, _| flow_reclaimable(v, now_ns),
        Some(age),
        pending,
        limit,
    )
    .code()
}

/// The pinned flow entry for `key`, if any: a pointer into its way of `LB_FLOWS`,
/// whose fields are read and updated in place (a way rewritten under it by another
/// CPU's eviction at worst misroutes this one packet, as with the LRU map's reuse).
#[inline(always)]
pub fn lookup(key: &FlowKey) -> Option<*mut FlowValue> {
    slots::value_at::<FlowTable>(lb_flow_find(key)).map(|v| v as *mut FlowValue)
}

/// Pins a new flow (stamped `value.last_seen_ns`) as [`lb_flow_claim`] admits it; a
/// confirmed flow evicted is counted `FLOW_EVICTED` (an unconfirmed one displaced is
/// not). A key another CPU pinned meanwhile is kept (the same Maglev choice). A bucket
/// another CPU is writing at this instant is not waited for: the packet is forwarded
/// anyway and the flow's next packet pins it. `false` only when the flow was refused:
/// it is unconfirmed and its bucket is full of confirmed flows.
#[inline(always)]
pub fn insert(key: &FlowKey, value: &FlowValue) -> bool {
    let code = Claim::from_code(lb_flow_claim(key, value, value.last_seen_ns));
    if code == Claim::Evicted {
        counters::count(FLOW_EVICTED);
    }
    code != Claim::Full
}

/// Backend `id` whatever its flags (the caller checks them).
///
/// Array slots are preallocated and never freed, so the reference stays valid; the
/// agent may rewrite a slot concurrently, which at worst sends this one packet by the
/// old or new values (they are read field by field, not copied: BPF stack is scarce).
#[inline(always)]
pub fn any_backend(id: u32) -> Option<&'static Backend> {
    // SAFETY: see above.
    LB_BACKENDS.get_ptr(id).map(|b| unsafe { &*b })
}

/// The backend id in `key`'s slot of service `svc`'s live Maglev table, not yet
/// checked: [`slot_backend`] completes the choice.
///
/// The table pair's place and size come from the service's VIP slot (`maglev_base`,
/// `maglev_size`), so they change atomically with it; a resized service gets a new pair
/// and a new slot. The generation is read once, then one slot of that table: a packet
/// sees one published table or the next, never a mix. A service with no table yet
/// (size 0) or a pair outside the pool is `DROP_NO_BACKEND`. Separate from
/// [`slot_backend`] so that a caller can issue this load early and use its value later:
/// the slot is a random 4 bytes of a table of up to 1 MiB, a cache miss for nearly
/// every new flow.
#[inline(always)]
pub fn maglev_slot(svc: &ServiceMeta, key: &FlowKey) -> Result<u32, u32> {
    let size = svc.maglev_size;
    if size == 0 {
        return Err(DROP_NO_BACKEND);
    }
    let slot = flow_hash(key, SEED_MAGLEV) % size;
    let generation = *LB_MAGLEV_GEN.get(svc.service_id).ok_or(DROP_NO_BACKEND)?;
    let block = LB_MAGLEV
        .get(maglev_block_index(svc.maglev_base, size, generation, slot))
        .ok_or(DROP_NO_BACKEND)?;
    Ok(block[(slot % MAGLEV_BLOCK_SLOTS) as usize])
}

/// The live backend a Maglev slot names. Errors with the drop counter: an empty slot (a
/// table never published is all `NO_BACKEND`) or a backend that is not live is
/// `DROP_NO_BACKEND`; an id outside `LB_BACKENDS` is `DROP_BAD_BACKEND`.
#[inline(always)]
pub fn slot_backend(id: u32) -> Result<(u32, &'static Backend), u32> {
    if id == NO_BACKEND {
        return Err(DROP_NO_BACKEND);
    }
    let b = any_backend(id).ok_or(DROP_BAD_BACKEND)?;
    if b.flags & BACKEND_F_LIVE == 0 {
        return Err(DROP_NO_BACKEND);
    }
    Ok((id, b))
}

/// Counts a new flow forwarded without an entry (dsr, tunnel: [`insert`] refused it).
#[inline(always)]
pub fn unpinned() {
    counters::count(FLOW_UNPINNED);
}

/// Refreshes `last_seen_ns` if it is more than [`REFRESH_NS`] old. That refresh also
/// confirms a dsr or tunnel flow waiting for its proof (`FLOW_F_UNPROVEN`):
/// `last_seen_ns` was still the time of the packet that opened the flow (or of the last
/// that restarted or re-hashed it), so this packet came more than [`REFRESH_NS`] after
/// it (docs/capacity.md, "Spoofed packets of every kind").
///
/// Signed: another CPU's cached clock may have written a value a tick ahead of ours.
#[inline(always)]
pub fn touch(flow: &mut FlowValue, now: u64) {
    if now.wrapping_sub(flow.last_seen_ns) as i64 > REFRESH_NS as i64 {
        flow.last_seen_ns = now;
        if flow.flags & FLOW_F_UNPROVEN != 0 {
            flow.flags &= !FLOW_F_UNPROVEN;
        }
    }
}
