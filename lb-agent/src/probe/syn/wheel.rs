//! A hashed timing wheel of 1 ms slots: how the SYN engine finds, without a timer per
//! probe, the probe runs and timeouts that are due.
//!
//! An item is filed under the first whole millisecond at or after its deadline (it never
//! fires early) in slot `tick % SLOTS`; a slot keeps items of later revolutions until
//! their tick comes. Expiring visits only the slots passed since the last call.

use std::time::{Duration, Instant};

/// Slots (milliseconds) per revolution: longer deadlines wait in their slot for a later
/// revolution.
const SLOTS: u64 = 4096;

pub(super) struct Wheel<T> {
    /// Tick 0.
    epoch: Instant,
    slots: Vec<Vec<(u64, T)>>,
    /// The last tick expired: everything due at or before it has been handed out.
    cursor: u64,
    len: usize,
}

impl<T> Wheel<T> {
    pub(super) fn new(epoch: Instant) -> Self {
        Wheel {
            epoch,
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
            cursor: 0,
            len: 0,
        }
    }

    /// Items filed and not expired yet.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// Files `item` to expire at `at` (rounded up to the next millisecond; a deadline
    /// already passed expires on the next [`Wheel::expire`]).
    pub(super) fn insert(&mut self, at: Instant, item: T) {
        let since = at.saturating_duration_since(self.epoch);
        let tick =
            since.as_millis() as u64 + u64::from(!since.subsec_nanos().is_multiple_of(1_000_000));
        let tick = tick.max(self.cursor + 1);
        self.slots[(tick % SLOTS) as usize].push((tick, item));
        self.len += 1;
    }

    /// Moves every item due at `now` into `out` (in deadline order between slots).
    pub(super) fn expire(&mut self, now: Instant, out: &mut Vec<T>) {
        let now_tick = now.saturating_duration_since(self.epoch).as_millis() as u64;
        if now_tick <= self.cursor {
            return;
        }
        let span = (now_tick - self.cursor).min(SLOTS);
        for tick in self.cursor + 1..=self.cursor + span {
            let slot = &mut self.slots[(tick % SLOTS) as usize];
            let before = out.len();
            out.extend(
                slot.extract_if(.., |(due, _)| *due <= now_tick)
                    .map(|(_, item)| item),
            );
            self.len -= out.len() - before;
        }
        self.cursor = now_tick;
    }

    /// How long from `now` until the next slot holding an item comes (that item may be
    /// one of a later revolution: the caller then simply waits again); `None` if empty.
    pub(super) fn next_wait(&self, now: Instant) -> Option<Duration> {
        if self.len == 0 {
            return None;
        }
        let tick = (self.cursor + 1..=self.cursor + SLOTS)
            .find(|t| !self.slots[(t % SLOTS) as usize].is_empty())?;
        let at = self.epoch + Duration::from_millis(tick);
        Some(at.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn items_expire_at_their_millisecond_never_before() {
        let t0 = Instant::now();
        let mut w = Wheel::new(t0);
        w.insert(t0 + ms(5), "five");
        w.insert(t0 + ms(5) + Duration::from_micros(1), "just after five");
        w.insert(t0 + ms(2), "two");
        let mut out = Vec::new();
        w.expire(t0 + ms(1), &mut out);
        assert!(out.is_empty());
        w.expire(t0 + ms(4) + Duration::from_micros(999), &mut out);
        assert_eq!(out, ["two"]);
        out.clear();
        w.expire(t0 + ms(5), &mut out);
        assert_eq!(out, ["five"]);
        out.clear();
        w.expire(t0 + ms(6), &mut out);
        assert_eq!(out, ["just after five"]);
        assert_eq!(w.len(), 0);
        assert_eq!(w.next_wait(t0 + ms(6)), None);
    }

    #[test]
    fn deadlines_beyond_one_revolution_wait_for_theirs() {
        let t0 = Instant::now();
        let mut w = Wheel::new(t0);
        let far = ms(SLOTS * 2 + 7);
        w.insert(t0 + far, 1);
        let mut out = Vec::new();
        // Walk past its slot twice (in steps, and in one jump) without it expiring.
        for step in 1..=SLOTS + 10 {
            w.expire(t0 + ms(step), &mut out);
        }
        w.expire(t0 + far - ms(1), &mut out);
        assert!(out.is_empty());
        assert_eq!(w.next_wait(t0 + far - ms(1)), Some(ms(1)));
        w.expire(t0 + far, &mut out);
        assert_eq!(out, [1]);
    }

    #[test]
    fn a_late_expiry_hands_out_everything_passed_and_past_deadlines_fire_next() {
        let t0 = Instant::now();
        let mut w = Wheel::new(t0);
        for i in 0..100u64 {
            w.insert(t0 + ms(i * 97 % 9000), i);
        }
        let mut out = Vec::new();
        w.expire(t0 + ms(20_000), &mut out);
        out.sort();
        assert_eq!(out, (0..100).collect::<Vec<_>>());
        // A deadline before the cursor is not lost: it is due at the next expiry.
        w.insert(t0, 7);
        assert_eq!(w.next_wait(t0 + ms(20_000)), Some(ms(1)));
        out.clear();
        w.expire(t0 + ms(20_001), &mut out);
        assert_eq!(out, [7]);
    }
}
