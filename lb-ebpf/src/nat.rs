//! Full NAT: (address, port) allocation, the reverse (reply) entries in `LB_NAT`, their
//! port lifecycle, and the translation of both directions.
//!
//! Forward: `client:cport -> VIP:vport` becomes `snat:nat_port -> backend:port`.
//! Reply:   `backend:port -> snat:nat_port` becomes `VIP:vport -> client:cport`.
//! The reverse entry is keyed by the reply's 5-tuple, in the set-associative array
//! table `LB_NAT` (`slots`); claiming its slot under the bucket lock is what makes a
//! source (address, port) belong to one flow. The entry's `NAT_S_*` bits follow the
//! connection (who answered, who closed first, resets; UDP replies and assurance) and
//! say when its port may go to a new flow (`lb_common::maps::nat_reuse_after`, table in
//! docs/nat-ports.md); a live entry is never taken for another flow.

use aya_ebpf::bindings::xdp_action::XDP_TX;
use lb_common::{
    FAMILY_V4, IPPROTO_TCP, NAT_HANDSHAKE_DISPLACE, NAT_PORT_ATTEMPTS,
    counters::{
        DROP_MALFORMED, NAT_PORT_FIRST, NAT_PORT_RECLAIMED, NAT_PORT_RETRIED, PASS_MALFORMED,
        PASS_NOT_VIP, TX_NAT_FORWARD, TX_NAT_REPLY,
    },
    events::EVENT_RST_ON_SYN,
    hash::SEED_NAT_PORT,
    maps::{
        Backend, FLOW_F_NAT_AWAIT, FLOW_F_REPORTED, FLOW_F_SYN_PENDING, FLOW_F_UNANSWERED, FlowKey,
        FlowValue, MAX_SNAT_ADDRS, NAT_H_ADOPTED, NAT_H_PENDING, NAT_H_REPORTED, NAT_S_ACKED,
        NAT_S_BACKEND_FIRST, NAT_S_ESTABLISHED, NAT_S_FIN_BACKEND, NAT_S_FIN_CLIENT, NAT_S_REPLIED,
        NAT_S_RST, NatValue, ServiceMeta, nat_backend_time_wait as backend_time_wait,
        nat_owned_by as owned_by, nat_reclaimable, nat_reuse_after, nat_seconds,
    },
    nat_stride,
};

use crate::{
    Verdict, clock, conn_events, counters, events, flow,
    hash::flow_hash,
    layout,
    maps::LB_NAT,
    parse::{ETH_HLEN, ETH_SRC, L4, Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    peer,
    pkt::Hdr,
    rewrite::{retarget_l2, translate},
    slots::{self, Claim},
};

/// `LB_NAT` as a [`slots::Table`].
pub struct NatTable;

impl slots::Table for NatTable {
    type Value = NatValue;

    #[inline(always)]
    fn hash(key: &FlowKey) -> u32 {
        lb_common::hash::table_hash(key, layout::nat_seed())
    }

    #[inline(always)]
    fn index(hash: u32) -> u32 {
        hash & layout::nat_mask()
    }

    #[inline(always)]
    fn at(index: u32) -> Option<*mut lb_common::table::NatBucket> {
        LB_NAT.get_ptr_mut(index)
    }
}

// The table's bucket scans are BPF *global* functions: the verifier checks each once,
// on its own, instead of once per call in every caller's state (the allocation loop
// alone calls `claim` up to 16 times on every path that opens a nat flow: inlined, or as
// static subprograms, that pushed `lb_xdp` past the 1,000,000-instruction limit), and
// `lb_xdp`'s own frame stays as small as before (a global function's frame adds to it:
// 512 bytes in all). Their pointer arguments are checked for NULL, as the verifier
// demands of a global function; their results are numbers (it cannot return pointers).

/// The key of the `LB_NAT` slot whose value `v` is (a slot is its word, its key, its
/// value: the key ends where the value starts).
#[inline(always)]
fn key_of(v: &NatValue) -> &FlowKey {
    const KEY_END: usize = core::mem::offset_of!(lb_common::table::NatSlot, value);
    const KEY_START: usize = core::mem::offset_of!(lb_common::table::NatSlot, key);
    const _: () = assert!(KEY_END - KEY_START == size_of::<FlowKey>());
    // SAFETY: every `NatValue` the program notes lives in an `LB_NAT` slot, right after
    // that slot's key.
    unsafe {
        &*(v as *const NatValue)
            .cast::<u8>()
            .sub(size_of::<FlowKey>())
            .cast()
    }
}

/// `slots::find` in `LB_NAT` (see above).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_nat_find(key: *const FlowKey) -> u64 {
    if key.is_null() {
        return slots::NOT_FOUND;
    }
    slots::find::<NatTable>(key)
}

