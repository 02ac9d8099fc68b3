//! The agent's own lateness, as its threads see it: periods during which a probe task,
//! the SYN check's sender or its receiver ran late (woke after its tick, sent a queued
//! SYN late, read a packet long after the kernel stamped it). A probe judged by kernel
//! stamps that would be a timeout is one only if no such period overlaps it: a late
//! agent's host may also have delayed or dropped the answer on its own receive path
//! (a NIC's softirq or NAPI thread starved on the agent's CPU), where the stamp is taken
//! (docs/local-faults.md).
//!
//! Clock: realtime nanoseconds, as the stamps. Process-wide, O(1) per late event.

use std::sync::Mutex;
use std::time::Duration;

use super::stamps::Stamp;

/// Lateness below this is ordinary scheduling and is not recorded.
pub(crate) const MIN_LATE: Duration = Duration::from_millis(20);
/// Periods kept; older ones are summed up in `Lag::evicted`.
const KEEP: usize = 32;
/// Periods closer than this are one.
const MERGE_GAP: u64 = 10_000_000;

#[derive(Debug, Clone, Copy, Default)]
struct Period {
    from: Stamp,
    to: Stamp,
}

#[derive(Debug, Default)]
struct Lag {
    periods: Vec<Period>,
    /// The next slot to overwrite once `KEEP` are held.
    next: usize,
    /// The end and the longest of the evicted periods (a check reaching back past what is
    /// kept counts them as overlapping).
    evicted_to: Stamp,
    evicted_longest: u64,
}

static LAG: Mutex<Lag> = Mutex::new(Lag {
    periods: Vec::new(),
    next: 0,
    evicted_to: 0,
    evicted_longest: 0,
});

/// The agent was late from `from` to `to` (a thread that should have run at `from` ran
/// at `to`).
pub(crate) fn note(from: Stamp, to: Stamp) {
    if to.saturating_sub(from) < MIN_LATE.as_nanos() as u64 {
        return;
    }
    let mut lag = LAG.lock().unwrap_or_else(|e| e.into_inner());
    let last = match lag.periods.len() {
        0 => None,
        n if n < KEEP => Some(n - 1),
        _ => Some((lag.next + KEEP - 1) % KEEP),
    };
    if let Some(i) = last {
        let p = &mut lag.periods[i];
        if from <= p.to.saturating_add(MERGE_GAP) && to.saturating_add(MERGE_GAP) >= p.from {
            p.from = p.from.min(from);
            p.to = p.to.max(to);
            return;
        }
    }
    let period = Period { from, to };
    if lag.periods.len() < KEEP {
        lag.periods.push(period);
        lag.next = lag.periods.len() % KEEP;
    } else {
        let i = lag.next;
        let old = lag.periods[i];
        lag.evicted_to = lag.evicted_to.max(old.to);
        lag.evicted_longest = lag.evicted_longest.max(old.to - old.from);
        lag.periods[i] = period;
        lag.next = (i + 1) % KEEP;
    }
}

/// A thread that should have run `late` ago runs now.
pub(crate) fn note_late(late: Duration) {
    if late >= MIN_LATE {
        let now = super::stamps::now();
        note(now.saturating_sub(late.as_nanos() as u64), now);
    }
}

/// The longest lateness of the agent that overlaps `[from, to]`, if any.
pub(crate) fn within(from: Stamp, to: Stamp) -> Option<Duration> {
    let lag = LAG.lock().unwrap_or_else(|e| e.into_inner());
    let mut longest = lag
        .periods
        .iter()
        .filter(|p| p.to >= from && p.from <= to)
        .map(|p| p.to - p.from)
        .max();
    if lag.evicted_to >= from {
        longest = longest.max(Some(lag.evicted_longest));
    }
    longest.map(Duration::from_nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Far from now, so that other tests' real lateness cannot interfere.
    const BASE: u64 = 1_000_000 * 1_000 * MS;

    #[test]
    fn periods_overlapping_a_window_are_found_and_short_ones_ignored() {
        note(BASE, BASE + 5 * MS);
        assert_eq!(within(BASE, BASE + 100 * MS), None, "5 ms is not late");
        note(BASE + 100 * MS, BASE + 400 * MS);
        note(BASE + 405 * MS, BASE + 600 * MS);
        // Merged with the period 5 ms before it (unless another test's lateness came
        // in between: then at least the later one).
        let found = within(BASE + 500 * MS, BASE + 900 * MS).expect("late in the window");
        assert!(found >= Duration::from_millis(195), "{found:?}");
        assert_eq!(within(BASE + 601 * MS, BASE + 900 * MS), None);
        assert_eq!(within(BASE, BASE + 99 * MS), None);
    }
}
