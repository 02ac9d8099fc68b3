//! Which passive signals the data plane can produce for a service, by protocol and
//! forwarding mode (docs/passive-signals.md, "What each mode cannot see"). `check-config`,
//! `run`'s log and the API's `passive_signals` field say it where an operator looks.

use super::{Forwarding, Protocol};

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
        (Protocol::Tcp, Forwarding::Dsr) => PassiveCoverage::SynResendOnly,
        (Protocol::Udp, Forwarding::Nat) => PassiveCoverage::IcmpOnly,
        (Protocol::Udp, Forwarding::Dsr) => PassiveCoverage::None,
    }
}
