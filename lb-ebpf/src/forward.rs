//! The VIP path: a settled flow this CPU cached in this tick goes straight to its backend
//! (`settled`); any other packet that `validate` admits pins the flow to a backend (flow
//! table, else Maglev), is accounted, has its TCP handshake watched for passive signals,
//! and refreshes the cache; then dsr, nat or tunnel forwards it.

use lb_common::{
    counters::{
        DROP_BAD_BACKEND, DROP_FLOWS_FULL, DROP_NAT_PORTS, DROP_SOURCE_LIMIT, FLOW_HIT, FLOW_NEW,
        FLOW_REHASH,
    },
    events::EVENT_SYN_RETRANSMIT,
    maps::{
        BACKEND_F_LIVE, BACKEND_F_SERVING, Backend, FLOW_F_AWAITING_PROOF, FLOW_F_NAT_AWAIT,
        FLOW_F_REPORTED, FLOW_F_SYN_PENDING, FLOW_F_UNANSWERED, FLOW_F_UNPROVEN, FlowValue,
        NAT_H_PENDING, NAT_S_ACKED, NAT_S_ASSURED, NAT_S_ESTABLISHED, SERVICE_F_NAT,
        SERVICE_F_TUNNEL, ServiceMeta,
    },
    table::SYN_WAIT_MAX_NS,
};

use crate::{
    Verdict, cache, cached_flow,
    clock::{self, Now},
    counters::{self, count},
    dsr, events, flow, layout,
    nat::{self, Reverse, Source},
    parse::{ETH_SRC, L4, Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, is_syn},
    peer, source, tunnel, validate,
};

/// A client's SYN on a flow still waiting for its handshake counts as a retransmission
/// (`EVENT_SYN_RETRANSMIT`) only this long after the SYN that started the wait.
///
/// Linux, the BSDs/macOS and Windows wait at least 1 s before the first SYN
/// retransmission (RFC 6298's initial RTO; Linux `TCP_TIMEOUT_INIT`). 800 ms leaves
/// room for the flow clock (up to one tick late) and early timer slack, and stays far
/// above the resends that follow an answer lb could not see as one: the client's RST and
/// new SYN ~10 ms after a backend's TIME_WAIT socket answered with an ACK (nat sees that
/// ACK; dsr does not see replies at all), or an application retrying at once.
pub const SYN_RESEND_MIN_NS: u64 = 800_000_000;

/// Whether a SYN with sequence number `seq` (as on the wire) on flow `f`, which waits for
/// its handshake, is a resend of the SYN that started the wait: the same ISN (kept in
/// `nat_tick` while the flow waits), at most `SYN_WAIT_MAX_NS` after it (the client's
/// last resend). Any other SYN opens a new connection on the 5-tuple (a client reusing
/// its source port after a failed connection): it is decided as a new flow, never
/// reported.
#[inline(always)]
fn resend(f: &FlowValue, seq: u32, now: u64) -> bool {
    let waited = now.wrapping_sub(f.last_seen_ns) as i64;
    f.nat_tick == seq && waited <= SYN_WAIT_MAX_NS as i64
}

/// Whether the packet (a SYN: `syn`) opens a new connection on a pinned flow `f` that
/// still waits for its handshake: not a [`resend`]. Evaluated where needed, reading the
/// ISN from the packet each time (no value kept live across the path).
#[inline(always)]
fn renews(pkt: &Packet, f: &FlowValue, syn: bool, now: u64, end: usize) -> bool {
    syn && f.flags & FLOW_F_SYN_PENDING != 0 && !resend(f, pkt.tcp_seq(end), now)
}

/// What a flow's `nat_tick` holds from a packet in tick `tick`: a SYN's ISN (`isn`)
/// while the flow waits for its handshake (`syn`), else the tick.
#[inline(always)]
fn stamp(syn: bool, isn: u32, tick: u32) -> u32 {
    if syn { isn } else { tick }
}

