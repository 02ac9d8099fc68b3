//! Partial TCP/UDP checksums completed in native mode, before the packet is forwarded.
//!
//! A sender on the same host leaves the checksum of a TCP segment or UDP datagram to the
//! device (checksum offload): the field holds only the folded sum of the pseudo-header
//! (addresses, L4 length, protocol; not inverted), and the socket buffer says where the
//! device is to complete it. A veth whose peer keeps TX checksum offload (its default)
//! hands such packets over as they are. In generic mode the frame the program sends is
//! still that socket buffer, and the kernel completes the checksum on the way out; in
//! native mode the frame loses it, and receivers would drop the packet. So in native
//! mode ([`CONFIG_F_NATIVE`], written into `LB_CONFIG` at attach) a packet whose field
//! equals its pseudo-header's sum gets the full checksum, summed over the whole segment,
//! before anything else reads or rewrites it (nat's incremental updates, the tunnels'
//! encapsulation). A complete checksum that happens to equal that sum (one in 65,536)
//! comes out as it is, and is not counted: the segment's sum with the field in it is the
//! complement of the pseudo-header's sum either way. docs/internals/fast-path.md,
//! "Partial checksums".
//!
//! Which packets: those for a service or a nat source address, which the program
//! forwards, drops, or passes to the host itself (a local delivery trusts a checksum the
//! socket buffer marks partial); never a packet the host may route on, whose partial
//! checksum the kernel still completes from the field as it was.

use aya_ebpf::helpers::bpf_csum_diff;
use lb_common::{IPPROTO_UDP, counters::CSUM_COMPLETED, csum::fold, maps::CONFIG_F_NATIVE};

use crate::{
    counters::count,
    maps::LB_CONFIG,
    parse::{ETH_HLEN, Packet, TCP_HLEN, UDP_HLEN, VLAN_HLEN},
    pkt::ptr_at,
    tunnel::opaque,
};

/// The most bytes one `bpf_csum_diff` call sums (the helper's limit).
const CHUNK: usize = 512;
/// The longest segment completed (a longer one is left as it is): more than a
/// single-buffer frame holds (native mode's largest MTU on a veth is about 3.5 KB).
const MAX_SEGMENT: u32 = 4095;
/// The most header bytes before the segment: Ethernet, a VLAN tag, IPv4 with options.
const MAX_HEADERS: u32 = (ETH_HLEN + VLAN_HLEN + 60) as u32;
/// Masks that hold every offset up to [`MAX_HEADERS`] and length up to [`MAX_SEGMENT`].
const OFF_MASK: u32 = 0x7f;
const LEN_MASK: u32 = 0xfff;
const _: () = assert!(MAX_HEADERS <= OFF_MASK && MAX_SEGMENT <= LEN_MASK);
/// Offset of the checksum field in a TCP and in a UDP header.
const TCP_CSUM: usize = 16;
const UDP_CSUM: usize = 6;

/// Completes the TCP/UDP checksum of `pkt` if the program runs in native mode and the
/// field holds only the pseudo-header's sum. A UDP datagram without a checksum (0), and
/// a segment cut off by the frame's end, are left as they are.
///
/// Every packet access is made through a pointer made here from the frame's start and
/// an offset, never through `pkt`'s: a bounds check on the caller's pointers would widen
/// their proved range on some paths and not on others, and the verifier would explore
/// the rest of the path once for each.
#[inline(always)]
pub fn complete(pkt: &Packet, end: usize) {
    if !native() {
        return;
    }
    let udp = pkt.key.proto == IPPROTO_UDP;
    // The segment's offset, at most MAX_HEADERS for every packet `parse` admits; the
    // mask changes nothing but bounds it for the verifier (`opaque`: the compiler,
    // which cannot see that it changes nothing, keeps it).
    let off = opaque(pkt.len.wrapping_sub(pkt.l4_room) as u64) as u32 & OFF_MASK;
    let at = pkt.eth.addr() + off as usize;
    let field = if udp { UDP_CSUM } else { TCP_CSUM };
    let Some(f) = ptr_at::<2>(at + field, end) else {
        return;
    };
    let held = f.u16::<0>();
    if held != pseudo_sum(pkt) || (udp && held == 0) {
        return;
    }
    if fill_in(at, end, pkt.l4_len, udp) {
        count(CSUM_COMPLETED);
    }
}

/// Whether the agent attached the program in native mode.
#[inline(always)]
fn native() -> bool {
    LB_CONFIG
        .get(0)
        .is_some_and(|c| c.flags & CONFIG_F_NATIVE != 0)
}

