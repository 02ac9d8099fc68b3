//! The per-server health state machine (DESIGN.md §5, Angie semantics): probe results and
//! passive signals in, state transitions with their cause out. Pure: no I/O, time is
//! passed in. Admin states (`drain`, `down`) are not here; membership keeps them apart.
//!
//! States:
//! - `checking`: a new server with essential probes, waiting for all of them to pass
//!   (a server added at runtime, and a spare, wait for every probe,
//!   [`StartState::Added`], [`StartState::NewSpare`]; one added back while its removed
//!   backend's flows still run keeps those flows meanwhile, [`StartState::Returning`]);
//! - `up`: usable;
//! - `unhealthy`: a probe reached its `fails`; back to `up` when every probe has reached
//!   its `passes`;
//! - `unavailable`: passive failures reached `max_fails` within `fail_timeout`. Without
//!   probes it is usable again once `fail_timeout` has elapsed ([`ServerHealth::tick`]);
//!   with probes (Angie: a server returns only when all its probes pass) it returns once
//!   `fail_timeout` has elapsed **and** every probe has reached its `passes` afresh since
//!   the removal — an `onfail`/`idle` probe starts running at the removal, an `always`
//!   one must pass again. A probe reaching its `fails` meanwhile makes it `unhealthy`.
//!
//! Each probe has its own verdict, Angie-style: it turns *failed* at `fails` consecutive
//! failures and *passed* at `passes` consecutive successes, and keeps it in between.
//!
//! Where DESIGN.md is silent:
//! - a probe that only runs while the server is not up (`onfail`, `idle`) loses its
//!   *passed* verdict when the server turns unhealthy: its last pass may be old, so it must
//!   reach `passes` afresh before the server returns;
//! - after `unavailable` ends the passive count starts afresh (full `max_fails`
//!   tolerance; nginx keeps the server on probation, one failure re-ejecting it). A server
//!   that is really dead produces `max_fails` signals again within moments of client
//!   traffic; probation only made one spurious signal flap a healthy server;
//! - a server kept across a reload that was down before it starts `unhealthy` (all probes
//!   must pass) instead of getting traffic it just failed;
//! - a probe result marked local (the agent's host failed: descriptors, buffers, no
//!   route, a starved runtime) counts neither as a pass nor as a failure: every verdict
//!   and counter stays as it was (docs/local-faults.md);
//! - `downtime`/`downstart` count every state but `up` (Angie counts `checking` too), and
//!   `fails` counts failed probes and passive failures.

mod passive;

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{ProbeConfig, ProbeMode, ServiceConfig};
use crate::probe::ProbeOutcome;

use passive::PassiveWindow;

/// A server's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HealthState {
    Checking,
    Up,
    Unhealthy,
    Unavailable,
}

impl HealthState {
    /// The name used in the API and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Checking => "checking",
            HealthState::Up => "up",
            HealthState::Unhealthy => "unhealthy",
            HealthState::Unavailable => "unavailable",
        }
    }

    /// Not usable: counted in `downtime` (Angie counts `checking` too).
    fn is_down(self) -> bool {
        self != HealthState::Up
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a server enters the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartState {
    /// A server the agent has not seen before.
    New,
    /// Kept across a reload and up before it: its `persistent` essential probes are
    /// taken as passed.
    ReloadedWasUp,
    /// Kept across a reload and not up before it (unhealthy or unavailable): it stays
    /// `unhealthy` until every probe has reached its `passes`, rather than getting
    /// traffic it failed a moment ago. Still in `checking` before the reload: as `New`.
    ReloadedWasDown,
    /// Added to a running service (API, SRV re-resolution, a reload adding it): held
    /// back in `checking` until **every** probe has passed, essential or not (Azure and
    /// TR7 hold new instances back; docs/probes.md). Without probes: up at once.
    Added,
    /// Added back while its removed backend still holds established flows (within the
    /// grace period of docs/membership.md): held back like [`StartState::Added`], but it
    /// is in traffic already, so while `checking` it keeps those flows.
    Returning,
    /// A spare (`spare = true`, primary group) the agent has not seen before: held back in
    /// `checking` until **every** probe has passed, essential or not (Angie: a spare with
    /// active checks is not used until they pass). Without probes: up at once.
    NewSpare,
}

impl StartState {
    /// Every probe gates `checking`, not only essential ones.
    fn every_probe_gates(self) -> bool {
        matches!(
            self,
            StartState::Added | StartState::Returning | StartState::NewSpare
        )
    }

    /// It holds established flows already, so it keeps them while `checking`.
    fn was_in_traffic(self) -> bool {
        matches!(self, StartState::ReloadedWasUp | StartState::Returning)
    }
}

/// The passive-check parameters of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassivePolicy {
    /// Failures within `fail_timeout` that make a server unavailable; 0 disables.
    pub max_fails: u32,
    /// The window of `max_fails`, and how long the server then stays unavailable.
    pub fail_timeout: Duration,
}