/// nat: whether `f`'s reverse entry was verified in tick `tick`. Never while the flow
/// waits for its handshake: `nat_tick` then holds the SYN's ISN.
#[inline(always)]
fn verified(f: &FlowValue, tick: u32) -> bool {
    f.flags & FLOW_F_SYN_PENDING == 0 && f.nat_tick == tick
}

/// Balances one packet addressed to the service `svc`: refused unless
/// `validate::to_vip` admits it, then a settled flow from the cache
/// ([`cached_flow::forward`]), else [`to_service`].
#[inline(always)]
pub fn for_service(pkt: &Packet, svc: &ServiceMeta, end: usize) -> Verdict {
    let l4 = match validate::to_vip(pkt, end) {
        Ok(l4) => l4,
        Err(refused) => return refused,
    };
    to_service(pkt, l4, svc, end)
}

/// Balances one packet addressed to the service `svc`, whose TCP/UDP header `l4`
/// passed `validate::to_vip`, through `LB_FLOWS` (a packet the flow cache serves is
/// taken earlier, by [`cached_flow::forward`]).
#[inline(always)]
pub fn to_service(pkt: &Packet, l4: L4, svc: &ServiceMeta, end: usize) -> Verdict {
    let sid = svc.service_id;
    let use_nat = svc.flags & SERVICE_F_NAT != 0;
    let syn = pkt.is_tcp() && is_syn(l4.tcp_flags);
    if let Some(v) = cached_flow::forward(pkt, l4, svc, end) {
        return v;
    }
    let now = clock::now();
    // A SYN most likely opens a flow: read its Maglev slot before the flow-table lookup,
    // so that the slot's cache miss overlaps the lookup's instead of following it.
    let early = if syn {
        Some(flow::maglev_slot(svc, &pkt.key))
    } else {
        None
    };
    // A nat SYN: its `LB_FLOWS` and `LB_NAT` buckets are read together (their misses
    // overlap) before the lookup and the allocation need them.
    if use_nat && let Some(Ok(id)) = early {
        nat::prefetch_open(&pkt.key, svc, id);
    }

    let flow = flow::lookup(&pkt.key);
    let plan = match flow {
        Some(f) => {
            // SAFETY: this packet's flow entry; LB_FLOWS is not written while it lives.
            let f = unsafe { &mut *f };
            pinned(pkt, svc, f, use_nat, syn, l4, now, end)
        }
        None => {
            // Cluster mode: a connection another node made is taken over (`peer`)
            // before anything would open a flow for it.
            if use_nat && layout::cluster() && peer::has_flow(&pkt.key, syn) {
                return peer::handoff();
            }
            // The checks a packet must pass before it may open a flow.
            if let Some(refused) = validate::opening(pkt, l4, use_nat, end) {
                return refused;
            }
            open(pkt, svc, use_nat, now, early)
        }
    };
    let (backend_id, backend, mut src, new_flow) = match plan {
        Ok(p) => p,
        Err(v) => return v,
    };
    if use_nat && src.port == NEEDS_SOURCE.port {
        // The one place a source is allocated (see `nat::allocate`).
        let mac = pkt.eth.mac::<ETH_SRC>();
        let (handshake, own) = match flow {
            Some(f) => {
                // SAFETY: as below.
                let f = unsafe { &*f };
                // A flow that keeps its backend and needs a new source (its pair is in
                // the backend's TIME_WAIT, or another flow took it) offers its pair
                // back to the walk; a re-hashed flow has none (`nat_port` 0).
                let own = if f.backend_id == backend_id {
                    Source {
                        addr: f.nat_addr,
                        port: f.nat_port,
                    }
                } else {
                    NEEDS_SOURCE
                };
                (nat::handshake_bits(f), own)
            }
            None if syn => (NAT_H_PENDING, NEEDS_SOURCE),
            None => (0, NEEDS_SOURCE),
        };
        src = match nat::allocate(&pkt.key, svc, backend, backend_id, mac, handshake, own) {
            Some(s) => s,
            None => return Verdict::drop(DROP_NAT_PORTS),
        };
        match flow {
            Some(f) => {
                // SAFETY: as above.
                let f = unsafe { &mut *f };
                f.nat_port = src.port;
                f.nat_addr = src.addr;
            }
            None => {
                if !pin(pkt, backend_id, syn, src, now, end) {
                    // Unpinned, the client's next packet would get another source:
                    // the connection is refused instead (its SYN is resent).
                    nat::release(&pkt.key, svc, backend, src);
                    return Verdict::drop(DROP_FLOWS_FULL);
                }
            }
        }
    } else if flow.is_none() && !pin(pkt, backend_id, syn, src, now, end) {
        // dsr: unpinned, the flow's next packet chooses the same backend by Maglev.
        flow::unpinned();
    }

    counters::service_packet(sid, pkt.len, new_flow);
    counters::backend_packet(backend_id, pkt.len, new_flow);
    if use_nat {
        nat::forward(pkt, l4, svc, backend, src, end)
    } else if svc.flags & SERVICE_F_TUNNEL != 0 {
        tunnel::forward(svc, backend_id)
    } else {
        dsr::forward(pkt, backend)
    }
}

