//! The flow hash (Maglev slot choice, NAT source-port choice) and the VIP index hash
//! (murmur3-style mixing).

use crate::keys::{FlowKey, VipKey};

/// Seed for the Maglev slot hash.
pub const SEED_MAGLEV: u32 = 0x9747_b28c;
/// Seed for the NAT source-port hash (independent of the slot hash).
pub const SEED_NAT_PORT: u32 = 0x5bd1_e995;

#[inline(always)]
const fn mix(h: u32, k: u32) -> u32 {
    let k = k
        .wrapping_mul(0xcc9e_2d51)
        .rotate_left(15)
        .wrapping_mul(0x1b87_3593);
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

#[inline(always)]
const fn finish(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// Hash of a 5-tuple with `seed`.
#[inline(always)]
pub fn flow_hash(key: &FlowKey, seed: u32) -> u32 {
    let mut h = seed;
    let mut i = 0;
    while i < 4 {
        h = mix(h, key.src[i]);
        h = mix(h, key.dst[i]);
        i += 1;
    }
    h = mix(h, ((key.sport as u32) << 16) | key.dport as u32);
    h = mix(h, ((key.proto as u32) << 8) | key.family as u32);
    finish(h)
}

/// Hash of a 5-tuple for the array tables (`crate::table`: bucket and tag): as
/// [`flow_hash`], but an IPv4 key mixes only address word 0 of each side (words 1..3
/// are zero): 4 murmur rounds instead of 10, the same shortening as [`vip_hash`].
#[inline(always)]
pub fn table_hash(key: &FlowKey, seed: u32) -> u32 {
    let mut h = mix(seed, key.src[0]);
    h = mix(h, key.dst[0]);
    if key.family != crate::FAMILY_V4 {
        let mut i = 1;
        while i < 4 {
            h = mix(h, key.src[i]);
            h = mix(h, key.dst[i]);
            i += 1;
        }
    }
    h = mix(h, ((key.sport as u32) << 16) | key.dport as u32);
    h = mix(h, ((key.proto as u32) << 8) | key.family as u32);
    finish(h)
}

/// Slot of `key` in a CPU's flow cache: a multiplicative hash of the key's words
/// folded together (cheap; the cache compares the whole key, so a collision costs a
/// miss, never a wrong answer).
#[inline(always)]
pub fn flow_cache_slot(key: &FlowKey) -> u32 {
    let src = key.src[0] ^ key.src[1] ^ key.src[2] ^ key.src[3];
    let dst = key.dst[0] ^ key.dst[1] ^ key.dst[2] ^ key.dst[3];
    let ports = ((key.sport as u32) << 16) | key.dport as u32;
    let h = (src ^ dst.rotate_left(16) ^ ports ^ key.proto as u32).wrapping_mul(0x9e37_79b1);
    (h >> 16) & (crate::FLOW_CACHE_SLOTS - 1)
}

/// Hash of a VIP key with the `LB_VIP_INDEX` table's seed.
///
/// An IPv4 key mixes only its address word: the other three are always zero, so
/// mixing them would add three dependent rounds to every packet's VIP lookup and no
/// information.
#[inline(always)]
pub fn vip_hash(key: &VipKey, seed: u32) -> u32 {
    let mut h = mix(seed, key.addr[0]);
    if key.family != crate::FAMILY_V4 {
        h = mix(h, key.addr[1]);
        h = mix(h, key.addr[2]);
        h = mix(h, key.addr[3]);
    }
    h = mix(
        h,
        ((key.port as u32) << 16) | ((key.proto as u32) << 8) | key.family as u32,
    );
    finish(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_spreads_source_ports_evenly() {
        let mut buckets = [0u32; 16];
        for port in 0..16_000u16 {
            let key = FlowKey {
                src: [0x0a00_0001, 0, 0, 0],
                dst: [0x0a00_0064, 0, 0, 0],
                sport: port.to_be(),
                dport: 80u16.to_be(),
                proto: crate::IPPROTO_TCP,
                family: crate::FAMILY_V4,
                _pad: [0; 2],
            };
            buckets[(flow_hash(&key, SEED_MAGLEV) % 16) as usize] += 1;
        }
        for b in buckets {
            assert!(
                (900..1100).contains(&b),
                "bucket share {b} of 1000 expected"
            );
        }
    }

    fn vip(addr: [u32; 4], family: u8) -> VipKey {
        VipKey {
            addr,
            port: 443u16.to_be(),
            proto: crate::IPPROTO_TCP,
            family,
        }
    }

    /// The IPv4 short form still depends on the address and the seed, and an IPv6 key
    /// still mixes every address word.
    #[test]
    fn vip_hash_mixes_what_distinguishes_keys() {
        let v4 = vip([0x0a00_0064, 0, 0, 0], crate::FAMILY_V4);
        assert_ne!(vip_hash(&v4, 1), vip_hash(&v4, 2));
        assert_ne!(
            vip_hash(&v4, 1),
            vip_hash(&vip([0x0a00_0065, 0, 0, 0], crate::FAMILY_V4), 1)
        );
        let v6 = vip([0x2001_0db8, 0, 0, 1], crate::FAMILY_V6);
        for word in 1..4 {
            let mut other = v6;
            other.addr[word] ^= 0x100;
            assert_ne!(vip_hash(&v6, 7), vip_hash(&other, 7), "word {word}");
        }
        // The family is part of the key: the same words as IPv4 and IPv6 differ.
        assert_ne!(
            vip_hash(&v4, 1),
            vip_hash(&vip(v4.addr, crate::FAMILY_V6), 1)
        );
    }
}
