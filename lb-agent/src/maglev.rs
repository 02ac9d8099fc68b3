//! Weighted Maglev lookup tables (Eisenbud et al., NSDI 2016): pure, deterministic, and
//! independent of the order in which backends are given.
//!
//! Each backend walks its own permutation of the slots, `offset + j·skip (mod size)`, with
//! `offset` and `skip` taken from two independent hashes of its stable `key`; on its turn
//! it claims the next slot of its permutation that is still free. Plain Maglev gives every
//! backend one turn per round. Here turns are handed out in proportion to weight, smoothly
//! interleaved: the backend whose next claim is least advanced relative to its weight
//! (smallest `(claims + ½) / weight`, the Sainte-Laguë/Webster divisor) goes next, ties
//! broken by `(key, id)`. Over `size` turns every backend ends with its weight share of the
//! slots to within one slot, and the table keeps Maglev's small disruption when a backend
//! joins or leaves. Cost: `size` heap operations over the distinct weights
//! (`O(size · log w)`, see [`Turns`]; none for equal weights) plus Maglev's probes of the
//! permutations, read from an occupancy bitset, until only `sqrt(size / 8)` slots are
//! free; each remaining claim is solved over the free slots instead of walked (`fill`).
//! The table is the same, slot for slot, as walking every claim ([`reference`], pinned by
//! the tests).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::net::SocketAddr;

use lb_common::NO_BACKEND;

mod fill;
pub mod reference;

/// One backend as the table builder sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MaglevBackend {
    /// Data-plane backend id written into the slots; never [`NO_BACKEND`] (0): such
    /// entries are skipped.
    pub id: u32,
    /// Stable identity that picks the permutation, e.g. [`stable_key`] of `addr:port`:
    /// the same key gets the same slots whatever else changes.
    pub key: u64,
    /// Relative share of the slots; 0 leaves the backend out.
    pub weight: u32,
}

/// Builds a `size`-slot table (a prime, normally [`lb_common::MAGLEV_RING_SIZE`]). Every
/// slot holds a backend id; with no backend of positive weight every slot is
/// [`NO_BACKEND`]. The result depends only on the set of backends, not their order.
///
/// A non-prime `size` still gives a full table (each skip is made coprime with `size`)
/// but weaker spreading; `size` 0 gives an empty table.
pub fn build_table(backends: &[MaglevBackend], size: u32) -> Vec<u32> {
    let mut table = vec![NO_BACKEND; size as usize];
    let live = live_in_rank_order(backends);
    if live.is_empty() || size == 0 {
        return table;
    }
    if live.iter().all(|b| b.weight == live[0].weight) {
        // One weight class: the turns go round the ranks in order (what [`Turns`] gives
        // for one class, without its heap).
        let mut turn = 0usize;
        fill::claim_all(&mut table, &live, || {
            let rank = turn % live.len();
            turn += 1;
            rank
        });
    } else {
        let mut turns = Turns::new(&live);
        fill::claim_all(&mut table, &live, || turns.next());
    }
    table
}

/// The backends that get slots (positive weight, a real id) in rank order: sorted by
/// `(key, id, weight)`, whatever order they came in.
fn live_in_rank_order(backends: &[MaglevBackend]) -> Vec<MaglevBackend> {
    let mut live: Vec<MaglevBackend> = backends
        .iter()
        .filter(|b| b.weight > 0 && b.id != NO_BACKEND)
        .copied()
        .collect();
    live.sort_unstable_by_key(|b| (b.key, b.id, b.weight));
    live
}

/// A stable 64-bit identity for a backend address: FNV-1a over the family tag (4 or 6),
/// the address bytes and the big-endian port, then the murmur3 finaliser. Deterministic
/// across runs, builds and platforms (no `RandomState`); IPv6 scope and flow label are
/// ignored.
pub fn stable_key(addr: &SocketAddr) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = FNV_OFFSET;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
    };
    match addr {
        SocketAddr::V4(a) => {
            feed(&[4]);
            feed(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            feed(&[6]);
            feed(&a.ip().octets());
        }
    }
    feed(&addr.port().to_be_bytes());
    fmix64(h)
}

