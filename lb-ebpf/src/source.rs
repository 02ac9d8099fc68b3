//! Per-source fairness for nat: a GCRA token bucket per (client address, service) in
//! `LB_SOURCES`, so that one client cannot take a backend's whole source-port range.

use lb_common::maps::{ServiceMeta, SourceBucket, SourceKey, source_admit};

use crate::maps::LB_SOURCES;

/// Whether the client `addr` (network order, as in flow keys: IPv4 uses word 0 and the
/// parser leaves the other words zero) may open one more
/// nat flow of `svc` at `now_ns`; charges the bucket if so. A service without a limit
/// (`source_interval_ns` 0) admits everything without a lookup.
///
/// Two CPUs charging the same source at once may both read the old time: one charge is
/// lost, so a source can exceed its budget by at most one flow per CPU and race.
#[inline(always)]
pub fn admit(addr: &[u32; 4], svc: &ServiceMeta, now_ns: u64) -> bool {
    let interval = svc.source_interval_ns;
    if interval == 0 {
        return true;
    }
    let key = SourceKey {
        // Word by word: a 16-byte copy would be a `memmove` call.
        addr: [addr[0], addr[1], addr[2], addr[3]],
        service_id: svc.service_id,
    };
    if let Some(b) = LB_SOURCES.get_ptr_mut(&key) {
        // SAFETY: an LRU value, freed only after an RCU grace period; a racing writer
        // costs one charge (see above).
        let b = unsafe { &mut *b };
        return match source_admit(b.tat_ns, now_ns, interval, svc.source_burst) {
            Some(tat) => {
                b.tat_ns = tat;
                true
            }
            None => false,
        };
    }
    // A source not seen lately (or evicted): a full bucket, charged once.
    let tat = source_admit(0, now_ns, interval, svc.source_burst).unwrap_or(now_ns);
    let _ = LB_SOURCES.insert(&key, &SourceBucket { tat_ns: tat }, 0);
    true
}