impl PassivePolicy {
    pub fn of(service: &ServiceConfig) -> Self {
        PassivePolicy {
            max_fails: service.max_fails,
            fail_timeout: service.fail_timeout,
        }
    }
}

/// A change of state and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub from: HealthState,
    pub to: HealthState,
    /// e.g. "probe health: 2 consecutive failures (status 500)", "all probes passed",
    /// "passive: 3 failures within 10s".
    pub cause: String,
}

/// Per-probe statistics for the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeStats {
    /// Results received.
    pub count: u64,
    /// Current run of consecutive failures.
    pub fails: u32,
    /// Failures in total.
    pub failures: u64,
    /// Current run of consecutive successes.
    pub passes: u32,
    /// When the last result came.
    pub last: Option<Instant>,
    /// Whether the last result passed.
    pub last_result: Option<bool>,
    /// The last result's detail ("status 200", "timeout"…).
    pub last_detail: String,
    pub last_duration: Option<Duration>,
    /// Runs that could not reach a verdict for a local reason (not counted above).
    pub local_faults: u64,
}

/// A probe's own verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Neither threshold reached since it started (or since its last pass went stale).
    Unknown,
    Passed,
    Failed,
}

#[derive(Debug, Clone)]
struct ProbeTrack {
    name: String,
    fails: u32,
    passes: u32,
    /// Gates `checking`: an essential probe, or any probe of a server added at runtime.
    essential: bool,
    /// Only runs while the server is not up (`onfail`, `idle`): its pass is stale once
    /// the server turns unhealthy.
    gated: bool,
    verdict: Verdict,
    stats: ProbeStats,
}

/// The health of one server.
#[derive(Debug, Clone)]
pub struct ServerHealth {
    state: HealthState,
    probes: Vec<ProbeTrack>,
    passive: PassiveWindow,
    /// End of the current `unavailable` period.
    unavailable_until: Option<Instant>,
    /// Failures seen, ever: failed probes and passive failures.
    total_fails: u64,
    /// Down time of finished down periods.
    downtime: Duration,
    /// Start of the current down period.
    downstart: Option<Instant>,
    /// When the current state began (membership's removal cap orders failures by it).
    since: Instant,
    /// Started as [`StartState::ReloadedWasUp`] or [`StartState::Returning`]: it was in
    /// traffic before, so while it is `checking` it may still hold established flows.
    was_up_before: bool,
    /// Started as [`StartState::Added`], [`StartState::Returning`] or
    /// [`StartState::NewSpare`]: every probe gates
    /// `checking`; which one, for the transition's cause.
    every_probe_gates: Option<StartState>,
}

impl ServerHealth {
    /// A server with `probes` (its service's, in order: indices are the probes' ids).
    pub fn new(
        probes: &[ProbeConfig],
        passive: PassivePolicy,
        start: StartState,
        now: Instant,
    ) -> Self {
        let mut tracks: Vec<ProbeTrack> = probes
            .iter()
            .map(|p| ProbeTrack {
                name: p.name.clone(),
                fails: p.fails.max(1),
                passes: p.passes.max(1),
                essential: p.essential || start.every_probe_gates(),
                gated: p.mode != ProbeMode::Always,
                verdict: Verdict::Unknown,
                stats: ProbeStats::default(),
            })
            .collect();
        if start == StartState::ReloadedWasUp {
            for (t, p) in tracks.iter_mut().zip(probes) {
                if p.essential && p.persistent {
                    t.verdict = Verdict::Passed;
                }
            }
        }
        let gating = tracks
            .iter()
            .any(|t| t.essential && t.verdict != Verdict::Passed);
        let state = match start {
            StartState::ReloadedWasDown if !tracks.is_empty() => HealthState::Unhealthy,
            _ if gating => HealthState::Checking,
            _ => HealthState::Up,
        };
        ServerHealth {
            state,
            probes: tracks,
            passive: PassiveWindow::new(passive),
            unavailable_until: None,
            total_fails: 0,
            downtime: Duration::ZERO,
            downstart: state.is_down().then_some(now),
            since: now,
            was_up_before: start.was_in_traffic(),
            every_probe_gates: start.every_probe_gates().then_some(start),
        }
    }

    pub fn state(&self) -> HealthState {
        self.state
    }

    /// When the current state began (creation, for the initial state).
    pub fn state_since(&self) -> Instant {
        self.since
    }

    /// It was in traffic before this state machine started (a reload or restart kept it
    /// up), so it may hold established flows while `checking`.
    pub fn was_up_before(&self) -> bool {
        self.was_up_before
    }