/// `slots::remove_at` in `LB_NAT` (see above): 1 done, 0 bucket busy.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_nat_free(key: *const FlowKey, code: u64) -> u64 {
    if key.is_null() {
        return 1;
    }
    slots::remove_at::<NatTable>(key, code) as u64
}

/// The reverse entry of `key`, if the table holds it.
#[inline(always)]
pub fn entry(key: &FlowKey) -> Option<&'static mut NatValue> {
    slots::value_at::<NatTable>(lb_nat_find(key))
}

/// How long the entry of a pair a new flow found held in its second pass must have been
/// silent before the flow may take the pair: its lifecycle row's time
/// (`nat_reuse_after`), except for a TCP connection still waiting for its handshake (no
/// client ACK after a SYN-ACK, no FIN, no reset): `NAT_HANDSHAKE_DISPLACE`. A real
/// client's handshake is done within a round trip and its SYN retransmissions refresh
/// the entry; a spoofed SYN's entry sits silent.
#[inline(always)]
fn displace_after(state: u8, proto: u8) -> u32 {
    if proto == IPPROTO_TCP && state & !NAT_S_ESTABLISHED == 0 {
        NAT_HANDSHAKE_DISPLACE
    } else {
        nat_reuse_after(state, proto)
    }
}

/// Claims `key` for `value` (see `slots::claim`): a free way or one whose entry's port
/// may be reused (`nat_reclaimable` at `now_s`); with `replace`, also the key's own
/// entry when it may be, when it is `value`'s own client 5-tuple's closed connection
/// that waits out the backend's TIME_WAIT ([`own_time_wait`]), or when it is a TCP
/// handshake left silent ([`displace_after`]).
#[inline(always)]
pub(crate) fn claim(key: &FlowKey, value: &NatValue, replace: bool, now_s: u32) -> Claim {
    Claim::from_code(lb_nat_claim(key, value, replace as u64, now_s as u64))
}

/// [`claim`] for a new flow's allocation: in cluster mode a pair another node's
/// connection holds (`peer::lb_peer_nat_held`) is `Taken` too, counted
/// `NAT_PORT_PEER_HELD`. The check runs in [`lb_nat_claim_new`], verified once, not in
/// each of the allocation's candidates (a search there multiplies the states the
/// verifier explores past its limit).
#[inline(always)]
fn claim_new(key: &FlowKey, value: &NatValue, replace: bool, now_s: u32) -> Claim {
    // Without cluster mode (a constant to the verifier) straight to the claim: no extra
    // call for each of the allocation's candidates.
    let code = if layout::cluster() {
        lb_nat_claim_new(key, value, replace as u64, now_s as u64)
    } else {
        lb_nat_claim(key, value, replace as u64, now_s as u64)
    };
    Claim::from_code(code)
}

/// Cluster mode: [`lb_nat_claim`] after [`claim_new`]'s check of the peer tables. It only passes its
/// arguments on, in callee-saved registers: no frame of its own, so the chain through
/// it is `lb_xdp_full`'s frame and the deeper of its two callees'.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_nat_claim_new(
    key: *const FlowKey,
    value: *const NatValue,
    replace: u64,
    now_s: u64,
) -> u64 {
    if peer::lb_peer_nat_held(key) != 0 {
        return Claim::Taken.code();
    }
    lb_nat_claim(key, value, replace, now_s)
}

/// `slots::claim` in `LB_NAT` (see above); the result is `Claim::code`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_nat_claim(
    key: *const FlowKey,
    value: *const NatValue,
    replace: u64,
    now_s: u64,
) -> u64 {
    if key.is_null() || value.is_null() {
        return Claim::Busy.code();
    }
    // SAFETY: non-NULL pointers the verifier checked to cover the types' sizes.
    let (key, value) = unsafe { (&*key, &*value) };
    let now_s = now_s as u32;
    slots::claim::<NatTable>(
        key,
        value,
        |v, k| {
            replace != 0
                && (now_s.wrapping_sub(v.last_seen) >= displace_after(v.state, k.proto)
                    || own_time_wait(v, value))
        },
        |v, k| nat_reclaimable(v, k.proto, now_s),
        slots::NO_EVICTION,
    )
    .code()
}

/// A flow's source toward its backend: index into the service's `snat_addrs`, and the
/// port (network order).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Source {
    pub addr: u8,
    pub port: u16,
}

