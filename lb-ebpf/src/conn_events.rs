//! Cluster mode: nat connections established and ended, to the agent through the
//! `LB_CONN_EVENTS` ring buffer (never blocks), which shares them with the other nodes.
//!
//! A connection's reverse entry changes state where the program notes it (the client's
//! ACK of the SYN-ACK, a UDP flow's first reply, a FIN, a reset); [`changed`] sends an
//! event only when that change crosses `nat_conn_established` or `nat_conn_ended`, so a
//! connection sends each at most once, never one per packet. A full ring buffer drops the
//! event and counts `CONN_EVENTS_LOST`.

use core::ptr::{addr_of_mut, read_volatile};

use lb_common::{
    counters::{CONN_EVENTS_LOST, CONN_EVENTS_SENT},
    events::{CONN_ENDED, CONN_ESTABLISHED},
    maps::{FlowKey, NatValue, nat_conn_ended, nat_conn_established},
};

use crate::{counters::count, maps::LB_CONN_EVENTS};

/// Sends the event the state change `old` -> `new` of the reverse entry `nat` (keyed by
/// `reply`, protocol `proto`) makes, if any: `CONN_ESTABLISHED` when it becomes
/// established, `CONN_ENDED` when it ends. The caller has written `new` into `nat` and
/// runs only in cluster mode (`layout::cluster`).
#[inline(always)]
pub fn changed(reply: &FlowKey, nat: &NatValue, old: u8, new: u8, proto: u8) {
    let change = u64::from(old) | u64::from(new) << 8 | u64::from(proto) << 16;
    lb_conn_event(reply, nat, change);
}

/// The event kind of a state change as [`changed`] packs it, or 0.
#[inline(always)]
fn kind(change: u64) -> u32 {
    let (old, new, proto) = (change as u8, (change >> 8) as u8, (change >> 16) as u8);
    if !nat_conn_established(old, proto) && nat_conn_established(new, proto) {
        CONN_ESTABLISHED
    } else if !nat_conn_ended(old, proto) && nat_conn_ended(new, proto) {
        CONN_ENDED
    } else {
        0
    }
}

/// Writes the [`ConnEvent`] a state change (`change`, packed by [`changed`]) makes, if
/// any, into the ring: the reply 5-tuple `reply`, the entry `nat`, and the client's
/// 5-tuple rebuilt from both. A BPF global function: the verifier checks it once, and
/// its frame (it has none to speak of: the event is written in place in the ring) is all
/// it adds to its callers' (docs/internals/fast-path.md, "Stack budget"). Returns 0.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lb_conn_event(reply: *const FlowKey, nat: *const NatValue, change: u64) -> u64 {
    let kind = kind(change);
    if reply.is_null() || nat.is_null() || kind == 0 {
        return 0;
    }
    // SAFETY: non-NULL pointers the verifier checked to cover the types' sizes.
    let (reply, nat) = unsafe { (&*reply, &*nat) };
    let Some(mut entry) = LB_CONN_EVENTS.reserve(0) else {
        count(CONN_EVENTS_LOST);
        return 0;
    };
    let e = entry.as_mut_ptr();
    // SAFETY: `e` is the reservation, exclusively ours until submitted; every byte of it
    // is written (no kernel memory reaches the agent). The reads are volatile: a value
    // read once and stored twice (the client's address is in the client key and in the
    // entry) would be kept in a stack slot, and this function's frame adds to its
    // callers' (docs/internals/fast-path.md, "Stack budget").
    unsafe {
        addr_of_mut!((*e).kind).write(kind);
        addr_of_mut!((*e)._pad).write(0);
        let c = addr_of_mut!((*e).client);
        copy_addr(addr_of_mut!((*c).src), &nat.client_addr);
        copy_addr(addr_of_mut!((*c).dst), &nat.vip_addr);
        addr_of_mut!((*c).sport).write(read_volatile(&nat.client_port));
        addr_of_mut!((*c).dport).write(read_volatile(&nat.vip_port));
        addr_of_mut!((*c).proto).write(read_volatile(&reply.proto));
        addr_of_mut!((*c).family).write(read_volatile(&reply.family));
        addr_of_mut!((*c)._pad).write([0; 2]);
        let r = addr_of_mut!((*e).reply);
        copy_addr(addr_of_mut!((*r).src), &reply.src);
        copy_addr(addr_of_mut!((*r).dst), &reply.dst);
        addr_of_mut!((*r).sport).write(read_volatile(&reply.sport));
        addr_of_mut!((*r).dport).write(read_volatile(&reply.dport));
        addr_of_mut!((*r).proto).write(read_volatile(&reply.proto));
        addr_of_mut!((*r).family).write(read_volatile(&reply.family));
        addr_of_mut!((*r)._pad).write([0; 2]);
        let n = addr_of_mut!((*e).nat);
        copy_addr(addr_of_mut!((*n).client_addr), &nat.client_addr);
        copy_addr(addr_of_mut!((*n).vip_addr), &nat.vip_addr);
        addr_of_mut!((*n).client_port).write(read_volatile(&nat.client_port));
        addr_of_mut!((*n).vip_port).write(read_volatile(&nat.vip_port));
        addr_of_mut!((*n).backend_id).write(read_volatile(&nat.backend_id));
        let mac = addr_of_mut!((*n).client_mac).cast::<u8>();
        let mut i = 0;
        while i < 6 {
            mac.add(i).write(read_volatile(&nat.client_mac[i]));
            i += 1;
        }
        addr_of_mut!((*n).state).write(read_volatile(&nat.state));
        addr_of_mut!((*n).handshake).write(read_volatile(&nat.handshake));
        addr_of_mut!((*n).last_seen).write(read_volatile(&nat.last_seen));
        addr_of_mut!((*n)._pad2).write(0);
    }
    entry.submit(0);
    count(CONN_EVENTS_SENT);
    0
}

/// Copies an address word by word, each word read (volatile) right before it is written.
///
/// # Safety
/// `to` is valid for writes of 16 bytes.
#[inline(always)]
unsafe fn copy_addr(to: *mut [u32; 4], from: &[u32; 4]) {
    let to = to.cast::<u32>();
    let mut i = 0;
    while i < 4 {
        // SAFETY: `i < 4`, inside both addresses.
        unsafe { to.add(i).write(read_volatile(&from[i])) };
        i += 1;
    }
}
