//! `lb-agent events [--json] [--follow]`: the agent's recent state transitions, read
//! from `GET /api/v1/events`, one line each (oldest first).

use std::{process::ExitCode, time::Duration};

use hyper::Method;
use lb_agent::view::Event;

use super::http;

/// How often `--follow` asks again.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

pub async fn events(api: &http::Target, json: bool, follow: bool) -> anyhow::Result<ExitCode> {
    let body = http::request_ok(api, Method::GET, "/api/v1/events", None).await?;
    if json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut seen: Vec<Event> = serde_json::from_str(&body)?;
    for e in &seen {
        println!("{}", line(e));
    }
    if !follow {
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        tokio::time::sleep(FOLLOW_EVERY).await;
        let body = http::request_ok(api, Method::GET, "/api/v1/events", None).await?;
        let now: Vec<Event> = serde_json::from_str(&body)?;
        for e in &now[new_since(&seen, &now)..] {
            println!("{}", line(e));
        }
        seen = now;
    }
}

/// One transition as a line: time, service, server, `from -> to`, cause.
pub fn line(e: &Event) -> String {
    format!(
        "{}  {}  {}  {} -> {}  {}",
        e.time, e.service, e.server, e.from, e.to, e.cause
    )
}

/// Where the events of `now` that `before` did not hold start. The log keeps the last
/// transitions (oldest dropped first), so `before`'s newest event is found in `now`
/// unless more than the whole log came since (then everything in `now` is new).
fn new_since(before: &[Event], now: &[Event]) -> usize {
    let Some(last) = before.last() else {
        return 0;
    };
    // The same transition can be logged twice in a row in one instant: align on the
    // longest suffix of `before` that is a prefix-ending run in `now`.
    for end in (1..=now.len()).rev() {
        let k = end.min(before.len());
        if now[end - 1] == *last && now[end - k..end] == before[before.len() - k..] {
            return end;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(i: u32) -> Event {
        Event {
            time: format!("2026-01-01T00:00:{i:02}Z"),
            service: "web".into(),
            server: "10.0.1.1:80".into(),
            from: "up".into(),
            to: "unhealthy".into(),
            cause: format!("probe {i}"),
        }
    }

    #[test]
    fn only_transitions_after_the_last_seen_are_new() {
        let before = vec![ev(1), ev(2)];
        assert_eq!(new_since(&before, &[ev(1), ev(2), ev(3)]), 2);
        assert_eq!(new_since(&before, &[ev(1), ev(2)]), 2);
        // The oldest fell out of the log.
        assert_eq!(new_since(&before, &[ev(2), ev(3), ev(4)]), 1);
        // More than the whole log came since: all new.
        assert_eq!(new_since(&before, &[ev(5), ev(6)]), 0);
        assert_eq!(new_since(&[], &[ev(1)]), 0);
    }

    #[test]
    fn a_line_names_service_server_states_and_cause() {
        assert_eq!(
            line(&ev(3)),
            "2026-01-01T00:00:03Z  web  10.0.1.1:80  up -> unhealthy  probe 3"
        );
    }
}