/// An address as used in keys: IPv4 keeps only word 0.
#[inline(always)]
fn key_addr(addr: &[u32; 4], family: u8) -> [u32; 4] {
    if family == FAMILY_V4 {
        [addr[0], 0, 0, 0]
    } else {
        words(addr)
    }
}

/// How many SNAT addresses the service allocates from (1..=`MAX_SNAT_ADDRS`).
#[inline(always)]
fn snat_count(svc: &ServiceMeta) -> u32 {
    let n = svc.snat_count;
    if n == 0 {
        1
    } else if n > MAX_SNAT_ADDRS as u32 {
        MAX_SNAT_ADDRS as u32
    } else {
        n
    }
}

/// The reply 5-tuple of a flow translated to `backend` from `src`.
#[inline(always)]
pub(crate) fn reply_key(
    client: &FlowKey,
    svc: &ServiceMeta,
    backend: &Backend,
    src: Source,
) -> FlowKey {
    FlowKey {
        src: key_addr(&backend.addr, client.family),
        dst: key_addr(snat_addr(svc, src), client.family),
        sport: backend.port,
        dport: src.port,
        proto: client.proto,
        family: client.family,
        _pad: [0; 2],
    }
}

/// The SNAT address of `src`, for the forward rewrite.
#[inline(always)]
pub fn snat_addr(svc: &ServiceMeta, src: Source) -> &[u32; 4] {
    &svc.snat_addrs[src.addr as usize & (MAX_SNAT_ADDRS - 1)]
}

/// The client's 5-tuple, rebuilt from a reverse entry.
#[inline(always)]
pub fn client_key(nat: &NatValue, proto: u8, family: u8) -> FlowKey {
    FlowKey {
        src: words(&nat.client_addr),
        dst: words(&nat.vip_addr),
        sport: nat.client_port,
        dport: nat.vip_port,
        proto,
        family,
        _pad: [0; 2],
    }
}

/// An address copied word by word: a plain 16-byte copy out of a map value is emitted
/// as a call to a byte-at-a-time `memmove`.
#[inline(always)]
fn words(a: &[u32; 4]) -> [u32; 4] {
    [a[0], a[1], a[2], a[3]]
}

#[inline(always)]
fn reverse_value(
    client: &FlowKey,
    backend_id: u32,
    client_mac: [u8; 6],
    state: u8,
    handshake: u8,
    now_s: u32,
) -> NatValue {
    NatValue {
        client_addr: client.src,
        vip_addr: client.dst,
        client_port: client.sport,
        vip_port: client.dport,
        backend_id,
        client_mac,
        state,
        handshake,
        last_seen: now_s,
        _pad2: 0,
    }
}

/// Cluster mode: makes `v`, a copy of the reverse entry another node's connection has
/// (from `LB_PEER_NAT`), the one this node claims: aged from `now_s` (the nodes' clocks
/// differ), marked taken over, with the client's previous hop `mac` when a client packet
/// brought it (else the MAC the agent installed).
#[inline(always)]
pub fn adopt_value(v: &mut NatValue, mac: Option<[u8; 6]>, now_s: u32) {
    if let Some(mac) = mac {
        v.client_mac = mac;
    }
    v.handshake |= NAT_H_ADOPTED;
    v.last_seen = now_s;
    v._pad2 = 0;
}

/// Refreshes an entry's age when the coarse clock moved (one write per ~second at most).
#[inline(always)]
fn touch(v: &mut NatValue, now_s: u32) {
    if v.last_seen != now_s {
        v.last_seen = now_s;
    }
}

/// The `n`-th candidate (address, port) of a flow: candidates walk the combined space of
/// `count` addresses x `range` ports from `h % total` in strides of
/// `lb_common::nat_stride(h, total)`.
#[inline(always)]
fn candidate(min: u32, range: u32, off: u32) -> Source {
    Source {
        addr: (off / range) as u8,
        port: ((min + off % range) as u16).to_be(),
    }
}

/// The first candidate source [`allocate`] tries for `client` (its hash, the space's
/// size, the first offset), or `None` for a service without a port range.
#[inline(always)]
fn first_candidate(client: &FlowKey, svc: &ServiceMeta) -> Option<(u32, u32, u32, u32)> {
    let min = svc.nat_port_min as u32;
    let max = svc.nat_port_max as u32;
    if max < min {
        return None;
    }
    let range = max - min + 1;
    let total = range * snat_count(svc);
    let h = flow_hash(client, SEED_NAT_PORT);
    Some((min, range, total, h))
}

