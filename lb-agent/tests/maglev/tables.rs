//! Weighted Maglev tables: balance, disruption, order independence, edge cases.

use std::collections::HashMap;
use std::net::SocketAddr;

use lb_agent::maglev::{MaglevBackend, build_table, stable_key};
use lb_common::{MAGLEV_RING_SIZE, NO_BACKEND};

const M: u32 = MAGLEV_RING_SIZE;

/// Backend `i` (id `i`, 1-based) at 10.0.1.i:8080 with `weight`.
fn backend(i: u32, weight: u32) -> MaglevBackend {
    let addr: SocketAddr = format!("10.0.{}.{}:8080", i / 250, i % 250 + 1)
        .parse()
        .unwrap();
    MaglevBackend {
        id: i,
        key: stable_key(&addr),
        weight,
    }
}

fn backends(weights: &[u32]) -> Vec<MaglevBackend> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| backend(i as u32 + 1, w))
        .collect()
}

fn counts(table: &[u32]) -> HashMap<u32, usize> {
    let mut c = HashMap::new();
    for &id in table {
        *c.entry(id).or_default() += 1;
    }
    c
}

/// Asserts each backend's share of the slots is within 1% (relative) of its weight share,
/// or within one slot for shares under 100 slots.
#[track_caller]
fn assert_balanced(bs: &[MaglevBackend]) {
    let table = build_table(bs, M);
    assert_eq!(table.len(), M as usize);
    let c = counts(&table);
    let total: u64 = bs.iter().map(|b| u64::from(b.weight)).sum();
    for b in bs {
        let want = f64::from(M) * b.weight as f64 / total as f64;
        let got = c.get(&b.id).copied().unwrap_or(0) as f64;
        assert!(
            (got - want).abs() <= (want * 0.01).max(1.0),
            "backend {} (weight {}): expected {want:.1} slots (±1%), got {got}",
            b.id,
            b.weight
        );
    }
    assert_eq!(c.get(&NO_BACKEND), None, "every slot holds a backend");
}

fn moved(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

#[test]
fn empty_input_gives_no_backend_everywhere() {
    let t = build_table(&[], M);
    assert_eq!(t.len(), M as usize);
    assert!(t.iter().all(|&id| id == NO_BACKEND));
}

#[test]
fn all_zero_weights_give_no_backend_everywhere() {
    let t = build_table(&backends(&[0, 0, 0]), M);
    assert!(t.iter().all(|&id| id == NO_BACKEND));
}

#[test]
fn one_backend_takes_every_slot() {
    let t = build_table(&[backend(7, 3)], M);
    assert!(t.iter().all(|&id| id == 7));
}

#[test]
fn zero_weight_backends_are_left_out() {
    let t = build_table(&backends(&[1, 0, 2, 0]), M);
    let c = counts(&t);
    assert_eq!(c.get(&2), None, "weight 0 gets no slot");
    assert_eq!(c.get(&4), None, "weight 0 gets no slot");
    assert_eq!(c[&1] + c[&3], M as usize);
    // Same table as if the zero-weight backends were not there at all.
    assert_eq!(t, build_table(&[backend(1, 1), backend(3, 2)], M));
}

#[test]
fn id_zero_is_never_written() {
    let mut bs = backends(&[1, 1]);
    bs.push(MaglevBackend {
        id: NO_BACKEND,
        key: 42,
        weight: 5,
    });
    let t = build_table(&bs, M);
    assert!(t.iter().all(|&id| id == 1 || id == 2));
}

#[test]
fn equal_weights_balance() {
    for n in [2, 3, 5, 10, 50, 100] {
        assert_balanced(&backends(&vec![1; n]));
    }
}

#[test]
fn weights_1_1_2_balance() {
    assert_balanced(&backends(&[1, 1, 2]));
    let c = counts(&build_table(&backends(&[1, 1, 2]), M));
    assert!(
        c[&3].abs_diff(c[&1] * 2) <= 2,
        "weight 2 gets twice weight 1's slots: {c:?}"
    );
}

#[test]
fn ten_mixed_weights_balance() {
    assert_balanced(&backends(&[1, 2, 3, 5, 8, 13, 1, 4, 10, 100]));
}

#[test]
fn extreme_weights_balance() {
    assert_balanced(&backends(&[10_000, 1, 1, 1]));
    let mut w = vec![1; 99];
    w.push(1000);
    assert_balanced(&backends(&w));
}

#[test]
fn one_backend_leaving_moves_few_slots() {
    for n in [5u32, 10, 50] {
        let all = backends(&vec![1; n as usize]);
        let before = build_table(&all, M);
        let limit = (1.0 / f64::from(n) + 0.01) * f64::from(M);
        for gone in 0..n as usize {
            let rest: Vec<_> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != gone)
                .map(|(_, b)| *b)
                .collect();
            let after = build_table(&rest, M);
            let m = moved(&before, &after);
            assert!(
                (m as f64) < limit,
                "n={n}, backend {} left: {m} slots moved, limit {limit:.0} (1/N + 1%)",
                gone + 1
            );
            // Slots of the backends that stayed mostly stay put; all of the leaver's move.
            assert!(after.iter().all(|&id| id != all[gone].id));
        }
    }
}

