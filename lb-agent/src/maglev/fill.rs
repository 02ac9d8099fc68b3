//! The slot-claiming loop of [`super::build_table`]: exactly the claims of walking each
//! backend's permutation over the table until a free slot, made cheaper twice over —
//! occupancy is read from a bitset (32 KiB for 262,147 slots, where the table is 1 MiB)
//! and, once only a few slots are free, a claim solves for the free slot that comes first
//! in the backend's permutation instead of walking there (the walk costs `size / free`
//! probes per claim, so the last few hundred claims would be half of all probes).

use super::{Cursor, MaglevBackend};

/// A backend's permutation of the slots in 32-bit words: the next slot and the step.
#[derive(Clone, Copy)]
struct Walk {
    pos: u32,
    skip: u32,
}

impl Walk {
    fn new(key: u64, size: u32) -> Self {
        let c = Cursor::new(key, u64::from(size));
        // Both are below `size`, a u32.
        Walk {
            pos: c.pos as u32,
            skip: c.skip as u32,
        }
    }

    /// `pos + skip (mod size)` without a division (both are below `size`).
    fn step(pos: u32, skip: u32, size: u32) -> u32 {
        let (next, carry) = pos.overflowing_add(skip);
        if carry || next >= size {
            next.wrapping_sub(size)
        } else {
            next
        }
    }
}

/// Free slots at or below which claims are solved instead of walked. A solved claim costs
/// one modular product per free slot, a walked one about `size / free` probes of the
/// bitset; taking a product (with its division) as about eight probes, the two meet near
/// `sqrt(size / 8)` free slots (181 of 262,147). An estimate, not tuned: the output is
/// the same whatever the switch, only the time moves.
fn tail_at(size: u32) -> u32 {
    (size / 8).isqrt()
}

/// Fills every slot of `table` (all [`lb_common::NO_BACKEND`] on entry, `table.len()`
/// the size, at most `u32::MAX`): `size` claims, the `t`-th by the backend of rank
/// `next_rank()` (an index into `live`), each taking the first free slot of that
/// backend's permutation from where its last claim left it.
pub(super) fn claim_all(
    table: &mut [u32],
    live: &[MaglevBackend],
    mut next_rank: impl FnMut() -> usize,
) {
    let size = u32::try_from(table.len()).expect("a Maglev size is a u32");
    let mut walks: Vec<Walk> = live.iter().map(|b| Walk::new(b.key, size)).collect();
    let mut taken = vec![0u64; table.len().div_ceil(64)];
    let tail = tail_at(size);
    let mut free = size;
    while free > tail {
        let rank = next_rank();
        let Walk { mut pos, skip } = walks[rank];
        // The permutation visits every slot (skip is coprime with size) and a free one
        // exists, so this ends within `size` steps.
        loop {
            let (word, bit) = ((pos / 64) as usize, 1u64 << (pos % 64));
            let slot = pos as usize;
            pos = Walk::step(pos, skip, size);
            if taken[word] & bit == 0 {
                taken[word] |= bit;
                table[slot] = live[rank].id;
                break;
            }
        }
        walks[rank].pos = pos;
        free -= 1;
    }
    if free == 0 {
        return;
    }

    // The tail: the free slots in a list; a backend's claim is the free slot `e` with the
    // smallest step count `j` from its position `p`, where `p + j·skip ≡ e (mod size)`,
    // i.e. `j = (e − p)·skip⁻¹ mod size` — the slot its walk would reach first.
    let mut free_slots: Vec<u32> = (0..size)
        .filter(|&s| taken[(s / 64) as usize] & (1u64 << (s % 64)) == 0)
        .collect();
    let mut inverses: Vec<Option<u64>> = vec![None; live.len()];
    let m = u64::from(size);
    while !free_slots.is_empty() {
        let rank = next_rank();
        let walk = walks[rank];
        let inverse = *inverses[rank].get_or_insert_with(|| inverse_mod(u64::from(walk.skip), m));
        let p = u64::from(walk.pos);
        let mut best = (u64::MAX, 0usize);
        for (i, &e) in free_slots.iter().enumerate() {
            // (e − p) mod m and the inverse are below m ≤ 2³², so the product fits.
            let j = (u64::from(e) + m - p) % m * inverse % m;
            if j < best.0 {
                best = (j, i);
            }
        }
        let slot = free_slots.swap_remove(best.1);
        table[slot as usize] = live[rank].id;
        walks[rank].pos = Walk::step(slot, walk.skip, size);
    }
}

/// `a⁻¹ mod m` for `a` coprime with `m` (extended Euclid); 0 when `m` is 1.
fn inverse_mod(a: u64, m: u64) -> u64 {
    let (mut r0, mut r1) = (i128::from(m), i128::from(a % m));
    let (mut t0, mut t1) = (0i128, 1i128);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (t0, t1) = (t1, t0 - q * t1);
    }
    debug_assert!(r0 == 1 || m == 1, "{a} is not invertible mod {m}");
    t0.rem_euclid(i128::from(m)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverses_are_inverses() {
        for m in [2u64, 12, 4099, 65537, 262147] {
            for a in (1..m).step_by((m / 97).max(1) as usize) {
                if super::super::gcd(a, m) == 1 {
                    assert_eq!(a * inverse_mod(a, m) % m, 1, "a={a} m={m}");
                }
            }
        }
    }

    #[test]
    fn steps_wrap_without_division() {
        assert_eq!(Walk::step(5, 3, 7), 1);
        assert_eq!(Walk::step(3, 3, 7), 6);
        assert_eq!(
            Walk::step(u32::MAX - 1, u32::MAX - 2, u32::MAX),
            u32::MAX - 3
        );
    }
}