/// The folded sum of the pseudo-header (not inverted), as a partial checksum holds it.
/// An IPv4 key's address words 1 to 3 are zero, so both families sum all eight.
#[inline(always)]
fn pseudo_sum(pkt: &Packet) -> u16 {
    let k = &pkt.key;
    let mut sum = (pkt.l4_len as u16).to_be() as u64 + (k.proto as u16).to_be() as u64;
    let mut i = 0;
    while i < 4 {
        sum += k.src[i] as u64 + k.dst[i] as u64;
        i += 1;
    }
    fold(sum)
}

/// Writes the full checksum of the TCP/UDP segment at `at` (whose end is `end`) into
/// its field, which holds the pseudo-header's sum: the complement of the segment's sum
/// with that sum in the field. The segment is `len` bytes long, and UDP if `udp` (a
/// result of 0 is then sent as 0xffff). `false` (nothing changed) for a field that holds
/// the full checksum already, a segment shorter than its header or longer than
/// [`MAX_SEGMENT`], or one cut off by the frame's end.
/// A subprogram of its own, so that its locals never add to the caller's frame
/// (docs/internals/fast-path.md, "Stack budget").
#[inline(never)]
fn fill_in(at: usize, end: usize, len: u32, udp: bool) -> bool {
    let (field, header) = if udp {
        (UDP_CSUM, UDP_HLEN)
    } else {
        (TCP_CSUM, TCP_HLEN)
    };
    if len > MAX_SEGMENT || len < header as u32 {
        return false;
    }
    // As `off` in `complete`: bounded for the verifier in whichever register it is
    // recomputed.
    let len = (opaque(len as u64) as u32 & LEN_MASK) as usize;
    let Some(sum) = segment_sum(at, len, end) else {
        return false;
    };
    let mut check = !fold(sum);
    if udp && check == 0 {
        check = 0xffff;
    }
    let Some(f) = ptr_at::<2>(at + field, end) else {
        return false;
    };
    if f.u16::<0>() == check {
        // A complete checksum that equals its pseudo-header's sum.
        return false;
    }
    f.set_u16::<0>(check);
    true
}

/// The one's-complement sum (unfolded) of the `len` bytes at `at` (`len` at most
/// [`MAX_SEGMENT`]), one piece per bit of the length, each at an offset computed from
/// the length: the last one to three bytes, then 4 to 512 bytes in one helper call each,
/// 1,024 and 2,048 bytes in calls of [`CHUNK`]; `None` past the frame's end. The 2,048
/// bytes come last: only they lie at offset 0 for every length, a constant the verifier
/// folds into `at` (widening the proved range of `at` and what shares it, the field), so
/// that only the end of the path differs with them.
#[inline(always)]
fn segment_sum(at: usize, len: usize, end: usize) -> Option<u64> {
    let mut sum: u64 = 0;
    let last = at + (len & !3);
    if len & 2 != 0 {
        sum += ptr_at::<2>(last, end)?.u16::<0>() as u64;
    }
    if len & 1 != 0 {
        // The last byte opens a 16-bit word whose second byte is zero.
        let b = ptr_at::<1>(last + (len & 2), end)?;
        sum += u16::from_ne_bytes([b.u8::<0>(), 0]) as u64;
    }
    macro_rules! piece {
        ($n:literal) => {
            if len & $n != 0 {
                sum += add::<$n>(at + (len & !(2 * $n - 1)), end)?;
            }
        };
    }
    piece!(4);
    piece!(8);
    piece!(16);
    piece!(32);
    piece!(64);
    piece!(128);
    piece!(256);
    piece!(512);
    if len & 1024 != 0 {
        let p = at + (len & !2047);
        sum += add::<CHUNK>(p, end)? + add::<CHUNK>(p + CHUNK, end)?;
    }
    if len & 2048 != 0 {
        sum += add::<CHUNK>(at, end)?
            + add::<CHUNK>(at + CHUNK, end)?
            + add::<CHUNK>(at + 2 * CHUNK, end)?
            + add::<CHUNK>(at + 3 * CHUNK, end)?;
    }
    Some(sum)
}

/// The one's-complement sum (unfolded) of the `N` bytes at `at`, `N` a multiple of 4 up
/// to [`CHUNK`]; `None` past the frame's end.
#[inline(always)]
fn add<const N: usize>(at: usize, end: usize) -> Option<u64> {
    let bytes = ptr_at::<N>(at, end)?;
    // SAFETY: `N` bytes of the packet, bounds-checked; the helper only reads them.
    let s = unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, bytes.raw().cast(), N as u32, 0) };
    // A negative result is an error (a size the helper refuses): never for these sizes.
    (s >= 0).then_some(s as u64)
}