/// A nat SYN's two cold reads started together: the client's `LB_FLOWS` bucket (the
/// lookup that follows) and the `LB_NAT` bucket of the first source [`allocate`] will
/// try toward `backend_id` (the Maglev choice), loaded back to back before either is
/// needed (`slots::prefetch2`). Read one after the other (the lookup's miss, then the
/// claim ~400 instructions later) the second miss starts only when the first has
/// returned; on this machine two cold reads overlap only when a few dozen
/// instructions separate them (the reduced programs of `lab/reduced_nat.rs` measure it).
#[inline(always)]
pub fn prefetch_open(client: &FlowKey, svc: &ServiceMeta, backend_id: u32) {
    let Some(backend) = flow::any_backend(backend_id) else {
        return;
    };
    let Some((min, range, total, h)) = first_candidate(client, svc) else {
        return;
    };
    let key = reply_key(client, svc, backend, candidate(min, range, h % total));
    slots::prefetch2::<flow::FlowTable, NatTable>(client, &key);
}

/// Allocates a source (address, port) for a new flow and claims its reverse entry.
///
/// A walk of 2 x `NAT_PORT_ATTEMPTS` distinct candidates of the service's addresses x
/// `[nat_port_min, nat_port_max]`: the first at `h % total` with `h = flow_hash(client,
/// SEED_NAT_PORT)`, each next one `nat_stride(h, total)` further (wrapping; bounded so
/// that the 16 are distinct pairs). The first 8 are tried as fresh entries only (the
/// key absent, and a way free or holding a reclaimable entry of another key). Only when
/// all 8 are taken, the next 8 are tried as fresh entries or taken over: an entry whose
/// connection closed or went idle long enough (`nat_reclaimable`), or one held by this
/// very client 5-tuple's earlier connection that the backend closed first
/// ([`own_time_wait`]: a client that reuses its source port quickly, as Linux does for
/// connections its peer closed, otherwise fills its own candidates with pairs waiting
/// out the backend's TIME_WAIT and is refused). A candidate whose bucket is full of live
/// entries, or held by another CPU's writer at that instant, counts as taken. `None`
/// when none was: with no reclaimable entry about, a flow is refused with probability
/// `u^16` at utilisation `u` (the same 8 candidates tried twice would give `u^8`; a
/// retransmitted SYN walks the same candidates again).
///
/// Not consecutive ports: consecutive probes run into the clusters that earlier
/// allocations formed (linear probing), so attempts and failures grow faster with
/// utilisation than for independent probes. Filling 3 backends x 40,000 ports to 83 %
/// with 100,000 new flows (a userspace model of the walk, no reclaims), consecutive
/// probing of 8 refused 6.1 % of them, strided probing of 8 2.3–2.4 %, the walk of 16
/// 0.33 %; at 67 % 0.45 % against 0.009 %.
///
/// `own` is the pair a pinned flow held toward this backend before it needed a new one
/// (`port` 0: none, or a new flow): its 5-tuple's earlier connection, now usually in the
/// backend's TIME_WAIT (row 6). It replaces the walk's last candidate, so that a client
/// reusing its 5-tuple faster than row 6 ends, whose other 15 candidates are all held
/// (its own earlier pairs and other clients'), gets its own pair back as RFC 6191 lets a
/// backend accept, instead of being refused.
///
/// The entry starts with `handshake` (`handshake_bits` of the flow it serves).
///
/// Called from one place only (`forward::to_service`): its two probe loops are large,
/// and a copy per caller would push the program past what LLVM inlines into the XDP
/// entry point (a BPF subprogram instead would not fit the 512-byte stack).
#[inline(always)]
pub fn allocate(
    client: &FlowKey,
    svc: &ServiceMeta,
    backend: &Backend,
    backend_id: u32,
    client_mac: [u8; 6],
    handshake: u8,
    own: Source,
) -> Option<Source> {
    let (min, range, total, h) = first_candidate(client, svc)?;
    // The flow's own pair only while it lies in the service's space (a reload may have
    // narrowed the range or the addresses).
    let own_port = u16::from_be(own.port) as u32;
    let has_own = own.port != 0
        && (own.addr as u32) < snat_count(svc)
        && own_port >= min
        && own_port - min < range;
    let first = h % total;
    let stride = nat_stride(h, total);
    let now_s = nat_seconds(clock::now().ns);
    let value = reverse_value(client, backend_id, client_mac, 0, handshake, now_s);
    let mut key = reply_key(client, svc, backend, Source { addr: 0, port: 0 });
    let family = client.family;

    // Fresh (address, port) pairs first (a free way, or one whose entry of another
    // flow may be let go); when the first 8 are all taken, the walk goes on over 8 more
    // that may also be taken over when their entry's connection closed (or went idle)
    // long enough: a reclaimed pair may still have state on the backend (a TIME_WAIT the
    // lifecycle did not know of, a half-open SYN_RECV), so fresh ones come first. One
    // loop over both passes: one copy of the claim for the verifier.
    let mut off = first;
    let mut i = 0;
    while i < 2 * NAT_PORT_ATTEMPTS {
        let src = if has_own && i == 2 * NAT_PORT_ATTEMPTS - 1 {
            own
        } else {
            candidate(min, range, off)
        };
        key.dst = key_addr(snat_addr(svc, src), family);
        key.dport = src.port;
        match claim_new(&key, &value, i >= NAT_PORT_ATTEMPTS, now_s) {
            Claim::Fresh if i < NAT_PORT_ATTEMPTS => {
                counters::count(if i == 0 {
                    NAT_PORT_FIRST
                } else {
                    NAT_PORT_RETRIED
                });
                return Some(src);
            }
            Claim::Fresh => {
                counters::count(NAT_PORT_RETRIED);
                return Some(src);
            }
            Claim::Replaced => {
                counters::count(NAT_PORT_RECLAIMED);
                return Some(src);
            }
            Claim::Taken | Claim::Full | Claim::Busy | Claim::Evicted | Claim::Displaced => {}
        }
        // off < total and stride < total: one subtraction wraps.
        off += stride;
        if off >= total {
            off -= total;
        }
        i += 1;
    }
    None
}

