//! The VIP path: pin the flow to a backend (flow table, else Maglev), account it, watch
//! the TCP handshake for passive signals, then hand the packet to dsr or nat.

use lb_common::{
    counters::{DROP_BAD_BACKEND, DROP_MALFORMED, DROP_NAT_PORTS, FLOW_HIT, FLOW_NEW, FLOW_REHASH},
    events::EVENT_SYN_RETRANSMIT,
    maps::{Backend, FLOW_F_REPORTED, FLOW_F_SYN_PENDING, FlowValue, SERVICE_F_NAT, ServiceMeta},
};

use crate::{
    Verdict,
    clock::{self, Now},
    counters::{self, count},
    dsr, events, flow, nat,
    parse::{ETH_SRC, L4, Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, is_syn},
    validate,
};

/// Balances one packet addressed to the service `svc`.
#[inline(always)]
pub fn to_service(pkt: &Packet, svc: &ServiceMeta, end: usize) -> Verdict {
    let Some(l4) = pkt.l4(end) else {
        return Verdict::drop(DROP_MALFORMED);
    };
    let sid = svc.service_id;
    let use_nat = svc.flags & SERVICE_F_NAT != 0;
    let syn = pkt.is_tcp() && is_syn(l4.tcp_flags);
    let now = clock::now();
    // A SYN most likely opens a flow: read its Maglev slot before the flow-table lookup,
    // so that the slot's cache miss overlaps the lookup's instead of following it.
    let early = if syn {
        Some(flow::maglev_slot(sid, &pkt.key))
    } else {
        None
    };

    let (backend_id, backend, nat_port, new_flow) = match flow::lookup(&pkt.key) {
        Some(f) => {
            // SAFETY: this packet's flow entry; LB_FLOWS is not written while it lives.
            let f = unsafe { &mut *f };
            match pinned(pkt, svc, f, use_nat, syn, l4, now) {
                Ok(p) => p,
                Err(v) => return v,
            }
        }
        None => {
            // The checks a packet must pass before it may open a flow.
            if let Some(refused) = validate::opening(pkt, l4, end) {
                return refused;
            }
            match open(pkt, svc, use_nat, syn, now, early) {
                Ok(p) => p,
                Err(v) => return v,
            }
        }
    };

    counters::service_packet(sid, pkt.len, new_flow);
    counters::backend_packet(backend_id, pkt.len, new_flow);
    if use_nat {
        nat::forward(pkt, l4, svc, backend, nat_port, end)
    } else {
        dsr::forward(pkt, backend)
    }
}

/// (backend id, backend, nat port, whether the flow is new)
type Choice = (u32, &'static Backend, u16, bool);

/// A packet of a pinned flow: keep its backend while it is live, else re-hash.
#[inline(always)]
fn pinned(
    pkt: &Packet,
    svc: &ServiceMeta,
    f: &mut FlowValue,
    use_nat: bool,
    syn: bool,
    l4: L4,
    now: Now,
) -> Result<Choice, Verdict> {
    let id = f.backend_id;
    if let Some(b) = flow::live_backend(id) {
        count(FLOW_HIT);
        flow::touch(f, now.ns);
        if pkt.is_tcp() {
            handshake_forward(f, svc.service_id, use_nat, syn, l4.tcp_flags);
        }
        let mut port = 0;
        if use_nat {
            port = f.nat_port;
            if pkt.is_tcp() && l4.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
                nat::client_closing(&pkt.key, svc, b, port, l4.tcp_flags);
            }
            // The reverse entry is verified once per tick (see `nat::ensure`).
            if f.nat_tick != now.tick {
                let mac = pkt.eth.mac::<ETH_SRC>();
                port = nat::ensure(&pkt.key, svc, b, id, port, mac)
                    .ok_or(Verdict::drop(DROP_NAT_PORTS))?;
                if port != f.nat_port {
                    f.nat_port = port;
                }
                f.nat_tick = now.tick;
            }
        }
        return Ok((id, b, port, false));
    }

    let (new_id, b) = choose(pkt, svc, use_nat, None)?;
    let mut port = 0;
    if use_nat {
        if let Some(old) = flow::any_backend(id) {
            nat::release(&pkt.key, svc, old, f.nat_port);
        }
        port = allocate(pkt, svc, b, new_id)?;
    }
    count(FLOW_REHASH);
    f.backend_id = new_id;
    f.flags = if syn { FLOW_F_SYN_PENDING } else { 0 };
    f.nat_port = port;
    f.nat_tick = now.tick;
    f.last_seen_ns = now.ns;
    Ok((new_id, b, port, true))
}

/// A packet without a flow entry: choose through Maglev and pin.
#[inline(always)]
fn open(
    pkt: &Packet,
    svc: &ServiceMeta,
    use_nat: bool,
    syn: bool,
    now: Now,
    early: Option<Result<u32, u32>>,
) -> Result<Choice, Verdict> {
    let (id, b) = choose(pkt, svc, use_nat, early)?;
    let port = if use_nat {
        allocate(pkt, svc, b, id)?
    } else {
        0
    };
    // Zeroed whole, then filled: an aligned 24-byte clear, not a call to `memset`
    // for the unaligned padding.
    // SAFETY: FlowValue is plain integers; all-zero is a valid value.
    let mut value: FlowValue = unsafe { core::mem::zeroed() };
    value.backend_id = id;
    value.flags = if syn { FLOW_F_SYN_PENDING } else { 0 };
    value.nat_port = port;
    value.nat_tick = now.tick;
    value.last_seen_ns = now.ns;
    flow::insert(&pkt.key, &value);
    count(FLOW_NEW);
    Ok((id, b, port, true))
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
        None => flow::maglev_slot(svc.service_id, &pkt.key),
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

#[inline(always)]
fn allocate(pkt: &Packet, svc: &ServiceMeta, b: &Backend, id: u32) -> Result<u16, Verdict> {
    let mac = pkt.eth.mac::<ETH_SRC>();
    nat::allocate(&pkt.key, svc, b, id, mac).ok_or(Verdict::drop(DROP_NAT_PORTS))
}

/// Client-side handshake tracking on a pinned TCP flow.
///
/// A SYN while the flow still waits for its handshake is a retransmission: the backend
/// did not answer in time (`EVENT_SYN_RETRANSMIT`, once per flow). A SYN on a settled
/// flow is a new connection reusing the 5-tuple and waits again. In dsr the replies
/// bypass us, so the client's first ACK completes the handshake (`conn_ok`); in nat the
/// backend's SYN-ACK does (see `nat::reply`).
#[inline(always)]
fn handshake_forward(f: &mut FlowValue, service_id: u32, use_nat: bool, syn: bool, flags: u8) {
    if f.flags & FLOW_F_SYN_PENDING == 0 {
        if syn {
            f.flags |= FLOW_F_SYN_PENDING;
        }
        return;
    }
    if syn {
        if f.flags & FLOW_F_REPORTED == 0 {
            f.flags |= FLOW_F_REPORTED;
            events::emit(EVENT_SYN_RETRANSMIT, f.backend_id, service_id);
        }
    } else if !use_nat && flags & (TCP_SYN | TCP_ACK) == TCP_ACK {
        f.flags &= !FLOW_F_SYN_PENDING;
        counters::backend_conn_ok(f.backend_id);
    }
}
