//! A test-bed program, never attached by the agent: `lbt_syn_responder_tc` stands in for
//! many remote hosts answering a prober's SYN checks (`lb-probe-bench --net remote`).
//!
//! On the far end of the bench's veth pair, it answers every IPv4 TCP SYN with a SYN-ACK
//! (target open) or an RST-ACK (target closed, `LBT_CLOSED`), built in place from the SYN
//! and sent back out of the same interface, and drop every other TCP segment (the
//! prober's RSTs that end each half-open connection, which a remote host would consume).
//! Anything else (ARP) goes to the kernel, which owns the targets' addresses. A remote
//! host's kernel work is then not on this machine's CPUs: at 100,000 targets a second the
//! responder costs a few percent of one CPU, where real listeners in a namespace cost
//! the rest of the two this machine has.
//!
//! TC (ingress, `bpf_redirect` to the interface's egress), not XDP: its answers go
//! through the interface's queue, which holds a burst while the peer's ring is full, as a
//! NIC's transmit queue would. An XDP program's `XDP_TX` answers go straight into the
//! peer's 256-entry ring and are lost when it is full (`xdp_tx_errors`): 18 % of the
//! answers at 100,000 probes a second, each counted against the prober.
//!
//! The SYN-ACK keeps the SYN's TCP options as they are (a prober checks the flags and
//! the acknowledgement number); its sequence number is derived from the SYN's.

use aya_ebpf::{
    EbpfContext,
    bindings::{__sk_buff, TC_ACT_OK, TC_ACT_SHOT},
    btf_maps::Array,
    helpers::bpf_redirect,
    macros::{btf_map, classifier},
    programs::TcContext,
};
use lb_common::csum::{replace16, replace32};

use crate::{
    parse::{ETH_DST, ETH_HLEN, ETH_SRC},
    pkt::ptr_at,
};

/// Targets the responder knows: index `(last address byte - LBT_FIRST_HOST) ×
/// LBT_PORTS_PER_HOST + (port - LBT_BASE_PORT)`.
pub const LBT_TARGETS: u32 = 1 << 18;
/// The first target address's last byte (10.203.0.2, …: the bench's `target_net`).
pub const LBT_FIRST_HOST: u8 = 2;
/// Ports per target address, from [`LBT_BASE_PORT`].
pub const LBT_PORTS_PER_HOST: u32 = 10_000;
/// The first target port on each address.
pub const LBT_BASE_PORT: u16 = 20_000;

/// Per target: nonzero when it is closed (answered with an RST). Written by the bench.
#[btf_map]
static LBT_CLOSED: Array<u8, { LBT_TARGETS as usize }> = Array::new();

const ETH_P_IP: u16 = 0x0800;
const IPPROTO_TCP: u8 = 6;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
/// An IPv4 header without options and a TCP header without options.
const IP_HLEN: usize = 20;
const TCP_HLEN: usize = 20;

/// What the responder did with a frame.
enum Answer {
    /// Rewritten into the target's answer: send it back.
    Reply,
    /// The prober's other segments: consumed.
    Consume,
    /// Not a TCP segment over IPv4: the kernel's.
    Pass,
}

/// Answers SYNs as open or closed targets would (see the module), at TC ingress: the
/// answer leaves through the interface's egress (its queue).
#[classifier]
pub fn lbt_syn_responder_tc(ctx: TcContext) -> i32 {
    // A SYN is far shorter than any linear head; a failure only leaves the bounds
    // checks below to pass the frame on.
    let _ = ctx.pull_data((ETH_HLEN + IP_HLEN + TCP_HLEN) as u32);
    match answer(ctx.data(), ctx.data_end()) {
        Answer::Reply => {
            // SAFETY: the context of a TC program is its `__sk_buff`.
            let ifindex = unsafe { (*(ctx.as_ptr() as *const __sk_buff)).ifindex };
            // SAFETY: a helper call with plain arguments.
            unsafe { bpf_redirect(ifindex, 0) as i32 }
        }
        Answer::Consume => TC_ACT_SHOT,
        Answer::Pass => TC_ACT_OK,
    }
}

/// Turns the frame between `data` and `end` into its target's answer (see the module).
#[inline(always)]
fn answer(data: usize, end: usize) -> Answer {
    let Some(eth) = ptr_at::<ETH_HLEN>(data, end) else {
        return Answer::Pass;
    };
    if eth.u16::<12>() != ETH_P_IP.to_be() {
        return Answer::Pass;
    }
    let Some(ip) = ptr_at::<IP_HLEN>(data + ETH_HLEN, end) else {
        return Answer::Pass;
    };
    // Version 4 without options; not a fragment.
    if ip.u8::<0>() != 0x45 || ip.u8::<9>() != IPPROTO_TCP || ip.u16::<6>() & 0xff3f != 0 {
        return Answer::Pass;
    }
    let Some(tcp) = ptr_at::<TCP_HLEN>(data + ETH_HLEN + IP_HLEN, end) else {
        return Answer::Consume;
    };
    let flags = tcp.u8::<13>();
    if flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) != TCP_SYN {
        return Answer::Consume;
    }

    let saddr = ip.u32::<12>();
    let daddr = ip.u32::<16>();
    let sport = tcp.u16::<0>();
    let dport = tcp.u16::<2>();
    let host = daddr.to_ne_bytes()[3].wrapping_sub(LBT_FIRST_HOST) as u32;
    let port = u16::from_be(dport).wrapping_sub(LBT_BASE_PORT) as u32;
    let closed = port >= LBT_PORTS_PER_HOST
        || LBT_CLOSED
            .get(host * LBT_PORTS_PER_HOST + port)
            .is_none_or(|c| *c != 0);

    // Addresses and ports swap places: the checksums' sums do not change.
    let (dst, src) = (eth.mac::<ETH_DST>(), eth.mac::<ETH_SRC>());
    eth.set_mac::<ETH_DST>(&src);
    eth.set_mac::<ETH_SRC>(&dst);
    ip.set_u32::<12>(daddr);
    ip.set_u32::<16>(saddr);
    tcp.set_u16::<0>(dport);
    tcp.set_u16::<2>(sport);

    let seq = tcp.u32::<4>();
    let old_ack = tcp.u32::<8>();
    let ack = (u32::from_be(seq).wrapping_add(1)).to_be();
    let new_seq = if closed {
        0
    } else {
        // Any number the prober cannot predict from its own; a fixed mix of its ISN.
        (u32::from_be(seq).wrapping_mul(0x9e37_79b9) ^ 0x5bd1_e995).to_be()
    };
    let old_word = tcp.u16::<12>();
    let reply = if closed {
        TCP_RST | TCP_ACK
    } else {
        TCP_SYN | TCP_ACK
    };
    let new_word = u16::from_ne_bytes([old_word.to_ne_bytes()[0], reply]);
    let mut check = tcp.u16::<16>();
    check = replace32(check, seq, new_seq);
    check = replace32(check, old_ack, ack);
    check = replace16(check, old_word, new_word);
    tcp.set_u32::<4>(new_seq);
    tcp.set_u32::<8>(ack);
    tcp.set_u16::<12>(new_word);
    tcp.set_u16::<16>(check);
    Answer::Reply
}
