//! When the maps stop naming a backend host, and what reached that host afterwards. A
//! [`Watch`] polls the attached program's `LB_BACKENDS` while an event takes effect (a
//! reload, a drain, a MAC move, a restart) and records, per backend port, the first
//! moment no entry names the host any more; [`Judgment::late_arrivals`] then picks out
//! the frames captured at the host ([`crate::traffic::arrivals`]) that the data plane
//! sent there after that moment.
//!
//! A moment is the wall-clock time right after the read that saw the entry changed, so it
//! is never earlier than the write. A frame whose payload stamp
//! ([`crate::traffic::spread`]) is later than the moment left the sender after the write:
//! the program handled it with the new entry. A frame without a stamp (SYN, FIN, a pure
//! ACK, a retransmission) is judged by its receive time, which may trail the program's
//! verdict by the time the frame spends between the lb and the backend.

use std::{
    net::Ipv4Addr,
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use lb_common::maps::{BACKEND_F_LIVE, BACKEND_F_SERVING, Backend};

use crate::{
    agent::attached_maps::AttachedMaps,
    net::link::Mac,
    traffic::{arrivals::Arrival, spread::wall_ns},
    util::error::Error,
};

/// The highest backend id a watch reads (the agent hands out the lowest fresh ids first).
const LAST_ID: u32 = 64;
/// Pause between two reads of the entries.
const POLL: Duration = Duration::from_micros(200);

/// A backend host as the maps name it: its address and its MAC.
#[derive(Clone, Copy, Debug)]
pub struct HostId {
    pub ip: Ipv4Addr,
    pub mac: Mac,
}

/// What makes an entry name its host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Named {
    /// `BACKEND_F_LIVE`: the host keeps the flows pinned to it.
    Live,
    /// `BACKEND_F_SERVING` too: the host takes new flows.
    Serving,
}

impl Named {
    fn flags(self) -> u8 {
        match self {
            Named::Live => BACKEND_F_LIVE,
            Named::Serving => BACKEND_F_LIVE | BACKEND_F_SERVING,
        }
    }
}

/// Whether entry `b` names `host` on `port` in the sense of `named`.
fn names(b: &Backend, host: HostId, port: u16, named: Named) -> bool {
    b.addr[0] == u32::from_ne_bytes(host.ip.octets())
        && b.port == port.to_be()
        && b.mac == host.mac.0
        && b.flags & named.flags() == named.flags()
}

/// A thread polling the entries of one host until none names it on any of its ports.
pub struct Watch {
    handle: JoinHandle<Result<Vec<(u16, u64)>, Error>>,
}

impl Watch {
    /// Starts watching `host` on `ports`; an error unless every port has an entry naming
    /// it now (the event to come must change something).
    pub fn start(
        maps: AttachedMaps,
        host: HostId,
        named: Named,
        ports: &[u16],
        timeout: Duration,
    ) -> Result<Watch, Error> {
        let entries = maps.backends(LAST_ID)?;
        for &port in ports {
            if !entries.iter().any(|(_, b)| names(b, host, port, named)) {
                return Err(Error::Unexpected(format!(
                    "no backend entry names {} ({}) on port {port} ({named:?}) before the event",
                    host.ip, host.mac
                )));
            }
        }
        let ports = ports.to_vec();
        let handle = thread::spawn(move || {
            let started = Instant::now();
            let mut moments: Vec<(u16, u64)> = Vec::new();
            loop {
                let entries = maps.backends(LAST_ID)?;
                let now = wall_ns();
                for &port in &ports {
                    let unnamed = !entries.iter().any(|(_, b)| names(b, host, port, named));
                    if unnamed && !moments.iter().any(|(p, _)| *p == port) {
                        moments.push((port, now));
                    }
                }
                if moments.len() == ports.len() {
                    return Ok(moments);
                }
                if started.elapsed() > timeout {
                    let of_host: Vec<String> = entries
                        .iter()
                        .filter(|(_, b)| b.addr[0] == u32::from_ne_bytes(host.ip.octets()))
                        .map(|(id, b)| {
                            format!(
                                "id {id}: port {} flags {:#x} MAC {}",
                                u16::from_be(b.port),
                                b.flags,
                                Mac(b.mac)
                            )
                        })
                        .collect();
                    return Err(Error::Unexpected(format!(
                        "entries still name {} ({}) {named:?} after {timeout:?}; unnamed so \
                         far: {moments:?}; its entries: {}",
                        host.ip,
                        host.mac,
                        of_host.join(", ")
                    )));
                }
                thread::sleep(POLL);
            }
        });
        Ok(Watch { handle })
    }

    /// The moment (ns since the epoch) each port stopped naming the host.
    pub fn moments(self) -> Result<Vec<(u16, u64)>, Error> {
        self.handle
            .join()
            .map_err(|_| Error::Unexpected("the watch panicked".into()))?
    }
}

/// What may still reach a host after its moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Nothing (it left the maps, or its entry moved to another MAC).
    Nothing,
    /// Only flows that reached it before the moment (a drained host keeps its pinned TCP
    /// connections; no new connection may reach it).
    PinnedOnly,
}

/// One port of one host that the maps stopped naming at `moment_ns`.
#[derive(Clone, Debug)]
pub struct Judgment {
    /// The event, for messages.
    pub event: String,
    /// The host's name, for messages.
    pub host: String,
    pub port: u16,
    pub moment_ns: u64,
    pub rule: Rule,
}

impl Judgment {
    /// The frames of `arrivals` (the host's capture) for this port that `is_flow` counts
    /// as the service's own and that the data plane sent after the moment: stamped later,
    /// or received later than `late` after it; under [`Rule::PinnedOnly`] only those of
    /// flows (source address and port) that did not reach the host before the moment.
    pub fn late_arrivals(
        &self,
        arrivals: &[Arrival],
        is_flow: impl Fn(&Arrival) -> bool,
        late: Duration,
    ) -> Vec<Arrival> {
        let ours: Vec<&Arrival> = arrivals
            .iter()
            .filter(|a| a.dport == self.port && is_flow(a))
            .collect();
        let pinned: Vec<(Ipv4Addr, u16)> = match self.rule {
            Rule::Nothing => Vec::new(),
            Rule::PinnedOnly => ours
                .iter()
                .filter(|a| a.at_ns <= self.moment_ns)
                .map(|a| (a.src, a.sport))
                .collect(),
        };
        let late_ns = self.moment_ns + late.as_nanos() as u64;
        ours.into_iter()
            .filter(|a| a.stamp_ns.is_some_and(|s| s > self.moment_ns) || a.at_ns > late_ns)
            .filter(|a| !pinned.contains(&(a.src, a.sport)))
            .copied()
            .collect()
    }

    /// How many of the service's frames for this port reached the host before the moment
    /// (the event took something away only if some did).
    pub fn arrivals_before(
        &self,
        arrivals: &[Arrival],
        is_flow: impl Fn(&Arrival) -> bool,
    ) -> usize {
        arrivals
            .iter()
            .filter(|a| a.dport == self.port && is_flow(a) && a.at_ns <= self.moment_ns)
            .count()
    }
}