/// After a packet of a pinned flow kept its backend: caches the flow if it is settled
/// and the packet needed no flow state, else drops it from the cache (a SYN that
/// restarted the handshake, a close, a wait for the client).
#[inline(always)]
fn settle(pkt: &Packet, f: &FlowValue, b: &Backend, l4: L4, use_nat: bool, src: Source, tick: u32) {
    if f.flags == 0
        && b.flags & BACKEND_F_SERVING != 0
        && cached_flow::changes_no_state(pkt, l4, use_nat)
    {
        cache::fill(&pkt.key, f.backend_id, tick, src);
    } else {
        cache::forget(&pkt.key);
    }
}

/// (backend id, backend, nat source or [`NEEDS_SOURCE`], whether the flow is new)
type Choice = (u32, &'static Backend, Source, bool);

/// dsr: no source.
const NO_SOURCE: Source = Source { addr: 0, port: 0 };
/// nat: the flow needs a source allocated (port 0 is in no port range, which start at
/// 1; a flow left with it by a failed allocation gets one with its next packet).
const NEEDS_SOURCE: Source = Source { addr: 0, port: 0 };

/// The pinned backend if the packet may stay with it: a backend in traffic
/// (`BACKEND_F_SERVING`) keeps all its flows; one that left traffic for a health or
/// membership reason (`BACKEND_F_LIVE` only) keeps its TCP connections, but a SYN (a
/// new connection reusing the 5-tuple, or a handshake it never answered) and UDP move;
/// without `BACKEND_F_LIVE` everything moves.
#[inline(always)]
fn keeps(id: u32, pkt: &Packet, syn: bool) -> Option<&'static Backend> {
    let b = flow::any_backend(id)?;
    let flags = b.flags;
    if flags & BACKEND_F_LIVE == 0 {
        return None;
    }
    if flags & BACKEND_F_SERVING != 0 || (pkt.is_tcp() && !syn) {
        Some(b)
    } else {
        None
    }
}