/// The murmur3 64-bit finaliser: a bijection with full avalanche.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Seeds of the two permutation hashes (offset, skip); distinct so the two are independent.
const SEED_OFFSET: u64 = 0x9e37_79b9_7f4a_7c15;
const SEED_SKIP: u64 = 0xc2b2_ae3d_27d4_eb4f;

/// Where a backend is in its permutation of the slots.
struct Cursor {
    pos: u64,
    skip: u64,
}

impl Cursor {
    fn new(key: u64, m: u64) -> Self {
        let pos = fmix64(key ^ SEED_OFFSET) % m;
        let mut skip = if m > 1 {
            fmix64(key.rotate_left(32) ^ SEED_SKIP) % (m - 1) + 1
        } else {
            1
        };
        // Always true for a prime m; for other sizes step towards 1, which is coprime.
        while gcd(skip, m) != 1 {
            skip -= 1;
        }
        Cursor { pos, skip }
    }

    /// The current slot; advances to the next one of the permutation.
    fn next(&mut self, m: u64) -> usize {
        let slot = self.pos as usize;
        self.pos += self.skip;
        if self.pos >= m {
            self.pos -= m;
        }
        slot
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A backend waiting for its next claim; the heap pops the smallest
/// `(2·claims + 1) / weight`, then the smallest rank.
#[derive(PartialEq, Eq)]
struct Turn {
    claims: u64,
    weight: u32,
    /// Position in the `(key, id, weight)` order: a total, input-order-free tie-break.
    rank: usize,
}

impl Ord for Turn {
    fn cmp(&self, other: &Self) -> Ordering {
        let mine = u128::from(2 * self.claims + 1) * u128::from(other.weight);
        let theirs = u128::from(2 * other.claims + 1) * u128::from(self.weight);
        // BinaryHeap is a max-heap: the earliest turn must compare greatest.
        theirs.cmp(&mine).then_with(|| other.rank.cmp(&self.rank))
    }
}

impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Hands out the turns in the order of one [`Turn`] per backend in a heap, at the cost of
/// one heap entry per distinct weight. Backends of equal weight take their turns in rank
/// order, round after round (the one with fewer claims, then the lower rank, comes first),
/// so each weight class is a queue and only the classes' heads compete: the same order,
/// `O(log classes)` per turn instead of `O(log backends)` — constant for the usual
/// equal weights (10,000 backends: ~3× faster whole builds).
///
/// With few classes (at most [`SCAN_CLASSES`]) the heads are kept in a plain list and the
/// earliest found by a scan: fewer comparisons than a heap's pop and push at that size,
/// and the same order (ranks are distinct, so the earliest head is unique).
struct Turns {
    classes: Vec<WeightClass>,
    heads: BinaryHeap<ClassTurn>,
    /// The heads when there are at most [`SCAN_CLASSES`] classes (`heads` is then empty).
    scanned: Vec<ClassTurn>,
}

/// Up to this many distinct weights the class heads are scanned instead of heaped.
const SCAN_CLASSES: usize = 8;

/// The backends of one weight, in rank order; `next` is the head of the queue.
struct WeightClass {
    ranks: Vec<usize>,
    next: usize,
    /// Claims of every rank before `next` is `round + 1`, from `next` on `round`.
    round: u64,
}

/// A class's head as a heap entry: the head's [`Turn`] and its class.
#[derive(PartialEq, Eq)]
struct ClassTurn {
    turn: Turn,
    class: usize,
}

impl Ord for ClassTurn {
    fn cmp(&self, other: &Self) -> Ordering {
        // Ranks are distinct, so the turn alone orders the heads.
        self.turn.cmp(&other.turn)
    }
}

impl PartialOrd for ClassTurn {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Turns {
    /// `live` in rank order (sorted), every weight positive.
    fn new(live: &[MaglevBackend]) -> Self {
        Self::with_scan(live, true)
    }

    /// As [`Turns::new`]; `scan: false` keeps the heads in the heap however few they are
    /// (the reference builder's turns: [`reference`]).
    fn with_scan(live: &[MaglevBackend], scan: bool) -> Self {
        let mut by_weight: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (rank, b) in live.iter().enumerate() {
            by_weight.entry(b.weight).or_default().push(rank);
        }
        let scan = scan && by_weight.len() <= SCAN_CLASSES;
        let mut turns = Turns {
            classes: Vec::with_capacity(by_weight.len()),
            heads: BinaryHeap::new(),
            scanned: Vec::new(),
        };
        for (weight, ranks) in by_weight {
            let class = turns.classes.len();
            let head = ClassTurn {
                turn: Turn {
                    claims: 0,
                    weight,
                    rank: ranks[0],
                },
                class,
            };
            if scan {
                turns.scanned.push(head);
            } else {
                turns.heads.push(head);
            }
            turns.classes.push(WeightClass {
                ranks,
                next: 0,
                round: 0,
            });
        }
        turns
    }

    /// The rank of the backend whose turn it is; counts its claim.
    fn next(&mut self) -> usize {
        if !self.scanned.is_empty() {
            let mut earliest = 0;
            for i in 1..self.scanned.len() {
                // The heap's order: the earliest turn compares greatest.
                if self.scanned[i] > self.scanned[earliest] {
                    earliest = i;
                }
            }
            let (classes, head) = (&mut self.classes, &mut self.scanned[earliest]);
            return Self::advance(classes, head);
        }
        let mut head = self.heads.pop().expect("at least one live backend");
        let rank = Self::advance(&mut self.classes, &mut head);
        self.heads.push(head);
        rank
    }

    /// Counts `head`'s claim and makes it its class's next backend; the rank it had.
    fn advance(classes: &mut [WeightClass], head: &mut ClassTurn) -> usize {
        let rank = head.turn.rank;
        let class = &mut classes[head.class];
        class.next += 1;
        if class.next == class.ranks.len() {
            class.next = 0;
            class.round += 1;
        }
        head.turn.claims = class.round;
        head.turn.rank = class.ranks[class.next];
        rank
    }
}

/// Seed of the failover walk (independent of the permutation hashes).
const SEED_FAILOVER: u64 = 0x2545_f491_4f6c_dd1d;

/// The home slots the failover walk of `slot` visits after the slot itself, in order
/// (steps 1, 2, … of the walk; step 0 is `slot`): `4 * size` of them, after which
/// [`failover_table`] falls back to the first active owner in table order. Depends only
/// on `slot` and `size`, so the walk of a slot can be resumed or replayed
/// (`publish/failover.rs` keeps the live table up to date slot by slot with it).
pub fn failover_walk(slot: usize, size: usize) -> impl Iterator<Item = usize> {
    let mut h = fmix64(slot as u64 ^ SEED_FAILOVER);
    (0..4 * size).map(move |_| {
        let at = (h % size as u64) as usize;
        h = fmix64(h.wrapping_add(SEED_FAILOVER));
        at
    })
}

/// The live table from a home table and the set of backends that may take new flows.
///
/// `home` is [`build_table`] over every configured backend of the service (healthy or
/// not). A slot whose home owner is active keeps it; any other slot visits home slots in
/// a pseudo-random order derived from its index and takes the first active owner found.
/// Consequences:
/// - a backend leaving moves exactly the slots it holds (1/N of the table for one of N
///   equal backends, when no other is down) — fewer than a full Maglev rebuild moves; a
///   backend returning takes back its home slots and, while others are down, the slots
///   of theirs whose walk meets one of its home slots before their current owner;
/// - a failed backend's slots spread over the active ones in proportion to their home
///   shares, i.e. their weights;
/// - the result depends only on `home` and the active set, not on history;
/// - one pass over the table, `O(size / active share)`: about 0.1 ms for 65537 slots,
///   so a verdict reaches the data plane well within a millisecond. (A full weighted
///   Maglev build takes milliseconds at 100 backends; it runs only when the configured
///   set or a weight changes.)
///
/// `active(id)` says whether a backend may take new flows. With no active backend
/// every slot is [`NO_BACKEND`].
pub fn failover_table(home: &[u32], active: impl Fn(u32) -> bool) -> Vec<u32> {
    let size = home.len();
    let mut out = vec![NO_BACKEND; size];
    if !home.iter().any(|&id| id != NO_BACKEND && active(id)) {
        return out;
    }
    for (slot, out_slot) in out.iter_mut().enumerate() {
        let home_id = home[slot];
        if home_id != NO_BACKEND && active(home_id) {
            *out_slot = home_id;
            continue;
        }
        // A walk over pseudo-random slots, independent of how the home table was
        // filled, so the failed slots spread in proportion to the active shares.
        for at in failover_walk(slot, size) {
            let id = home[at];
            if id != NO_BACKEND && active(id) {
                *out_slot = id;
                break;
            }
        }
        if *out_slot == NO_BACKEND {
            // Astronomically unlikely: fall back to the first active slot in order.
            *out_slot = home
                .iter()
                .copied()
                .find(|&id| id != NO_BACKEND && active(id))
                .unwrap_or(NO_BACKEND);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn failover_moves_only_the_failed_backends_slots() {
        let backends: Vec<MaglevBackend> = (1..=10)
            .map(|id| MaglevBackend {
                id,
                key: u64::from(id) * 7_777,
                weight: 1,
            })
            .collect();
        let home = build_table(&backends, 65537);
        let all = failover_table(&home, |_| true);
        assert_eq!(
            all, home,
            "with everyone active the live table is the home table"
        );
        let without3 = failover_table(&home, |id| id != 3);
        let moved = all.iter().zip(&without3).filter(|(a, b)| a != b).count();
        let owned3 = home.iter().filter(|&&id| id == 3).count();
        assert_eq!(moved, owned3, "only backend 3's slots may move");
        assert!(!without3.contains(&3));
        for id in (1..=10).filter(|&id| id != 3) {
            let share = without3.iter().filter(|&&s| s == id).count() as f64 / 65537.0;
            assert!(
                (share - 1.0 / 9.0).abs() < 0.01,
                "backend {id} holds {share:.4} of the slots, expected 1/9 within 1%"
            );
        }
        let none = failover_table(&home, |_| false);
        assert!(none.iter().all(|&s| s == NO_BACKEND));
    }

    #[test]
    fn failover_keeps_weight_proportions() {
        let backends = [
            MaglevBackend {
                id: 1,
                key: 11,
                weight: 1,
            },
            MaglevBackend {
                id: 2,
                key: 22,
                weight: 1,
            },
            MaglevBackend {
                id: 3,
                key: 33,
                weight: 2,
            },
            MaglevBackend {
                id: 4,
                key: 44,
                weight: 4,
            },
        ];
        let home = build_table(&backends, 65537);
        let live = failover_table(&home, |id| id != 4);
        let share = |id| live.iter().filter(|&&s| s == id).count() as f64 / 65537.0;
        assert!(
            (share(1) - 0.25).abs() < 0.01,
            "weight 1 of 4 left: {}",
            share(1)
        );
        assert!(
            (share(3) - 0.5).abs() < 0.01,
            "weight 2 of 4 left: {}",
            share(3)
        );
    }

    use super::*;

    #[test]
    fn skips_are_coprime_with_any_size() {
        for m in [1u64, 2, 12, 1000, 65536, 65537] {
            for key in 0..200u64 {
                let c = Cursor::new(key, m);
                assert_eq!(gcd(c.skip, m), 1, "m={m} key={key} skip={}", c.skip);
                assert!(c.pos < m && c.skip >= 1 && (m == 1 || c.skip < m));
            }
        }
    }

    /// The turn order as first written: one heap entry per backend. [`Turns`] must give
    /// exactly this order (tables must not shift flows across an agent upgrade).
    fn turn_order_one_heap_entry_per_backend(live: &[MaglevBackend], turns: usize) -> Vec<usize> {
        let mut heap: BinaryHeap<Turn> = live
            .iter()
            .enumerate()
            .map(|(rank, b)| Turn {
                claims: 0,
                weight: b.weight,
                rank,
            })
            .collect();
        (0..turns)
            .map(|_| {
                let mut t = heap.pop().unwrap();
                t.claims += 1;
                let rank = t.rank;
                heap.push(t);
                rank
            })
            .collect()
    }

    #[test]
    fn weight_classes_give_the_same_turns_as_one_heap_entry_per_backend() {
        // xorshift64*: deterministic inputs with few and many distinct weights.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for case in 0..60 {
            let n = 1 + (next() % 300) as usize;
            let distinct = [1, 2, 3, 7, 50, 1000][case % 6];
            let live: Vec<MaglevBackend> = (0..n)
                .map(|i| MaglevBackend {
                    id: i as u32 + 1,
                    key: next(),
                    weight: 1 + (next() % distinct) as u32,
                })
                .collect();
            let turns = 3 * n + (next() % 5000) as usize;
            let mut classes = Turns::new(&live);
            let got: Vec<usize> = (0..turns).map(|_| classes.next()).collect();
            assert_eq!(
                got,
                turn_order_one_heap_entry_per_backend(&live, turns),
                "case {case}: {n} backends, up to {distinct} distinct weights"
            );
        }
    }

    #[test]
    fn tables_are_those_of_one_heap_entry_per_backend() {
        let size = 65537u32;
        for distinct in [1u64, 4] {
            let backends: Vec<MaglevBackend> = (1..=2000u32)
                .map(|id| MaglevBackend {
                    id,
                    key: fmix64(u64::from(id)),
                    weight: 1 + (fmix64(u64::from(id) ^ 77) % distinct) as u32,
                })
                .collect();
            let mut live = backends.clone();
            live.sort_unstable_by_key(|b| (b.key, b.id, b.weight));
            let mut cursors: Vec<Cursor> = live
                .iter()
                .map(|b| Cursor::new(b.key, u64::from(size)))
                .collect();
            let mut expected = vec![NO_BACKEND; size as usize];
            for rank in turn_order_one_heap_entry_per_backend(&live, size as usize) {
                loop {
                    let slot = cursors[rank].next(u64::from(size));
                    if expected[slot] == NO_BACKEND {
                        expected[slot] = live[rank].id;
                        break;
                    }
                }
            }
            assert!(
                build_table(&backends, size) == expected,
                "{distinct} distinct weights: the table changed"
            );
        }
    }

    #[test]
    fn the_fast_build_equals_the_reference_one() {
        // xorshift64*: random backend sets, weights (one class, few, many), ids with
        // gaps, zero weights and NO_BACKEND ids, over every table size and a few odd
        // ones (non-prime, tiny, fewer slots than backends).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let sizes = [1u32, 2, 7, 12, 64, 1000, 4099, 16411, 65537, 262147];
        for case in 0..80 {
            let size = sizes[case % sizes.len()];
            let n = 1 + (next() % [3, 40, 400, 3000][case % 4]) as usize;
            let distinct = [1u64, 1, 2, 5, 100][case % 5];
            let backends: Vec<MaglevBackend> = (0..n)
                .map(|_| MaglevBackend {
                    id: (next() % 20_000) as u32,
                    key: next(),
                    weight: (next() % (distinct + 1)) as u32 + u32::from(distinct == 1),
                })
                .collect();
            assert!(
                build_table(&backends, size) == reference::build_table(&backends, size),
                "case {case}: {n} backends, {distinct} distinct weights, {size} slots"
            );
        }
    }

    #[test]
    fn turns_pop_in_weight_proportion() {
        let mut heap: BinaryHeap<Turn> = [(1, 0), (3, 1)]
            .into_iter()
            .map(|(weight, rank)| Turn {
                claims: 0,
                weight,
                rank,
            })
            .collect();
        let mut order = Vec::new();
        for _ in 0..8 {
            let mut t = heap.pop().unwrap();
            order.push(t.rank);
            t.claims += 1;
            heap.push(t);
        }
        assert_eq!(
            order.iter().filter(|&&r| r == 1).count(),
            6,
            "weight 3 of 4 gets 6 of 8 turns: {order:?}"
        );
    }
}
