//! Which kinds of failure a probe can see, and how soon it takes a server out for each
//! (check-config's probe and service lines, docs/check-config.md): a host that goes
//! down, a closed port, an application that hangs on a live host, a wrong answer.

use std::time::Duration;

use super::bounds::Bounds;
use super::{ProbeConfig, ProbeKind};

/// A kind of server failure, as a probe meets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The host stops answering (down, unplugged): nothing comes back.
    HostDown,
    /// The host answers but nothing listens: a refused connection, a port unreachable.
    PortClosed,
    /// The kernel still accepts connections, the application answers nothing.
    AppHung,
    /// The application answers something else than expected.
    WrongAnswer,
}

impl Failure {
    pub const ALL: [Failure; 4] = [
        Failure::HostDown,
        Failure::PortClosed,
        Failure::AppHung,
        Failure::WrongAnswer,
    ];

    /// Its name in check-config's text.
    pub fn name(self) -> &'static str {
        match self {
            Failure::HostDown => "host down",
            Failure::PortClosed => "port closed",
            Failure::AppHung => "application hung",
            Failure::WrongAnswer => "wrong answer",
        }
    }
}

/// Whether `p` reads a reply and checks it (`expect` or `test`, and a reply awaited).
fn checks_reply(p: &ProbeConfig) -> bool {
    (p.expect.is_some() || p.test.is_some()) && (p.kind != ProbeKind::Tcp || p.max_response > 0)
}

/// How soon `p` fails a server with failure `f`, given its bounds `b`; `None` when it
/// cannot see it. A failure known before the timeout takes `b.detect_fast`, one seen
/// only at the timeout `b.detect_worst`.
pub fn seen_within(p: &ProbeConfig, b: &Bounds, f: Failure) -> Option<Duration> {
    let checks = checks_reply(p);
    match (p.kind, f) {
        (ProbeKind::Icmp, Failure::HostDown) => Some(b.detect_worst),
        (ProbeKind::Icmp, _) => None,
        (ProbeKind::Udp, Failure::HostDown | Failure::AppHung) if !checks => None,
        (_, Failure::HostDown) => Some(b.detect_worst),
        (_, Failure::PortClosed) => Some(b.detect_fast),
        (ProbeKind::Http, Failure::AppHung) => Some(b.detect_worst),
        (ProbeKind::Http, Failure::WrongAnswer) => Some(b.detect_fast),
        (ProbeKind::Tcp | ProbeKind::Udp, _) if !checks => None,
        (ProbeKind::Tcp | ProbeKind::Udp, Failure::AppHung) => Some(b.detect_worst),
        (ProbeKind::Udp, Failure::WrongAnswer) => Some(b.detect_fast),
        // A reply that may still match is read until the close, `max_response` or the
        // timeout; only an `expect` anchored at the start is decided by its first bytes.
        (ProbeKind::Tcp, Failure::WrongAnswer) => match (&p.expect, &p.test) {
            (Some(e), None) if crate::probe::expect_decides_early(e) => Some(b.detect_fast),
            _ => Some(b.detect_worst),
        },
    }
}

/// Why `p` cannot see the failures it cannot see, for the probe's line.
pub fn blind_because(p: &ProbeConfig) -> &'static str {
    match p.kind {
        ProbeKind::Icmp => "icmp ignores ports and applications",
        ProbeKind::Udp => "without expect or test, silence passes",
        ProbeKind::Tcp if p.expect.is_some() || p.test.is_some() => {
            "max_response = 0 reads no reply"
        }
        ProbeKind::Tcp => "the kernel completes the handshake for the application",
        ProbeKind::Http => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::bounds::detection_bounds;

    fn sees(p: &ProbeConfig) -> Vec<Option<Duration>> {
        let b = detection_bounds(p);
        Failure::ALL
            .iter()
            .map(|&f| seen_within(p, &b, f))
            .collect()
    }

    #[test]
    fn each_probe_sees_what_it_can() {
        let s = Duration::from_secs;
        let icmp = ProbeConfig::new("ping", ProbeKind::Icmp);
        assert_eq!(sees(&icmp), [Some(s(6)), None, None, None]);
        let syn = ProbeConfig::new("port", ProbeKind::Tcp);
        assert_eq!(sees(&syn), [Some(s(6)), Some(s(5)), None, None]);
        let http = ProbeConfig::new("http", ProbeKind::Http);
        assert_eq!(
            sees(&http),
            [Some(s(6)), Some(s(5)), Some(s(6)), Some(s(5))]
        );
        let mut anchored = ProbeConfig::new("redis", ProbeKind::Tcp);
        anchored.expect = Some(regex::Regex::new(r"^\+PONG").unwrap());
        assert_eq!(
            sees(&anchored),
            [Some(s(6)), Some(s(5)), Some(s(6)), Some(s(5))]
        );
        let mut loose = anchored.clone();
        loose.expect = Some(regex::Regex::new("PONG").unwrap());
        assert_eq!(
            sees(&loose),
            [Some(s(6)), Some(s(5)), Some(s(6)), Some(s(6))],
            "an unanchored expect decides a wrong answer only at the timeout"
        );
        let udp = ProbeConfig::new("dns", ProbeKind::Udp);
        assert_eq!(sees(&udp), [None, Some(s(5)), None, None]);
    }
}
