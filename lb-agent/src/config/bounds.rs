//! The TR7 detection and recovery bounds of one probe, as `check-config` prints them.

use std::time::Duration;

use super::ProbeConfig;
use crate::probe::MIN_INTERVAL;

/// How long a probe takes to notice a failure and a recovery (DESIGN.md §5, TR7), not
/// counting propagation (< 1 ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// A server that stops answering is out of traffic within this, as the scheduler
    /// runs probes (`probe::schedule`: on fixed ticks, the next one at once when a probe
    /// outlasts its tick): the first failing probe starts within `interval + jitter` of
    /// the failure, the following ones `max(interval + jitter, timeout)` apart, and the
    /// last one fails at its timeout: `(interval + jitter) + (fails − 1) × max(interval +
    /// jitter, timeout) + timeout`. TR7's `fails × (interval + timeout)` is never below it.
    pub detect_worst: Duration,
    /// A refused port or a wrong answer fails without waiting for the timeout:
    /// `fails × (interval + jitter)`.
    pub detect_fast: Duration,
    /// Recovery takes at least `(passes − 1) × interval` ...
    pub recover_min: Duration,
    /// ... and at most `max(interval + jitter, timeout) + (passes − 1) × (interval +
    /// jitter)`: a probe that started just before the recovery may still fail at its
    /// timeout, and the next one starts when it ends if its tick has passed.
    pub recover_max: Duration,
}

/// The interval the scheduler runs `p` at: at least [`MIN_INTERVAL`] (1 ms).
fn effective_interval(p: &ProbeConfig) -> Duration {
    p.interval.max(MIN_INTERVAL)
}

/// The bounds of one probe. With `jitter = 0` (the default), `timeout <= interval` and
/// `fails = 1` these are exactly the TR7 formulas; with more `fails` the dead-server
/// bound counts the timeout once, since the probes keep their ticks (a failing probe
/// ends before the next tick); jitter only lengthens waits (each is `interval +
/// random(0..=jitter)`); an interval below 1 ms counts as 1 ms, as the scheduler runs it.
/// A probe whose timeout exceeds its interval has a longer recovery bound: the failing
/// probe in flight when the server recovers runs until its timeout, and the first
/// passing probe starts when it ends (`probe::schedule`).
/// A probe in `onfail` mode does not run while the server is healthy, so its detection
/// bounds only hold for failures that passive checks report first.
pub fn detection_bounds(p: &ProbeConfig) -> Bounds {
    let interval = effective_interval(p);
    // tokio's timer fires on whole milliseconds: a shorter timeout may last up to 1 ms.
    let timeout = p.timeout.max(MIN_INTERVAL);
    let period = interval.saturating_add(p.jitter);
    let passes_after_first = period.saturating_mul(p.passes.saturating_sub(1));
    Bounds {
        detect_worst: period
            .saturating_add(period.max(timeout).saturating_mul(p.fails.max(1) - 1))
            .saturating_add(timeout),
        detect_fast: period.saturating_mul(p.fails),
        recover_min: interval.saturating_mul(p.passes.saturating_sub(1)),
        recover_max: period.max(timeout).saturating_add(passes_after_first),
    }
}