/// What a pinned flow's reverse entry is to it.
pub enum Held {
    /// The entry is the flow's own.
    Own(&'static mut NatValue),
    /// Another flow holds the key.
    Other,
    /// No entry (its port was reclaimed after it went idle, or it was never claimed
    /// because its bucket was busy).
    Missing,
}

/// A pinned flow's reverse entry, looked up once per packet that needs it (the
/// handshake's sync, a restart, a note, the per-tick check) and shared by all of them.
pub struct Reverse {
    pub held: Held,
}

/// Looks up the reverse entry of the client flow `client` sent from `src` to `backend`.
#[inline(always)]
pub fn reverse(client: &FlowKey, svc: &ServiceMeta, backend: &Backend, src: Source) -> Reverse {
    let key = reply_key(client, svc, backend, src);
    let held = match entry(&key) {
        Some(v) if owned_by(v, client) => Held::Own(v),
        Some(_) => Held::Other,
        None => Held::Missing,
    };
    Reverse { held }
}

/// The `NAT_H_*` bits a reverse entry written for the flow `f` starts with: its
/// handshake wait and its one report.
#[inline(always)]
pub fn handshake_bits(f: &FlowValue) -> u8 {
    let mut bits = 0;
    if f.flags & FLOW_F_SYN_PENDING != 0 {
        bits |= NAT_H_PENDING;
    }
    if f.flags & FLOW_F_REPORTED != 0 {
        bits |= NAT_H_REPORTED;
    }
    bits
}

/// TCP, a client packet of a flow that waits for its handshake (`FLOW_F_SYN_PENDING`):
/// takes in what the reply path noted in the reverse entry since. A backend packet ended
/// the wait (`NAT_H_PENDING` gone): so does the flow's; a SYN-ACK (`NAT_S_ESTABLISHED`)
/// makes the flow await the client's ACK (`FLOW_F_NAT_AWAIT`); a report (an RST refused
/// the SYN) is the flow's one report. Runs before the forward path's handshake rules, so
/// they see the flow as the reply path left it.
#[inline(always)]
pub fn sync_handshake(f: &mut FlowValue, rev: &Reverse) {
    let Held::Own(v) = &rev.held else {
        return;
    };
    if v.handshake & NAT_H_REPORTED != 0 {
        f.flags |= FLOW_F_REPORTED;
    }
    if v.handshake & NAT_H_PENDING == 0 {
        f.flags &= !FLOW_F_SYN_PENDING;
        if v.state & (NAT_S_ESTABLISHED | NAT_S_ACKED) == NAT_S_ESTABLISHED {
            f.flags |= FLOW_F_NAT_AWAIT;
        }
    }
}

/// Notes in the reverse entry, if the flow's own, that the flow sent its one report.
#[inline(always)]
pub fn note_reported(rev: &mut Reverse) {
    if let Held::Own(v) = &mut rev.held {
        v.handshake |= NAT_H_REPORTED;
    }
}

/// For a pinned flow: makes sure its reverse entry (`rev`) still exists and is its own.
///
/// An entry gone is claimed again with `state` (what the flow table knows of the
/// connection: `NAT_S_ESTABLISHED | NAT_S_ACKED` for a TCP flow whose handshake was
/// answered and whose client sends again) and `handshake` ([`handshake_bits`]), and an
/// existing entry gains the `state` bits. `false` when another flow holds the key or
/// its bucket is full of live entries: the flow needs a new source (`allocate`). The
/// entry, existing or claimed, takes the source MAC of `eth` (the client's packet) as
/// the previous hop its replies go to.
///
/// Called for the first packet of a flow in each tick (`FlowValue::nat_tick`), not for
/// every packet.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn ensure(
    rev: &mut Reverse,
    client: &FlowKey,
    svc: &ServiceMeta,
    backend: &Backend,
    backend_id: u32,
    src: Source,
    state: u8,
    handshake: u8,
    eth: Hdr<ETH_HLEN>,
) -> bool {
    let now_s = nat_seconds(clock::now().ns);
    match &mut rev.held {
        Held::Own(v) => {
            // What the flow knows and the entry missed (an entry written by an older
            // program without `NAT_S_ACKED`, a lost update): noted, so an answered
            // connection whose client keeps sending is never taken for half-open.
            if v.state & state != state {
                v.state |= state;
            }
            // The previous hop the client's packets come from now: after a router in
            // front moved to another MAC (a failover, a replaced card), the replies
            // follow from this tick on. Written whatever it held (the line is written
            // by `touch` anyway); a reply read on another CPU while it changes may see
            // it half written, once, as any field a writer changes.
            eth.copy_mac::<ETH_SRC>(&mut v.client_mac);
            touch(v, now_s);
            true
        }
        Held::Other => false,
        Held::Missing => {
            let key = reply_key(client, svc, backend, src);
            let client_mac = eth.mac::<ETH_SRC>();
            reinsert(
                &key, client, backend_id, client_mac, state, handshake, now_s,
            )
        }
    }
}

