//! One's-complement checksum helpers: folding and RFC 1624 incremental updates.
//!
//! All 16-bit words are taken exactly as loaded from packet memory with a native load
//! (the one's-complement sum is byte-order independent as long as every word is treated
//! the same way), so callers never swap bytes.

/// Folds a 64-bit running sum into 16 bits (end-around carry).
#[inline(always)]
pub const fn fold(mut sum: u64) -> u16 {
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// RFC 1624 eqn. 3: the checksum after one 16-bit word changed from `old` to `new`.
#[inline(always)]
pub const fn replace16(check: u16, old: u16, new: u16) -> u16 {
    let sum = (!check) as u64 + (!old) as u64 + new as u64;
    !fold(sum)
}

/// The checksum after a 32-bit field (two words) changed from `old` to `new`.
#[inline(always)]
pub const fn replace32(check: u16, old: u32, new: u32) -> u16 {
    let sum = (!check) as u64
        + ((!old) & 0xffff) as u64
        + ((!old) >> 16) as u64
        + (new & 0xffff) as u64
        + (new >> 16) as u64;
    !fold(sum)
}

/// The checksum after an address changed; `words` is 1 for IPv4 and 4 for IPv6.
#[inline(always)]
pub fn replace_addr(check: u16, old: &[u32; 4], new: &[u32; 4], words: usize) -> u16 {
    let mut c = check;
    let mut i = 0;
    while i < 4 {
        if i < words {
            c = replace32(c, old[i], new[i]);
        }
        i += 1;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain RFC 1071 checksum over big-endian words, for comparison.
    fn rfc1071(data: &[u8]) -> u16 {
        let mut sum: u64 = 0;
        for chunk in data.chunks(2) {
            let hi = chunk[0] as u64;
            let lo = *chunk.get(1).unwrap_or(&0) as u64;
            sum += (hi << 8) | lo;
        }
        !fold(sum)
    }

    fn word_at(data: &[u8], off: usize) -> u16 {
        u16::from_ne_bytes([data[off], data[off + 1]])
    }

    #[test]
    fn incremental_update_matches_full_recompute() {
        let mut hdr: [u8; 20] = [
            0x45, 0x00, 0x00, 0x3c, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x06, 0x00, 0x00, 0xac, 0x10,
            0x0a, 0x63, 0xac, 0x10, 0x0a, 0x0c,
        ];
        let c = rfc1071(&hdr).to_be_bytes();
        hdr[10..12].copy_from_slice(&c);
        assert_eq!(rfc1071(&hdr), 0, "a header with its checksum sums to zero");

        let old = u32::from_ne_bytes(hdr[16..20].try_into().unwrap());
        let new_bytes = [10u8, 0, 1, 42];
        let new = u32::from_ne_bytes(new_bytes);
        let updated = replace32(word_at(&hdr, 10), old, new);
        hdr[16..20].copy_from_slice(&new_bytes);
        hdr[10..12].copy_from_slice(&updated.to_ne_bytes());
        assert_eq!(
            rfc1071(&hdr),
            0,
            "incrementally updated checksum must verify"
        );

        let old16 = word_at(&hdr, 4);
        let updated = replace16(word_at(&hdr, 10), old16, 0xbeef);
        hdr[4..6].copy_from_slice(&0xbeefu16.to_ne_bytes());
        hdr[10..12].copy_from_slice(&updated.to_ne_bytes());
        assert_eq!(rfc1071(&hdr), 0);
    }

    #[test]
    fn fold_handles_many_carries() {
        assert_eq!(fold(0xffff_ffff_ffff_ffff), 0xffff);
        assert_eq!(fold(0x1_0000), 1);
    }
}
