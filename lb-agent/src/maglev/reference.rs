//! The straightforward Maglev builder, without the bitset, the solved tail
//! ([`super::fill`]) and the scanned weight classes: every claim walks the backend's
//! permutation over the table itself, the turns come from a heap of the weight classes.
//! The specification the faster builder must match slot for slot (the unit tests) and
//! the baseline of `lb-maglev-bench`; not used by the agent.

use super::{Cursor, MaglevBackend, Turns, live_in_rank_order};
use lb_common::NO_BACKEND;

/// [`super::build_table`]'s table, computed the slow way.
pub fn build_table(backends: &[MaglevBackend], size: u32) -> Vec<u32> {
    let mut table = vec![NO_BACKEND; size as usize];
    let live = live_in_rank_order(backends);
    if live.is_empty() || size == 0 {
        return table;
    }
    let m = u64::from(size);
    let mut cursors: Vec<Cursor> = live.iter().map(|b| Cursor::new(b.key, m)).collect();
    let mut turns = Turns::with_scan(&live, false);
    for _ in 0..size {
        let rank = turns.next();
        let cursor = &mut cursors[rank];
        loop {
            let slot = cursor.next(m);
            if table[slot] == NO_BACKEND {
                table[slot] = live[rank].id;
                break;
            }
        }
    }
    table
}