/// Claims a flow's missing reverse entry again (see [`ensure`]). A busy bucket is
/// retried by the flow's first packet of the next tick.
#[inline(always)]
fn reinsert(
    key: &FlowKey,
    client: &FlowKey,
    backend_id: u32,
    client_mac: [u8; 6],
    state: u8,
    handshake: u8,
    now_s: u32,
) -> bool {
    let value = reverse_value(client, backend_id, client_mac, state, handshake, now_s);
    matches!(claim(key, &value, false, now_s), Claim::Fresh | Claim::Busy)
}

/// A new connection (a SYN on a settled pinned flow) reusing the client's 5-tuple: its
/// reverse entry starts over (`state` 0, waiting for the handshake; its report, if the
/// flow made one, stays), unless the backend may still hold the old connection in
/// TIME_WAIT (it closed first): then the old entry keeps the old source until TIME_WAIT
/// is over and `false` says the flow needs a new one (`allocate`). `handshake` is the
/// flow's [`handshake_bits`], for an entry claimed again.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn restart(
    rev: &mut Reverse,
    client: &FlowKey,
    svc: &ServiceMeta,
    backend: &Backend,
    backend_id: u32,
    src: Source,
    handshake: u8,
    client_mac: [u8; 6],
) -> bool {
    let now_s = nat_seconds(clock::now().ns);
    match &mut rev.held {
        Held::Own(v) => {
            if backend_time_wait(v.state) {
                return false;
            }
            v.state = 0;
            v.handshake = NAT_H_PENDING | (v.handshake & NAT_H_REPORTED);
            touch(v, now_s);
            true
        }
        Held::Other => false,
        Held::Missing => {
            let key = reply_key(client, svc, backend, src);
            reinsert(&key, client, backend_id, client_mac, 0, handshake, now_s)
        }
    }
}

/// Whether `old` is an entry of the client 5-tuple `new` is for, whose connection the
/// backend closed first (row 6 of docs/nat-ports.md): the backend holds that 4-tuple in
/// TIME_WAIT for the client's earlier connection on the same 5-tuple. Giving the pair
/// back to that client 5-tuple shows the backend exactly what it would see without lb
/// in between (the same client reusing its own 4-tuple, RFC 6191); the allocation does
/// so only when all its candidates are held ([`allocate`]'s reclaim pass).
#[inline(always)]
fn own_time_wait(old: &NatValue, new: &NatValue) -> bool {
    backend_time_wait(old.state)
        && old.client_port == new.client_port
        && old.vip_port == new.vip_port
        && old.client_addr == new.client_addr
        && old.vip_addr == new.vip_addr
}

