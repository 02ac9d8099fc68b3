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
    let mut last: Option<(u32, u64)> = None;
    for &id in table {
        // Runs of one id are common; skip the lookup for them.
        let key = match last {
            Some((l, k)) if l == id => k,
            _ => {
                let k = addr_of(id).map_or(0, |a| stable_key(&a));
                last = Some((id, k));
                k
            }
        };
        for b in key.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
    }
    format!("{h:016x}")
}