/// A packet of a pinned flow: keep its backend while it may (see [`keeps`]), else
/// re-hash. A SYN on a flow that waits for its handshake and is not its resend
/// ([`resend`]) is a new connection: decided as a new flow (Maglev over the current
/// table; nat: its old source released, a new one allocated), counted `FLOW_NEW`. The
/// per-source limit is not asked: the flow replaces the tuple's previous one, so its
/// source holds no more ports than before.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pinned(
    pkt: &Packet,
    svc: &ServiceMeta,
    f: &mut FlowValue,
    use_nat: bool,
    syn: bool,
    l4: L4,
    now: Now,
    end: usize,
) -> Result<Choice, Verdict> {
    let id = f.backend_id;
    let tcp = pkt.is_tcp();
    let stays = if renews(pkt, f, syn, now.ns, end) {
        None
    } else {
        keeps(id, pkt, syn)
    };
    if let Some(b) = stays {
        count(FLOW_HIT);
        let src = Source {
            addr: f.nat_addr,
            port: f.nat_port,
        };
        // nat: the reverse entry, looked up at most once for all that follows (a
        // re-hash whose allocation failed has none: nothing to note or verify).
        let mut rev = if use_nat && src.port != NEEDS_SOURCE.port && needs_reverse(f, pkt, l4, now)
        {
            Some(nat::reverse(&pkt.key, svc, b, src))
        } else {
            None
        };
        if tcp
            && f.flags & FLOW_F_SYN_PENDING != 0
            && let Some(r) = &rev
        {
            nat::sync_handshake(f, r);
        }
        if syn {
            // A SYN here is the pending one's resend (same ISN) or restarts a settled
            // flow (`handshake_forward`): either way the wait's ISN is this one.
            f.nat_tick = pkt.tcp_seq(end);
        }
        // Before `touch`: the handshake rules read when the wait started.
        let restarted =
            tcp && handshake_forward(f, svc.service_id, use_nat, syn, l4, now, rev.as_mut());
        flow::touch(f, now.ns);
        let Some(mut rev) = rev else {
            if !use_nat {
                settle(pkt, f, b, l4, false, NO_SOURCE, now.tick);
                return Ok((id, b, NO_SOURCE, false));
            }
            if src.port == NEEDS_SOURCE.port {
                cache::forget(&pkt.key);
                return Ok((id, b, NEEDS_SOURCE, false));
            }
            // Nothing to note, verified in this tick.
            settle(pkt, f, b, l4, true, src, now.tick);
            return Ok((id, b, src, false));
        };
        let kept = if restarted {
            // The restart wrote or claimed the entry: nothing left to verify.
            let handshake = nat::handshake_bits(f);
            f.flags &= !FLOW_F_NAT_AWAIT;
            let mac = pkt.eth.mac::<ETH_SRC>();
            nat::restart(&mut rev, &pkt.key, svc, b, id, src, handshake, mac)
        } else {
            note_client(pkt, f, &mut rev, l4);
            // The reverse entry is verified once per tick (see `nat::ensure`), and with
            // every packet while the flow waits for its handshake.
            if verified(f, now.tick) {
                true
            } else {
                let pending = f.flags & FLOW_F_SYN_PENDING != 0;
                let state = if tcp && !pending {
                    NAT_S_ESTABLISHED | NAT_S_ACKED
                } else {
                    0
                };
                if !pending {
                    f.nat_tick = now.tick;
                }
                let handshake = nat::handshake_bits(f);
                nat::ensure(
                    &mut rev, &pkt.key, svc, b, id, src, state, handshake, pkt.eth,
                )
            }
        };
        if kept {
            settle(pkt, f, b, l4, true, src, now.tick);
            return Ok((id, b, src, false));
        }
        cache::forget(&pkt.key);
        return Ok((id, b, NEEDS_SOURCE, false));
    }

    let (new_id, b) = choose(pkt, svc, use_nat, None)?;
    if use_nat && let Some(old) = flow::any_backend(id) {
        let old_src = Source {
            addr: f.nat_addr,
            port: f.nat_port,
        };
        nat::release(&pkt.key, svc, old, old_src);
    }
    let renew = renews(pkt, f, syn, now.ns, end);
    count(if renew { FLOW_NEW } else { FLOW_REHASH });
    cache::forget(&pkt.key);
    f.backend_id = new_id;
    // A flow waiting for its proof still waits (a re-hash proves nothing).
    f.flags = (f.flags & FLOW_F_AWAITING_PROOF) | if syn { FLOW_F_SYN_PENDING } else { 0 };
    f.nat_port = 0;
    f.nat_addr = 0;
    f.nat_tick = stamp(syn, pkt.tcp_seq(end), now.tick);
    f.last_seen_ns = now.ns;
    let src = if use_nat { NEEDS_SOURCE } else { NO_SOURCE };
    Ok((new_id, b, src, true))
}