/// Notes in the reverse entry (`rev`, if the flow's own) what a client packet of a
/// pinned flow changed: TCP FIN or RST (`tcp_flags`), and `bits` (`NAT_S_ACKED`,
/// `NAT_S_ASSURED`); in cluster mode, a connection established or ended by it is sent
/// to the agent (`conn_events`).
#[inline(always)]
pub fn client_note(rev: &mut Reverse, tcp_flags: u8, bits: u8) {
    if let Held::Own(v) = &mut rev.held {
        let old = v.state;
        let state = old | bits | close_bits(old, tcp_flags, NAT_S_FIN_CLIENT);
        if state != old {
            v.state = state;
            if layout::cluster() {
                // The client's notes are TCP's (a UDP client's `NAT_S_ASSURED` changes
                // neither state of `conn_events`).
                conn_events::changed(key_of(v), v, old, state, IPPROTO_TCP);
            }
        }
        touch(v, nat_seconds(clock::now().ns));
    }
}

/// The `NAT_S_*` bits a TCP segment with `flags` adds to an entry in `state` (`fin` for
/// the sender's FIN). The backend's FIN before the client's marks `NAT_S_BACKEND_FIRST`;
/// an RST after a completed backend-first close is not noted (the backend may keep its
/// TIME_WAIT: Linux ignores out-of-window resets, and with `tcp_rfc1337` all of them).
#[inline(always)]
fn close_bits(state: u8, flags: u8, fin: u8) -> u8 {
    let mut bits = 0;
    if flags & TCP_FIN != 0 {
        bits |= fin;
        if fin == NAT_S_FIN_BACKEND && state & NAT_S_FIN_CLIENT == 0 {
            bits |= NAT_S_BACKEND_FIRST;
        }
    }
    if flags & TCP_RST != 0 && !backend_time_wait(state | bits) {
        bits |= NAT_S_RST;
    }
    bits
}

/// Drops the reverse entry of a flow that leaves `backend` (re-hash), unless the backend
/// holds the connection in TIME_WAIT: that entry keeps its port until it is over.
#[inline(always)]
pub fn release(client: &FlowKey, svc: &ServiceMeta, backend: &Backend, src: Source) {
    let key = reply_key(client, svc, backend, src);
    let code = lb_nat_find(&key);
    if let Some(v) = slots::value_at::<NatTable>(code)
        && owned_by(v, client)
        && !backend_time_wait(v.state)
    {
        // A busy bucket leaves the entry: its port comes back by the lifecycle's rules.
        let _ = lb_nat_free(&key, code);
    }
}

/// Translates a client packet toward `backend` from `snat:nat_port` and sends it.
#[inline(always)]
pub fn forward(
    pkt: &Packet,
    l4: L4,
    svc: &ServiceMeta,
    backend: &Backend,
    src: Source,
    end: usize,
) -> Verdict {
    let translated = translate(
        pkt,
        l4,
        snat_addr(svc, src),
        src.port,
        &backend.addr,
        backend.port,
        end,
    );
    if translated.is_none() {
        return Verdict::drop(DROP_MALFORMED);
    }
    retarget_l2(pkt.eth, &backend.mac);
    Verdict::new(XDP_TX, TX_NAT_FORWARD)
}

/// A packet not for a VIP: if it is a backend's reply to a translated flow, translates
/// it back to `VIP -> client` and sends it to the client's MAC; otherwise passes it.
#[inline(always)]
pub fn reply(pkt: &Packet, end: usize) -> Verdict {
    match reply_in::<true>(pkt, end) {
        Some(v) => v,
        // Unreachable: the whole reply path decides every packet.
        None => Verdict::pass(PASS_NOT_VIP),
    }
}

/// [`reply`] for a reply that notes no handshake, close or first UDP reply: a TCP
/// segment without FIN or RST while no handshake is pending, a UDP datagram of a flow
/// that replied before (`lb_xdp`'s hot path: without the handshake's passive signals
/// and the UDP flow-table write, it is a fraction of the code). `None`: any other reply,
/// for the whole path ([`reply`] in `lb_xdp_full`).
#[inline(always)]
pub fn settled_reply(pkt: &Packet, end: usize) -> Option<Verdict> {
    reply_in::<false>(pkt, end)
}

