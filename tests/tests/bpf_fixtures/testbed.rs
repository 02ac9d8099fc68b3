//! The probe bench's stand-in for remote hosts (`lbt_syn_responder_tc`,
//! `lb_tests::bpf::syn_responder`): a SYN to an open target comes back as that target's
//! SYN-ACK, to a closed one as its RST-ACK, both byte for byte as built from scratch
//! (checksums included); the prober's other segments are consumed, other traffic passed.

use super::prelude::*;
use lb_tests::bpf::syn_responder::{PORTS_PER_HOST, SynResponder};

const PROBER: [u8; 4] = [10, 203, 0, 1];
const PROBER_MAC: [u8; 6] = [0x02, 0xbe, 0, 0, 0, 1];
const TARGETS_MAC: [u8; 6] = [0x02, 0xbe, 0, 0, 0, 2];
const SPORT: u16 = 47_001;

/// The prober's segment with `flags` to target 10.203.0.3:`port` (the second address).
fn from_prober(port: u16, flags: u8) -> Frame {
    let [a, b, c, d] = PROBER;
    Frame::tcp(ip4(a, b, c, d), SPORT, ip4(10, 203, 0, 3), port, flags)
        .macs(PROBER_MAC, TARGETS_MAC)
}

/// What the target answers to [`from_prober`]'s SYN: `flags`, sequence `seq`.
fn answer(port: u16, flags: u8, seq: u32) -> Vec<u8> {
    let syn = from_prober(port, TCP_SYN);
    let Transport::Tcp { seq: syn_seq, .. } = syn.transport else {
        unreachable!("a TCP frame")
    };
    let mut f = Frame::tcp(syn.dst, port, syn.src, SPORT, flags).macs(TARGETS_MAC, PROBER_MAC);
    f.transport = Transport::Tcp {
        sport: port,
        dport: SPORT,
        flags,
        seq,
        ack: syn_seq.wrapping_add(1),
    };
    f.bytes()
}

/// The TC verdicts: send the answer back out (`TC_ACT_REDIRECT`), consumed
/// (`TC_ACT_SHOT`), the kernel's (`TC_ACT_OK`).
const REPLY: u32 = 7;
const CONSUME: u32 = 2;
const PASS: u32 = 0;

#[test]
fn the_syn_responder_answers_as_open_and_closed_targets_would() {
    let mut r = SynResponder::load().expect("loading the SYN responder");
    let run =
        |r: &mut SynResponder, frame: &Frame| r.run(&frame.bytes()).expect("BPF_PROG_TEST_RUN");
    // 10.203.0.3:20007 is target PORTS_PER_HOST + 7.
    r.set_closed(PORTS_PER_HOST + 7, true)
        .expect("closing one target");
    let isn = 0x1000_0000u32.wrapping_mul(0x9e37_79b9) ^ 0x5bd1_e995;

    let (action, out) = run(&mut r, &from_prober(20_005, TCP_SYN));
    assert_eq!(action, REPLY, "an open target answers");
    assert_frames_eq(
        "the open target's SYN-ACK",
        &answer(20_005, TCP_SYN | TCP_ACK, isn),
        &out,
    );
    let (action, out) = run(&mut r, &from_prober(20_007, TCP_SYN));
    assert_eq!(action, REPLY, "a closed target answers");
    assert_frames_eq(
        "the closed target's RST-ACK",
        &answer(20_007, TCP_RST | TCP_ACK, 0),
        &out,
    );
    r.set_closed(PORTS_PER_HOST + 7, false)
        .expect("opening it again");
    let (_, out) = run(&mut r, &from_prober(20_007, TCP_SYN));
    assert_frames_eq(
        "opened again, a SYN-ACK",
        &answer(20_007, TCP_SYN | TCP_ACK, isn),
        &out,
    );
    let (_, out) = run(&mut r, &from_prober(40_000, TCP_SYN));
    assert_frames_eq(
        "a port past the targets' range is closed",
        &answer(40_000, TCP_RST | TCP_ACK, 0),
        &out,
    );
    for (what, flags) in [
        ("the prober's RST", TCP_RST),
        ("an ACK", TCP_ACK),
        ("a SYN-ACK", TCP_SYN | TCP_ACK),
        ("a FIN", TCP_FIN | TCP_ACK),
    ] {
        let (action, _) = run(&mut r, &from_prober(20_005, flags));
        assert_eq!(action, CONSUME, "{what} is consumed");
    }
    let [a, b, c, d] = PROBER;
    let udp = Frame::udp(ip4(a, b, c, d), SPORT, ip4(10, 203, 0, 3), 20_005)
        .macs(PROBER_MAC, TARGETS_MAC);
    let (action, _) = run(&mut r, &udp);
    assert_eq!(action, PASS, "not TCP, the kernel's");
}