/// nat: whether a client packet of a pinned flow needs its reverse entry: the flow's
/// first packet in this tick (`nat::ensure`), a flow that waits for its handshake (its
/// sync, `nat::sync_handshake`) or for the client (`FLOW_F_NAT_AWAIT`), a SYN (a
/// restart), FIN or RST (`nat::client_note`). An established flow's other packets cost
/// no lookup.
#[inline(always)]
fn needs_reverse(f: &FlowValue, pkt: &Packet, l4: L4, now: Now) -> bool {
    !verified(f, now.tick)
        || f.flags & (FLOW_F_SYN_PENDING | FLOW_F_NAT_AWAIT) != 0
        || (pkt.is_tcp() && l4.tcp_flags & (TCP_SYN | TCP_FIN | TCP_RST) != 0)
}

/// nat: what a client packet of a pinned flow tells the reverse entry: FIN/RST, the
/// ACK of the SYN-ACK (TCP) or the packet after a reply (UDP) when the flow awaits one
/// (`FLOW_F_NAT_AWAIT`).
#[inline(always)]
fn note_client(pkt: &Packet, f: &mut FlowValue, rev: &mut Reverse, l4: L4) {
    let tcp = pkt.is_tcp();
    let flags = if tcp { l4.tcp_flags } else { 0 };
    let mut bits = 0;
    if f.flags & FLOW_F_NAT_AWAIT != 0 {
        if !tcp {
            bits = NAT_S_ASSURED;
        } else if flags & (TCP_SYN | TCP_ACK) == TCP_ACK {
            bits = NAT_S_ACKED;
        }
        if bits != 0 {
            f.flags &= !FLOW_F_NAT_AWAIT;
        }
    }
    if bits != 0 || flags & (TCP_FIN | TCP_RST) != 0 {
        nat::client_note(rev, flags, bits);
    }
}

/// A packet without a flow entry: choose through Maglev (the caller allocates a nat
/// source and pins).
#[inline(always)]
fn open(
    pkt: &Packet,
    svc: &ServiceMeta,
    use_nat: bool,
    now: Now,
    early: Option<Result<u32, u32>>,
) -> Result<Choice, Verdict> {
    let (id, b) = choose(pkt, svc, use_nat, early)?;
    if !use_nat {
        return Ok((id, b, NO_SOURCE, true));
    }
    if !source::admit(&pkt.key.src, svc, now.ns) {
        return Err(Verdict::drop(DROP_SOURCE_LIMIT));
    }
    Ok((id, b, NEEDS_SOURCE, true))
}

/// A new flow's entry: pinned to `backend_id` (nat: from `src`); a SYN's waits for
/// its handshake, with the SYN's ISN.
#[inline(always)]
pub(crate) fn new_flow(backend_id: u32, syn: bool, isn: u32, src: Source, now: Now) -> FlowValue {
    // Zeroed whole, then filled: an aligned 24-byte clear, not a call to `memset`
    // for the unaligned padding.
    // SAFETY: FlowValue is plain integers; all-zero is a valid value.
    let mut value: FlowValue = unsafe { core::mem::zeroed() };
    value.backend_id = backend_id;
    value.flags = if syn { FLOW_F_SYN_PENDING } else { 0 };
    value.nat_port = src.port;
    value.nat_addr = src.addr;
    value.nat_tick = stamp(syn, isn, now.tick);
    value.last_seen_ns = now.ns;
    value
}

