//! Which spares run: the fewest usable spares covering the primary group's missing weight.

use std::{cmp::Reverse, collections::BTreeSet, net::SocketAddr};

/// Chooses the running spares among `candidates` (usable spares of weight > 0, as
/// `(address, weight)`), given those running before and the missing weight `deficit`.
///
/// Preference order: larger weight first, then lower address. Previously running spares
/// stay while needed; the most preferred idle spare joins while the running ones fall
/// short; then the least preferred running spares retire while the rest still cover the
/// deficit. A result with more spares than the fewest possible is replaced by the most
/// preferred prefix.
pub(super) fn select(
    candidates: &[(SocketAddr, u32)],
    running_before: &BTreeSet<SocketAddr>,
    deficit: u32,
) -> BTreeSet<SocketAddr> {
    if deficit == 0 {
        return BTreeSet::new();
    }
    let by_pref = by_preference(candidates);
    let total = |set: &BTreeSet<SocketAddr>| -> u64 {
        by_pref
            .iter()
            .filter(|(k, _)| set.contains(k))
            .map(|&(_, w)| u64::from(w))
            .sum()
    };
    let need = u64::from(deficit);

    let mut running: BTreeSet<SocketAddr> = by_pref
        .iter()
        .map(|&(k, _)| k)
        .filter(|k| running_before.contains(k))
        .collect();
    let mut sum = total(&running);
    for &(k, w) in &by_pref {
        if sum >= need {
            break;
        }
        if running.insert(k) {
            sum += u64::from(w);
        }
    }
    for &(k, w) in by_pref.iter().rev() {
        if running.contains(&k) && sum - u64::from(w) >= need {
            running.remove(&k);
            sum -= u64::from(w);
        }
    }

    let mut fewest = 0;
    let mut prefix = 0u64;
    for &(_, w) in &by_pref {
        if prefix >= need {
            break;
        }
        prefix += u64::from(w);
        fewest += 1;
    }
    if running.len() > fewest {
        running = by_pref.iter().take(fewest).map(|&(k, _)| k).collect();
    }
    running
}

/// `candidates` sorted most preferred first: larger weight, then lower address.
pub(super) fn by_preference(candidates: &[(SocketAddr, u32)]) -> Vec<(SocketAddr, u32)> {
    let mut v = candidates.to_vec();
    v.sort_by_key(|&(k, w)| (Reverse(w), k));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 1, last], 80))
    }

    fn set(keys: &[SocketAddr]) -> BTreeSet<SocketAddr> {
        keys.iter().copied().collect()
    }

    #[test]
    fn no_deficit_runs_nothing() {
        assert!(select(&[(a(1), 5)], &set(&[a(1)]), 0).is_empty());
    }

    #[test]
    fn insufficient_spares_all_run() {
        let got = select(&[(a(1), 1), (a(2), 1)], &BTreeSet::new(), 5);
        assert_eq!(
            got,
            set(&[a(1), a(2)]),
            "every usable spare must run when short"
        );
    }

    #[test]
    fn running_spare_that_still_covers_stays_over_a_larger_one() {
        // a(2) ran while a(1) was unusable; both cover alone: no churn.
        let got = select(&[(a(1), 5), (a(2), 3)], &set(&[a(2)]), 2);
        assert_eq!(
            got,
            set(&[a(2)]),
            "a running spare that still covers must stay"
        );
    }

    #[test]
    fn larger_spare_replaces_several_small_ones() {
        // Three weight-1 spares ran while the weight-3 one was unusable.
        let got = select(
            &[(a(1), 1), (a(2), 1), (a(3), 1), (a(4), 3)],
            &set(&[a(1), a(2), a(3)]),
            3,
        );
        assert_eq!(got, set(&[a(4)]), "the fewest spares must run");
    }
}
