//! Bounds-checked packet access: a header is checked once against `data_end`, then its
//! fields are read and written at offsets the compiler proves lie inside it.
//!
//! Loads and stores are unaligned (a 14-byte Ethernet header leaves IP addresses at
//! 2 mod 4) and native-endian: values keep the wire's byte order, which is what the map
//! keys and the checksum helpers expect.

use core::ptr;

/// A pointer to `N` packet bytes that were checked to lie before `data_end`.
#[derive(Clone, Copy)]
pub struct Hdr<const N: usize>(*mut u8);

/// Returns the `N` bytes at `addr`, or `None` when the packet ends before them.
///
/// `addr` is an address inside the packet (`data` plus a bounded offset).
#[inline(always)]
pub fn ptr_at<const N: usize>(addr: usize, data_end: usize) -> Option<Hdr<N>> {
    if addr + N > data_end {
        return None;
    }
    Some(Hdr(addr as *mut u8))
}

impl<const N: usize> Hdr<N> {
    /// The header's first byte (its `N` bytes are bounds-checked).
    #[cfg_attr(not(feature = "lab"), allow(dead_code))] // the lab's reflector
    #[inline(always)]
    pub fn as_ptr(self) -> *mut u8 {
        self.0
    }

    /// The address of the header's first byte.
    #[inline(always)]
    pub fn addr(self) -> usize {
        self.0 as usize
    }

    /// Re-creates a view of a header that was checked earlier (the verifier still knows
    /// its range: the pointer is the same register or stack slot).
    ///
    /// # Safety
    /// `p` must come from a `Hdr<M>` with `M >= N` of the same packet.
    #[inline(always)]
    pub unsafe fn assume(p: *mut u8) -> Self {
        Hdr(p)
    }

    #[inline(always)]
    pub fn raw(self) -> *mut u8 {
        self.0
    }

    #[inline(always)]
    pub fn u8<const OFF: usize>(self) -> u8 {
        const { assert!(OFF < N) };
        // SAFETY: OFF < N and the N bytes were bounds-checked.
        unsafe { *self.0.add(OFF) }
    }

    #[inline(always)]
    pub fn u16<const OFF: usize>(self) -> u16 {
        const { assert!(OFF + 2 <= N) };
        // SAFETY: the two bytes lie inside the checked header.
        unsafe { ptr::read_unaligned(self.0.add(OFF).cast::<u16>()) }
    }

    #[inline(always)]
    pub fn set_u16<const OFF: usize>(self, v: u16) {
        const { assert!(OFF + 2 <= N) };
        // SAFETY: as in `u16`.
        unsafe { ptr::write_unaligned(self.0.add(OFF).cast::<u16>(), v) }
    }

    #[inline(always)]
    pub fn u32<const OFF: usize>(self) -> u32 {
        const { assert!(OFF + 4 <= N) };
        // SAFETY: the four bytes lie inside the checked header.
        unsafe { ptr::read_unaligned(self.0.add(OFF).cast::<u32>()) }
    }

    #[inline(always)]
    pub fn set_u32<const OFF: usize>(self, v: u32) {
        const { assert!(OFF + 4 <= N) };
        // SAFETY: as in `u32`.
        unsafe { ptr::write_unaligned(self.0.add(OFF).cast::<u32>(), v) }
    }

    /// Four 32-bit words (an IPv6 address) at `OFF`.
    #[inline(always)]
    pub fn words4<const OFF: usize>(self) -> [u32; 4] {
        const { assert!(OFF + 16 <= N) };
        // SAFETY: the sixteen bytes lie inside the checked header.
        unsafe {
            let p = self.0.add(OFF).cast::<u32>();
            [
                ptr::read_unaligned(p),
                ptr::read_unaligned(p.add(1)),
                ptr::read_unaligned(p.add(2)),
                ptr::read_unaligned(p.add(3)),
            ]
        }
    }

    #[inline(always)]
    pub fn set_words4<const OFF: usize>(self, v: &[u32; 4]) {
        const { assert!(OFF + 16 <= N) };
        // SAFETY: as in `words4`.
        unsafe {
            let p = self.0.add(OFF).cast::<u32>();
            ptr::write_unaligned(p, v[0]);
            ptr::write_unaligned(p.add(1), v[1]);
            ptr::write_unaligned(p.add(2), v[2]);
            ptr::write_unaligned(p.add(3), v[3]);
        }
    }

    /// Copies the 6-byte MAC address at `OFF` into `dst` ([`MacWords`]: no copy of the
    /// six bytes on the stack).
    #[inline(always)]
    pub fn copy_mac<const OFF: usize>(self, dst: &mut [u8; 6]) {
        const { assert!(OFF + 6 <= N) };
        // SAFETY: the six bytes lie inside the checked header.
        let mac = unsafe { MacWords::read(self.0.add(OFF)) };
        mac.write(dst);
    }

    /// A 6-byte MAC address at `OFF`.
    #[inline(always)]
    pub fn mac<const OFF: usize>(self) -> [u8; 6] {
        const { assert!(OFF + 6 <= N) };
        // Two scalar loads: a `[u8; 6]` copy compiles (LLVM 22) to a call of a byte-loop
        // `memmove` subprogram.
        // SAFETY: the six bytes lie inside the checked header.
        let (hi, lo) = unsafe {
            (
                ptr::read_unaligned(self.0.add(OFF).cast::<u32>()),
                ptr::read_unaligned(self.0.add(OFF + 4).cast::<u16>()),
            )
        };
        let (h, l) = (hi.to_ne_bytes(), lo.to_ne_bytes());
        [h[0], h[1], h[2], h[3], l[0], l[1]]
    }

    #[inline(always)]
    pub fn set_mac<const OFF: usize>(self, v: &[u8; 6]) {
        const { assert!(OFF + 6 <= N) };
        let hi = u32::from_ne_bytes([v[0], v[1], v[2], v[3]]);
        let lo = u16::from_ne_bytes([v[4], v[5]]);
        // Two scalar stores, as in `mac`. SAFETY: as in `mac`.
        unsafe {
            ptr::write_unaligned(self.0.add(OFF).cast::<u32>(), hi);
            ptr::write_unaligned(self.0.add(OFF + 4).cast::<u16>(), lo);
        }
    }
}

/// A MAC address as two scalars (its first four bytes and its last two, as they lie in
/// memory), so that reading, comparing and writing one takes two loads or stores and no
/// stack: a `[u8; 6]` copy compiles (LLVM 22) to a byte loop through the stack.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MacWords(u32, u16);

impl MacWords {
    /// The six bytes at `p`.
    ///
    /// # Safety
    /// `p` points to six readable bytes (any alignment).
    #[inline(always)]
    pub unsafe fn read(p: *const u8) -> Self {
        // SAFETY: the caller's six bytes, read unaligned.
        unsafe {
            MacWords(
                ptr::read_unaligned(p.cast::<u32>()),
                ptr::read_unaligned(p.add(4).cast::<u16>()),
            )
        }
    }

    /// The MAC held in `mac`.
    #[inline(always)]
    pub fn of(mac: &[u8; 6]) -> Self {
        // SAFETY: `mac` is six readable bytes.
        unsafe { Self::read(mac.as_ptr()) }
    }

    /// Writes it into `dst`.
    #[inline(always)]
    pub fn write(self, dst: &mut [u8; 6]) {
        let d = dst.as_mut_ptr();
        // SAFETY: `dst` is six writable bytes, written unaligned.
        unsafe {
            ptr::write_unaligned(d.cast::<u32>(), self.0);
            ptr::write_unaligned(d.add(4).cast::<u16>(), self.1);
        }
    }
}