/// Pins a new flow to `backend_id` (nat: from `src`); a SYN's ISN is read here. A flow
/// opened by another packet waits for its proof: in nat (only a datagram opens one
/// there) the backend's answer (`FLOW_F_UNANSWERED`), in dsr and tunnel a later packet
/// (`FLOW_F_UNPROVEN`). Either is unconfirmed: `false` when its bucket, full of
/// confirmed flows, refused it (`flow::insert`).
#[inline(always)]
fn pin(pkt: &Packet, backend_id: u32, syn: bool, src: Source, now: Now, end: usize) -> bool {
    let isn = if syn { pkt.tcp_seq(end) } else { 0 };
    let mut value = new_flow(backend_id, syn, isn, src, now);
    if !syn {
        value.flags = if src.port != NO_SOURCE.port {
            FLOW_F_UNANSWERED
        } else {
            FLOW_F_UNPROVEN
        };
    }
    let pinned = flow::insert(&pkt.key, &value);
    // A copy this CPU may still hold of an evicted entry must not outlive the new one.
    cache::forget(&pkt.key);
    count(FLOW_NEW);
    pinned
}

/// The Maglev choice (from the slot read `early`, if it was); nat needs a backend of
/// the packet's family (no 4/6 translation).
#[inline(always)]
fn choose(
    pkt: &Packet,
    svc: &ServiceMeta,
    use_nat: bool,
    early: Option<Result<u32, u32>>,
) -> Result<(u32, &'static Backend), Verdict> {
    let slot = match early {
        Some(slot) => slot,
        None => flow::maglev_slot(svc, &pkt.key),
    };
    let (id, b) = slot.and_then(flow::slot_backend).map_err(|counter| {
        counters::service_no_backend(svc.service_id);
        Verdict::drop(counter)
    })?;
    if use_nat && b.family != pkt.key.family {
        return Err(Verdict::drop(DROP_BAD_BACKEND));
    }
    Ok((id, b))
}

/// Client-side handshake tracking on a pinned TCP flow; `true` when a SYN starts a new
/// connection on a settled flow (nat: its reverse entry must start over).
///
/// A SYN while the flow still waits for its handshake (here always a resend, same ISN,
/// see [`resend`]: `pinned` decides any other as a new flow) is a retransmission worth
/// reporting (`EVENT_SYN_RETRANSMIT`, once per flow; nat: noted in the reverse entry
/// `rev` too) only when the backend said nothing (nat: any backend packet ends the
/// wait, see `nat::reply`; `nat::sync_handshake` ran before) and it came at least
/// [`SYN_RESEND_MIN_NS`] after the SYN that started the wait (`last_seen_ns`, read
/// before `flow::touch`). A SYN on a settled flow is a new connection reusing the
/// 5-tuple and waits again (the caller keeps its ISN). In dsr the replies bypass us, so the client's first ACK
/// completes the handshake (`conn_ok`); in nat the backend's SYN-ACK does.
#[inline(always)]
fn handshake_forward(
    f: &mut FlowValue,
    service_id: u32,
    use_nat: bool,
    syn: bool,
    l4: L4,
    now: Now,
    rev: Option<&mut Reverse>,
) -> bool {
    if f.flags & FLOW_F_SYN_PENDING == 0 {
        if syn {
            f.flags |= FLOW_F_SYN_PENDING;
            f.last_seen_ns = now.ns;
            return true;
        }
        return false;
    }
    if syn {
        let waited = now.ns.wrapping_sub(f.last_seen_ns) as i64;
        if f.flags & FLOW_F_REPORTED == 0 && waited >= SYN_RESEND_MIN_NS as i64 {
            f.flags |= FLOW_F_REPORTED;
            if let Some(rev) = rev {
                nat::note_reported(rev);
            }
            events::emit(EVENT_SYN_RETRANSMIT, f.backend_id, service_id);
        }
    } else if !use_nat && l4.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_ACK {
        f.flags &= !FLOW_F_SYN_PENDING;
        counters::backend_conn_ok(f.backend_id);
    }
    false
}