#[test]
fn one_backend_joining_moves_few_slots() {
    for n in [5u32, 10, 50] {
        let before = build_table(&backends(&vec![1; n as usize]), M);
        let after = build_table(&backends(&vec![1; n as usize + 1]), M);
        let limit = (1.0 / f64::from(n + 1) + 0.01) * f64::from(M);
        let m = moved(&before, &after);
        assert!(
            (m as f64) < limit,
            "n={n} → {}: {m} slots moved, limit {limit:.0}",
            n + 1
        );
    }
}

#[test]
fn weighted_backend_leaving_moves_about_its_share() {
    let weights = [1, 2, 3, 5, 8, 13, 1, 4, 10, 3];
    let all = backends(&weights);
    let total: u32 = weights.iter().sum();
    let before = build_table(&all, M);
    for (gone, &weight) in weights.iter().enumerate() {
        let rest: Vec<_> = all
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != gone)
            .map(|(_, b)| *b)
            .collect();
        let m = moved(&before, &build_table(&rest, M));
        let limit = (f64::from(weight) / f64::from(total) + 0.01) * f64::from(M);
        assert!(
            (m as f64) < limit,
            "weight {weight} left: {m} slots moved, limit {limit:.0}"
        );
    }
}

#[test]
fn weight_change_moves_about_the_difference() {
    let mut bs = backends(&[1; 10]);
    let before = build_table(&bs, M);
    bs[3].weight = 2;
    let m = moved(&before, &build_table(&bs, M));
    // Backend 4 goes from 1/10 to 2/11 of the slots: ~8.2% must move; allow Maglev's churn.
    let limit = (2.0 / 11.0 - 1.0 / 10.0 + 0.02) * f64::from(M);
    assert!((m as f64) < limit, "{m} slots moved, limit {limit:.0}");
}

#[test]
fn order_of_backends_does_not_matter() {
    let bs = backends(&[1, 2, 3, 5, 8, 13, 1, 4, 10, 100]);
    let t = build_table(&bs, M);
    let mut rev = bs.clone();
    rev.reverse();
    assert_eq!(t, build_table(&rev, M));
    let mut rot = bs.clone();
    rot.rotate_left(3);
    assert_eq!(t, build_table(&rot, M));
    let mut swapped = bs.clone();
    swapped.swap(0, 9);
    swapped.swap(2, 5);
    assert_eq!(t, build_table(&swapped, M));
}

#[test]
fn deterministic_across_runs_and_platforms() {
    // Fixed values: a change here reshuffles every service's flows on upgrade.
    let addr: SocketAddr = "10.0.1.11:8080".parse().unwrap();
    assert_eq!(stable_key(&addr), stable_key(&addr));
    assert_eq!(stable_key(&addr), 0x72c6_715e_f729_250b);
    let v6: SocketAddr = "[fd00::11]:8080".parse().unwrap();
    assert_eq!(stable_key(&v6), 0x542d_2a76_99ed_5c30);
    assert_ne!(
        stable_key(&addr),
        stable_key(&"10.0.1.11:8081".parse().unwrap())
    );
    let t = build_table(&backends(&[1, 2, 3]), 13);
    assert_eq!(t, vec![2, 2, 3, 1, 1, 3, 3, 3, 3, 3, 3, 2, 2]);
    assert_eq!(
        build_table(&backends(&[1, 2, 3]), M),
        build_table(&backends(&[1, 2, 3]), M)
    );
}

#[test]
fn small_and_non_prime_sizes_fill_every_slot() {
    assert!(build_table(&backends(&[1, 1]), 0).is_empty());
    assert_eq!(build_table(&backends(&[1, 1]), 1).len(), 1);
    for size in [2u32, 12, 1000, 65536] {
        let t = build_table(&backends(&[1, 2, 3, 4]), size);
        assert_eq!(t.len(), size as usize);
        assert!(t.iter().all(|&id| (1..=4).contains(&id)), "size {size}");
    }
}