    /// `checking`, and a probe that gates it has reached neither its `passes` nor its
    /// `fails` yet: it may still pass (a start, a reload, an addition). Membership does
    /// not switch backup levels on such a server's account.
    pub fn verdicts_pending(&self) -> bool {
        self.state == HealthState::Checking
            && self
                .probes
                .iter()
                .any(|t| t.essential && t.verdict == Verdict::Unknown)
    }

    /// May get client traffic (health only; admin states are applied elsewhere).
    pub fn usable(&self) -> bool {
        self.state == HealthState::Up
    }

    /// A probe result. Indices out of range are ignored.
    pub fn on_probe(
        &mut self,
        idx: usize,
        outcome: &ProbeOutcome,
        now: Instant,
    ) -> Option<Transition> {
        let track = self.probes.get_mut(idx)?;
        let s = &mut track.stats;
        if outcome.local {
            // The agent's own host failed, not the server: the last verdict stays.
            s.local_faults += 1;
            return None;
        }
        s.count += 1;
        s.last = Some(now);
        s.last_result = Some(outcome.ok);
        s.last_detail.clone_from(&outcome.detail);
        s.last_duration = Some(outcome.duration);
        if outcome.ok {
            s.passes = s.passes.saturating_add(1);
            s.fails = 0;
            if s.passes >= track.passes {
                track.verdict = Verdict::Passed;
            }
        } else {
            s.fails = s.fails.saturating_add(1);
            s.failures += 1;
            s.passes = 0;
            self.total_fails += 1;
            if s.fails >= track.fails {
                track.verdict = Verdict::Failed;
            }
        }
        self.evaluate(now)
    }

    /// A passive failure signal (RST to a SYN, ICMP unreachable, SYN retransmission).
    /// Counts while the server is up; ignored in other states.
    pub fn on_passive_failure(&mut self, now: Instant) -> Option<Transition> {
        self.total_fails += 1;
        if self.state != HealthState::Up || !self.passive.failure(now) {
            return None;
        }
        let p = self.passive.policy();
        self.unavailable_until = Some(now + p.fail_timeout);
        // The return needs every probe to pass afresh (Angie: all probes must pass).
        for t in &mut self.probes {
            t.verdict = Verdict::Unknown;
            t.stats.passes = 0;
        }
        let cause = format!(
            "passive: {} within {:?}",
            plural(p.max_fails, "failure"),
            p.fail_timeout
        );
        self.go(HealthState::Unavailable, cause, now)
    }

    /// Puts the server back into an `unavailable` period that a previous run of the agent
    /// started (passive `max_fails`), for the `remaining` part of its `fail_timeout`:
    /// as [`on_passive_failure`](Self::on_passive_failure) left it, probes needing a
    /// fresh pass, ending through [`tick`](Self::tick). Not a transition: the server
    /// was unavailable before the restart. Ignored with passive checks off or nothing
    /// remaining.
    pub fn restore_unavailable(&mut self, remaining: Duration, now: Instant) -> bool {
        if self.passive.policy().max_fails == 0 || remaining.is_zero() {
            return false;
        }
        for t in &mut self.probes {
            t.verdict = Verdict::Unknown;
            t.stats.passes = 0;
        }
        self.state = HealthState::Unavailable;
        self.since = now;
        self.unavailable_until = Some(now + remaining);
        self.downstart.get_or_insert(now);
        self.was_up_before = false;
        true
    }

    /// The end of the current `unavailable` period's `fail_timeout`, while it runs.
    pub fn unavailable_until(&self) -> Option<Instant> {
        if self.state == HealthState::Unavailable {
            self.unavailable_until
        } else {
            None
        }
    }

    /// The server's passive-check parameters.
    pub fn passive_policy(&self) -> PassivePolicy {
        self.passive.policy()
    }

    /// A passive success (a connection established): resets the failure count.
    pub fn on_passive_success(&mut self, _now: Instant) {
        self.passive.success();
    }

    /// Ends `unavailable` once its `fail_timeout` has elapsed — at once without probes,
    /// else when every probe has passed since the removal (then, if they have not yet,
    /// the next probe result ends it). Call it at [`next_deadline`](Self::next_deadline)
    /// (or often).
    pub fn tick(&mut self, now: Instant) -> Option<Transition> {
        let until = self.unavailable_until?;
        if self.state != HealthState::Unavailable || now < until {
            return None;
        }
        self.unavailable_until = None;
        let timeout = self.passive.policy().fail_timeout;
        if self.probes.is_empty() {
            return self
                .return_from_passive(format!("passive: fail_timeout {timeout:?} elapsed"), now);
        }
        if self.all_passed() {
            return self.return_from_passive(
                format!("passive: fail_timeout {timeout:?} elapsed and all probes passed"),
                now,
            );
        }
        None
    }

