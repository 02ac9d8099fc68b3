//! A Maglev table's fingerprint: FNV-1a over the stable key of the backend address in
//! every slot. Backend ids are per node (they depend on the order servers were added), so
//! slots are hashed by address: two nodes with equal fingerprints send every flow hash to
//! the same backend.

use std::net::SocketAddr;

use crate::maglev::stable_key;

/// Fingerprint of `table` (slot → backend id), `addr_of(id)` giving each id's address
/// (`None` for an empty slot). Shown as 16 hex digits.
pub fn fingerprint(table: &[u32], addr_of: impl Fn(u32) -> Option<SocketAddr>) -> String {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = FNV_OFFSET;
    let mut keys = KeyMemo::default();
    for &id in table {
        let key = keys.get(id, &addr_of);
        for b in key.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
    }
    format!("{h:016x}")
}

/// Each id's key, looked up once per fingerprint: a table holds about 100 slots per
/// backend in no particular order, and `addr_of` is a map lookup.
#[derive(Default)]
struct KeyMemo {
    /// By id, for ids below [`KeyMemo::DENSE`] (ids are small and dense).
    dense: Vec<Option<u64>>,
}

impl KeyMemo {
    const DENSE: u32 = 1 << 22;

    fn get(&mut self, id: u32, addr_of: &impl Fn(u32) -> Option<SocketAddr>) -> u64 {
        let lookup = || addr_of(id).map_or(0, |a| stable_key(&a));
        if id >= Self::DENSE {
            return lookup(); // an empty slot's marker
        }
        let i = id as usize;
        if i >= self.dense.len() {
            self.dense.resize(i + 1, None);
        }
        *self.dense[i].get_or_insert_with(lookup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fingerprint as first written: a lookup per slot (but for runs of one id).
    fn per_slot(table: &[u32], addr_of: impl Fn(u32) -> Option<SocketAddr>) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &id in table {
            let k = addr_of(id).map_or(0, |a| stable_key(&a));
            for b in k.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        format!("{h:016x}")
    }

    #[test]
    fn looking_each_id_up_once_gives_the_per_slot_fingerprint() {
        let addr = |id: u32| -> Option<SocketAddr> {
            (id != u32::MAX && id % 5 != 4)
                .then(|| format!("10.0.0.{}:80", id % 250).parse().unwrap())
        };
        let table: Vec<u32> = (0..5000u32)
            .map(|i| match i % 13 {
                0 => u32::MAX,
                _ => i.wrapping_mul(2_654_435_761) % 97,
            })
            .collect();
        assert_eq!(fingerprint(&table, addr), per_slot(&table, addr));
        assert_eq!(fingerprint(&[], addr), per_slot(&[], addr));
    }
}
