//! Header rewrites: MAC retargeting, and address/port translation with RFC 1624
//! incremental updates of the IPv4 header checksum and the TCP/UDP checksum.

use lb_common::{
    FAMILY_V4, IPPROTO_UDP,
    csum::{replace_addr, replace16, replace32},
};

use crate::{
    parse::{ETH_DST, ETH_HLEN, ETH_SRC, IPV4_HLEN, IPV6_HLEN, L4, Packet},
    pkt::{Hdr, ptr_at},
};

/// Sends the frame to `dst_mac`, from the MAC it was addressed to (our NIC's).
#[inline(always)]
pub fn retarget_l2(eth: Hdr<ETH_HLEN>, dst_mac: &[u8; 6]) {
    let ours = eth.mac::<ETH_DST>();
    eth.set_mac::<ETH_SRC>(&ours);
    eth.set_mac::<ETH_DST>(dst_mac);
}

/// Rewrites the 5-tuple's addresses and ports to `src:sport -> dst:dport` (same family;
/// IPv4 uses word 0) and updates the checksums incrementally.
///
/// A UDP/IPv4 checksum of 0 (none) stays 0; a computed UDP checksum of 0 is sent as
/// 0xffff (RFC 768).
///
/// The IP header is bounds-checked again here: once the family is a byte in a stack
/// copy of the key, the verifier no longer knows which length `parse` checked.
/// `None` is unreachable in practice (parse checked the same bytes).
#[inline(always)]
#[must_use]
pub fn translate(
    pkt: &Packet,
    l4: L4,
    src: &[u32; 4],
    sport: u16,
    dst: &[u32; 4],
    dport: u16,
    end: usize,
) -> Option<()> {
    let old = &pkt.key;
    let words = if old.family == FAMILY_V4 {
        let ip = ptr_at::<IPV4_HLEN>(pkt.l3, end)?;
        let check = ip.u16::<10>();
        let check = replace32(check, old.src[0], src[0]);
        let check = replace32(check, old.dst[0], dst[0]);
        ip.set_u32::<12>(src[0]);
        ip.set_u32::<16>(dst[0]);
        ip.set_u16::<10>(check);
        1
    } else {
        let ip = ptr_at::<IPV6_HLEN>(pkt.l3, end)?;
        ip.set_words4::<8>(src);
        ip.set_words4::<24>(dst);
        4
    };
    pkt.ports.set_u16::<0>(sport);
    pkt.ports.set_u16::<2>(dport);

    let udp = old.proto == IPPROTO_UDP;
    let check = l4.csum.u16::<0>();
    if udp && words == 1 && check == 0 {
        return Some(());
    }
    let check = replace_addr(check, &old.src, src, words);
    let check = replace_addr(check, &old.dst, dst, words);
    let check = replace16(check, old.sport, sport);
    let mut check = replace16(check, old.dport, dport);
    if udp && check == 0 {
        check = 0xffff;
    }
    l4.csum.set_u16::<0>(check);
    Some(())
}
