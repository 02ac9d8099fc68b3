//! Which passive signals the data plane can produce for a service, by protocol and
//! forwarding mode (docs/passive-signals.md, "What each mode cannot see"). `check-config`,
//! `run`'s log and the API's `passive_signals` field say it where an operator looks.

use super::{Forwarding, Protocol, ServiceConfig};

/// The passive failure signals a service can see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PassiveCoverage {
    /// tcp + nat: `rst_on_syn`, `icmp_unreachable`, `syn_retransmit`.
    Full,
    /// tcp + dsr: replies bypass lb, only the client's resent SYN (`syn_retransmit`).
    SynResendOnly,
    /// udp + nat: no handshake; only ICMP unreachables from the backend (`icmp_unreachable`).
    IcmpOnly,
    /// udp + dsr: nothing reaches lb that says a backend failed.
    None,
}

impl PassiveCoverage {
    /// Does any signal exist?
    pub fn any(self) -> bool {
        self != PassiveCoverage::None
    }

    /// The event names (as in the API and metrics) this service can produce.
    pub fn signals(self) -> &'static [&'static str] {
        match self {
            PassiveCoverage::Full => &["rst_on_syn", "icmp_unreachable", "syn_retransmit"],
            PassiveCoverage::SynResendOnly => &["syn_retransmit"],
            PassiveCoverage::IcmpOnly => &["icmp_unreachable"],
            PassiveCoverage::None => &[],
        }
    }
}

/// The passive signals of a `protocol` service forwarded by `forwarding`.
pub fn passive_coverage(protocol: Protocol, forwarding: Forwarding) -> PassiveCoverage {
    match (protocol, forwarding) {
        (Protocol::Tcp, Forwarding::Nat) => PassiveCoverage::Full,
        (Protocol::Tcp, Forwarding::Dsr | Forwarding::Ipip | Forwarding::Gue) => {
            PassiveCoverage::SynResendOnly
        }
        (Protocol::Udp, Forwarding::Nat) => PassiveCoverage::IcmpOnly,
        (Protocol::Udp, Forwarding::Dsr | Forwarding::Ipip | Forwarding::Gue) => {
            PassiveCoverage::None
        }
    }
}

/// Why `svc`'s passive checks are weaker than they look, when `max_fails` is written in
/// the file where they see little or nothing; `None` when they see every signal, are off,
/// or `max_fails` is the default (the passive line of `check-config` says what it counts).
pub fn passive_gap(svc: &ServiceConfig) -> Option<String> {
    if svc.max_fails == 0 || !svc.max_fails_written {
        return None;
    }
    let n = svc.max_fails;
    match passive_coverage(svc.protocol, svc.forwarding) {
        PassiveCoverage::Full => None,
        PassiveCoverage::None => Some(format!(
            "max_fails = {n} has nothing to count: a udp service with forwarding = \"{}\" \
             produces no passive signal (no handshake, and the servers' ICMP errors go straight \
             to the client); use probes",
            svc.forwarding
        )),
        PassiveCoverage::IcmpOnly => Some(format!(
            "max_fails = {n} counts only ICMP unreachables from the server: a udp server \
             that goes silent is never counted; use probes"
        )),
        PassiveCoverage::SynResendOnly => Some(format!(
            "max_fails = {n} sees almost nothing with forwarding = \"{}\": replies \
             bypass lb, so only client SYN retransmissions count (no RST or ICMP from the server)",
            svc.forwarding
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tcp_nat_sees_every_signal() {
        use Forwarding::*;
        use Protocol::*;
        assert_eq!(passive_coverage(Tcp, Nat).signals().len(), 3);
        assert_eq!(passive_coverage(Tcp, Dsr).signals(), ["syn_retransmit"]);
        assert_eq!(passive_coverage(Udp, Nat).signals(), ["icmp_unreachable"]);
        assert!(!passive_coverage(Udp, Dsr).any());
        assert!(passive_coverage(Udp, Dsr).signals().is_empty());
        for tunnel in [Ipip, Gue] {
            assert_eq!(passive_coverage(Tcp, tunnel), passive_coverage(Tcp, Dsr));
            assert!(!passive_coverage(Udp, tunnel).any());
        }
    }
}