/// The reply path; with `FULL` false it leaves ([`None`]) before noting any handshake,
/// close or first UDP reply.
#[inline(always)]
fn reply_in<const FULL: bool>(pkt: &Packet, end: usize) -> Option<Verdict> {
    let Some(l4) = pkt.l4(end) else {
        return Some(Verdict::pass(PASS_MALFORMED));
    };
    // Inlined (one bucket lookup, no call): the only table read of a TCP reply.
    let Some(nat) = slots::find_value::<NatTable>(&pkt.key) else {
        // Cluster mode: maybe a connection another node made (`peer::reply_missed`).
        return Some(Verdict::pass(PASS_NOT_VIP));
    };
    // Cluster mode: a taken-over connection's entry that may be over is a miss too.
    if layout::cluster()
        && peer::stale(
            nat,
            pkt.key.proto,
            pkt.is_tcp() && l4.tcp_flags & TCP_SYN != 0,
        )
    {
        return Some(Verdict::pass(PASS_NOT_VIP));
    }
    if layout::cluster() {
        peer::follow_hop_moves(nat);
    }
    // Writes are single fields (state, age).
    let state = nat.state;
    if pkt.is_tcp() {
        let flags = l4.tcp_flags;
        if !FULL && (nat.handshake & NAT_H_PENDING != 0 || flags & (TCP_FIN | TCP_RST) != 0) {
            return None;
        }
        // While the flow waits for its handshake, any backend packet answers it (a
        // bare ACK too: a TIME_WAIT socket's answer to a SYN it rejected).
        if nat.handshake & NAT_H_PENDING != 0 {
            handshake_reply(nat, flags);
        }
        let mut bits = close_bits(state, flags, NAT_S_FIN_BACKEND);
        if flags & (TCP_SYN | TCP_ACK) == (TCP_SYN | TCP_ACK) {
            bits |= NAT_S_ESTABLISHED;
        }
        if state | bits != state {
            nat.state = state | bits;
            // A FIN or reset takes the whole path (`FULL`), as the SYN-ACK does.
            if FULL && layout::cluster() {
                conn_events::changed(&pkt.key, nat, state, state | bits, IPPROTO_TCP);
            }
        }
        // Only client packets keep a half-open entry: the backend's SYN-ACK
        // retransmissions toward a client that never acknowledged do not.
        if state & NAT_S_ACKED != 0 {
            touch(nat, nat_seconds(clock::now().ns));
        }
    } else {
        if state & NAT_S_REPLIED == 0 {
            if !FULL {
                return None;
            }
            nat.state = state | NAT_S_REPLIED;
            if layout::cluster() {
                conn_events::changed(&pkt.key, nat, state, state | NAT_S_REPLIED, pkt.key.proto);
            }
            await_client(nat, pkt.key.proto, pkt.key.family);
        }
        touch(nat, nat_seconds(clock::now().ns));
    }
    let translated = translate(
        pkt,
        l4,
        &nat.vip_addr,
        nat.vip_port,
        &nat.client_addr,
        nat.client_port,
        end,
    );
    if translated.is_none() {
        return Some(Verdict::pass(PASS_MALFORMED));
    }
    retarget_l2(pkt.eth, &nat.client_mac);
    Some(Verdict::new(XDP_TX, TX_NAT_REPLY))
}

/// UDP: the first reply of a flow, the proof its source asked for it (the flow is
/// confirmed: `FLOW_F_UNANSWERED` cleared); the client's next packet makes the entry
/// assured.
#[inline(always)]
fn await_client(nat: &NatValue, proto: u8, family: u8) {
    if let Some(f) = flow::lookup(&client_key(nat, proto, family)) {
        // SAFETY: as in `handshake_reply`.
        let f = unsafe { &mut *f };
        f.flags = (f.flags & !FLOW_F_UNANSWERED) | FLOW_F_NAT_AWAIT;
    }
}

/// Passive signals on the reply path of a flow waiting for its handshake
/// (`NAT_H_PENDING`, kept in the reverse entry: a reply reads no `LB_FLOWS`): any
/// backend packet answers it. A SYN-ACK completes it (`conn_ok`; the flow then awaits
/// the client's ACK, see `sync_handshake`), an RST refuses it (`EVENT_RST_ON_SYN`, once
/// per flow: `NAT_H_REPORTED`), anything else (a bare ACK from a TIME_WAIT socket) only
/// ends the wait: the client's immediate SYN resend is then no retransmission. The flow
/// entry learns all of it from the client's next packet (`sync_handshake`).
#[inline(always)]
fn handshake_reply(nat: &mut NatValue, flags: u8) {
    let mut handshake = nat.handshake & !NAT_H_PENDING;
    if flags & TCP_RST != 0 {
        if handshake & NAT_H_REPORTED == 0 {
            handshake |= NAT_H_REPORTED;
            let service_id = flow::any_backend(nat.backend_id).map_or(0, |b| b.service_id);
            events::emit(EVENT_RST_ON_SYN, nat.backend_id, service_id);
        }
    } else if flags & (TCP_SYN | TCP_ACK) == (TCP_SYN | TCP_ACK) {
        counters::backend_conn_ok(nat.backend_id);
    }
    nat.handshake = handshake;
}
