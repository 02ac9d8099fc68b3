//! Partial checksums (docs/internals/fast-path.md, "Partial checksums"): in native mode a
//! TCP/UDP packet whose checksum field holds only its pseudo-header's sum (as a sender
//! on the same host leaves it for the device, and a veth hands it over) leaves with its
//! full checksum, through dsr, nat and a nat reply, over IPv4 and IPv6; a complete
//! checksum is left as it is, uncounted even when it equals its pseudo-header's sum; in
//! generic mode (the kernel completes it) a partial one is left as it is too. Expected frames are built from scratch (`lb_tests::traffic::packet`'s own sum)
//! and the output's checksums verified again by etherparse.

use lb_common::maps::{CONFIG_F_NATIVE, DataplaneConfig};

use super::prelude::*;

/// The world's services, the program told it runs in native mode.
fn native_world(tables: &[u32]) -> Lb {
    let mut lb = world(tables);
    lb.set_config(DataplaneConfig {
        mac: LB_MAC,
        flags: CONFIG_F_NATIVE,
        ..DataplaneConfig::default()
    });
    lb
}

/// `frame`'s bytes with the TCP/UDP checksum as a sender that offloads it leaves it: the
/// folded pseudo-header sum, not inverted.
fn partial(frame: &Frame) -> Vec<u8> {
    let bytes = frame.partial_checksum_bytes();
    assert_ne!(
        bytes,
        frame.bytes(),
        "a partial checksum differs from the full one"
    );
    bytes
}

#[test]
fn native_mode_completes_partial_checksums_through_dsr() {
    let mut lb = native_world(&[DSR4, DSR4_UDP, DSR6]);
    // Segment lengths that take every piece of the sum: odd and even, one byte to more
    // than 2 KiB.
    for (i, len) in [0usize, 1, 2, 3, 5, 511, 1024, 1460, 2047, 3001]
        .into_iter()
        .enumerate()
    {
        let payload: Vec<u8> = (0..len).map(|b| (b * 7 + i) as u8).collect();
        let sport = CPORT + i as u16;
        for id in [DSR4, DSR4_UDP, DSR6] {
            let frame = to_vip(id, sport, TCP_SYN).payload(&payload);
            sent_as(
                &mut lb,
                &format!("dsr service {id}: a partial checksum, {len}-byte payload"),
                partial(&frame),
                dsr_expected(&frame, svc(id).backend),
                &[(TX_DSR, 1), (FLOW_NEW, 1), (CSUM_COMPLETED, 1)],
            );
        }
    }
}

#[test]
fn native_mode_completes_partial_checksums_through_nat_both_ways() {
    let mut lb = native_world(&[NAT4, NAT4_UDP, NAT6, NAT6_UDP]);
    for id in [NAT4, NAT4_UDP, NAT6, NAT6_UDP] {
        let out = to_vip(id, CPORT, TCP_SYN).payload(b"client data, odd");
        let port = nat_forward_bytes(
            &mut lb,
            &format!("nat service {id}: a client packet with a partial checksum"),
            &out,
            partial(&out),
            id,
            &[
                (TX_NAT_FORWARD, 1),
                (FLOW_NEW, 1),
                (NAT_PORT_FIRST, 1),
                (CSUM_COMPLETED, 1),
            ],
        );
        let back = backend_reply(id, port, TCP_SYN | TCP_ACK).payload(b"backend reply");
        sent_as(
            &mut lb,
            &format!("nat service {id}: a backend reply with a partial checksum"),
            partial(&back),
            reply_expected(&back, id, CPORT),
            &[(TX_NAT_REPLY, 1), (CSUM_COMPLETED, 1)],
        );
    }
}

#[test]
fn native_mode_leaves_complete_checksums_as_they_are() {
    let mut lb = native_world(&[DSR4, NAT4_UDP]);
    let syn = to_vip(DSR4, CPORT, TCP_SYN).payload(b"complete");
    sent_as(
        &mut lb,
        "dsr: a complete checksum",
        syn.bytes(),
        dsr_expected(&syn, svc(DSR4).backend),
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );
    let q = to_vip(NAT4_UDP, CPORT, 0).payload(b"query");
    nat_forward(
        &mut lb,
        "nat: a complete UDP checksum",
        &q,
        NAT4_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let mut none = to_vip(NAT4_UDP, CPORT + 1, 0).payload(b"nocsum");
    none.transport = Transport::Udp {
        sport: CPORT + 1,
        dport: 53,
        zero_csum: true,
    };
    nat_forward(
        &mut lb,
        "nat: UDP/IPv4 without a checksum keeps none",
        &none,
        NAT4_UDP,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
}

/// A TCP SYN of service `id` whose complete checksum equals its pseudo-header's sum:
/// `payload` and two bytes chosen for it.
fn complete_like_partial(id: u32, payload: &[u8]) -> Frame {
    assert!(payload.len().is_multiple_of(2), "the two bytes open a word");
    let with = |x: u16| {
        let mut p = payload.to_vec();
        p.extend_from_slice(&x.to_be_bytes());
        to_vip(id, CPORT, TCP_SYN).payload(&p)
    };
    let base = with(0);
    let pseudo = fold(pseudo_header_sum(
        base.src,
        base.dst,
        IPPROTO_TCP,
        base.l4_bytes().len(),
    ));
    let field = base.l4_offset() + 16;
    let checksum = |f: &Frame| u16::from_be_bytes([f.bytes()[field], f.bytes()[field + 1]]);
    // The checksum is the complement of a sum the last word adds to: with that word at
    // x it is the checksum at 0 less x (one's complement), so x = checksum(0) - pseudo.
    let x = fold(u64::from(checksum(&base)) + u64::from(!pseudo));
    let frame = with(x);
    assert_eq!(
        checksum(&frame),
        pseudo,
        "the chosen bytes make the checksum its pseudo-header's sum"
    );
    frame
}

#[test]
fn native_mode_keeps_a_complete_checksum_that_equals_the_pseudo_header_sum() {
    let mut lb = native_world(&[DSR4]);
    let frame = complete_like_partial(DSR4, b"complete, like a partial one");
    sent_as(
        &mut lb,
        "dsr: a complete checksum equal to the pseudo-header's sum comes out as it is",
        frame.bytes(),
        dsr_expected(&frame, svc(DSR4).backend),
        &[(TX_DSR, 1), (FLOW_NEW, 1)],
    );
}

#[test]
fn generic_mode_leaves_a_partial_checksum_to_the_kernel() {
    let mut lb = world(&[DSR4, DSR6]);
    for id in [DSR4, DSR6] {
        let syn = to_vip(id, CPORT, TCP_SYN).payload(b"partial");
        let input = partial(&syn);
        let mut expected = input.clone();
        expected[..12].copy_from_slice(&dsr_expected(&syn, svc(id).backend)[..12]);
        transmitted(
            &mut lb,
            &format!("dsr service {id}, generic mode: only the MACs change"),
            input,
            Out::Frame(expected),
            &[(TX_DSR, 1), (FLOW_NEW, 1)],
        );
    }
}