    /// When [`tick`](Self::tick) has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.unavailable_until
    }

    /// Statistics of probe `idx`.
    pub fn probe_stats(&self, idx: usize) -> Option<&ProbeStats> {
        self.probes.get(idx).map(|t| &t.stats)
    }

    /// `(name, stats)` of every probe, in config order.
    pub fn probes(&self) -> impl Iterator<Item = (&str, &ProbeStats)> {
        self.probes.iter().map(|t| (t.name.as_str(), &t.stats))
    }

    /// Failures seen, ever: failed probes and passive failures (also those ignored
    /// because passive checks are off or the server was not up).
    pub fn fails(&self) -> u64 {
        self.total_fails
    }

    /// Time spent not usable (`checking`, `unhealthy`, `unavailable`), up to `now`.
    pub fn downtime(&self, now: Instant) -> Duration {
        self.downtime
            + self
                .downstart
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    /// Start of the current period of not being usable; `None` while up.
    pub fn downstart(&self) -> Option<Instant> {
        self.downstart
    }

    /// Applies the rules after a probe verdict may have changed.
    fn evaluate(&mut self, now: Instant) -> Option<Transition> {
        match self.state {
            HealthState::Checking => {
                if self
                    .probes
                    .iter()
                    .any(|t| t.essential && t.verdict != Verdict::Passed)
                {
                    return None;
                }
                match self.failed_cause() {
                    Some(cause) => self.go(
                        HealthState::Unhealthy,
                        format!("essential probes passed, but {cause}"),
                        now,
                    ),
                    None => {
                        let cause = match self.every_probe_gates {
                            Some(StartState::Added) => "added at runtime: all probes passed",
                            Some(StartState::Returning) => {
                                "added back while its flows run: all probes passed"
                            }
                            Some(_) => "spare: all probes passed",
                            None => "all essential probes passed",
                        };
                        self.go(HealthState::Up, cause.into(), now)
                    }
                }
            }
            HealthState::Up | HealthState::Unavailable => {
                if let Some(cause) = self.failed_cause() {
                    self.unavailable_until = None;
                    return self.go(HealthState::Unhealthy, cause, now);
                }
                // Unavailable past its fail_timeout, waiting for the probes' confirmation.
                if self.state == HealthState::Unavailable
                    && self.unavailable_until.is_none()
                    && self.all_passed()
                {
                    return self.return_from_passive(
                        "passive: all probes passed after fail_timeout".into(),
                        now,
                    );
                }
                None
            }
            HealthState::Unhealthy => {
                if self.probes.iter().any(|t| t.verdict != Verdict::Passed) {
                    return None;
                }
                // max_fails applies afresh.
                self.passive.success();
                self.go(HealthState::Up, "all probes passed".into(), now)
            }
        }
    }

    fn all_passed(&self) -> bool {
        self.probes.iter().all(|t| t.verdict == Verdict::Passed)
    }

    /// Back to `up` from `unavailable`, with the full `max_fails` tolerance.
    fn return_from_passive(&mut self, cause: String, now: Instant) -> Option<Transition> {
        self.passive.success();
        self.go(HealthState::Up, cause, now)
    }

    /// "probe NAME: N consecutive failures (DETAIL)" for the first failed probe.
    fn failed_cause(&self) -> Option<String> {
        let t = self.probes.iter().find(|t| t.verdict == Verdict::Failed)?;
        Some(format!(
            "probe {}: {} ({})",
            t.name,
            plural(t.stats.fails, "consecutive failure"),
            t.stats.last_detail
        ))
    }

    fn go(&mut self, to: HealthState, cause: String, now: Instant) -> Option<Transition> {
        let from = self.state;
        if from == to {
            return None;
        }
        self.state = to;
        self.since = now;
        match (from.is_down(), to.is_down()) {
            (false, true) => self.downstart = Some(now),
            (true, false) => {
                if let Some(s) = self.downstart.take() {
                    self.downtime += now.saturating_duration_since(s);
                }
            }
            _ => {}
        }
        if to == HealthState::Unhealthy
            && matches!(from, HealthState::Up | HealthState::Unavailable)
        {
            // A probe that did not run while the server was up has no fresh pass: it
            // must reach its `passes` again before the server returns.
            for t in &mut self.probes {
                if t.gated && t.verdict == Verdict::Passed {
                    t.verdict = Verdict::Unknown;
                    t.stats.passes = 0;
                }
            }
        }
        Some(Transition { from, to, cause })
    }
}

/// "1 failure", "3 failures".
fn plural(n: u32, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

#[cfg(test)]
mod tests;
