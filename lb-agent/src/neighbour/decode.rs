//! Rtnetlink messages decoded into what lb needs: neighbour entries, and which routes changed.

use std::net::IpAddr;

use rtnetlink::{
    packet_core::{NetlinkMessage, NetlinkPayload},
    packet_route::{
        RouteNetlinkMessage,
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
        route::{RouteAddress, RouteAttribute, RouteMessage, RouteVia},
    },
};

/// A link-layer (Ethernet) address.
pub type Mac = [u8; 6];

/// What a neighbour entry says about sending to that address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// A link-layer address the kernel would use: REACHABLE, STALE, DELAY, PROBE,
    /// PERMANENT or NOARP with an address.
    Usable(Mac),
    /// Resolution gave up (no answer to the kernel's probes).
    Failed,
    /// Being resolved; no address yet.
    Incomplete,
    /// Nothing to go by (NONE, or a state without an Ethernet address).
    Unknown,
}

impl Reach {
    /// The reach of a kernel state with its link-layer address (if any).
    pub fn of(state: NeighbourState, lladdr: Option<&[u8]>) -> Self {
        let mac = lladdr.and_then(|l| Mac::try_from(l).ok());
        match (state, mac) {
            (NeighbourState::Failed, _) => Reach::Failed,
            (NeighbourState::Incomplete, _) => Reach::Incomplete,
            (
                NeighbourState::Reachable
                | NeighbourState::Stale
                | NeighbourState::Delay
                | NeighbourState::Probe
                | NeighbourState::Permanent
                | NeighbourState::Noarp,
                Some(mac),
            ) => Reach::Usable(mac),
            _ => Reach::Unknown,
        }
    }
}

/// One neighbour entry (one address on one interface).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeighEntry {
    pub ifindex: u32,
    pub addr: IpAddr,
    pub reach: Reach,
}

/// A changed route: destinations inside `dst/prefix_len` may now take another path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteChange {
    /// `None`: the family's default route (prefix length 0).
    pub dst: Option<IpAddr>,
    pub prefix_len: u8,
    pub v6: bool,
}

impl RouteChange {
    /// Whether `addr`'s route lookup may give another answer after this change.
    pub fn covers(&self, addr: IpAddr) -> bool {
        match (self.dst, addr) {
            (_, IpAddr::V4(_)) if self.v6 => false,
            (_, IpAddr::V6(_)) if !self.v6 => false,
            (None, _) => true,
            (Some(IpAddr::V4(net)), IpAddr::V4(a)) => {
                let len = u32::from(self.prefix_len.min(32));
                let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                u32::from(net) & mask == u32::from(a) & mask
            }
            (Some(IpAddr::V6(net)), IpAddr::V6(a)) => {
                let len = u32::from(self.prefix_len.min(128));
                let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                u128::from(net) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// What one multicast message means to lb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// RTM_NEWNEIGH: an entry was created or changed.
    Neigh(NeighEntry),
    /// RTM_DELNEIGH: the kernel no longer has an entry for `addr`.
    NeighGone { ifindex: u32, addr: IpAddr },
    /// RTM_NEWROUTE / RTM_DELROUTE.
    Route(RouteChange),
}

/// The entry a neighbour message describes (`None`: not an IP neighbour).
pub fn neigh_entry(msg: &NeighbourMessage) -> Option<NeighEntry> {
    let mut addr = None;
    let mut lladdr = None;
    for attr in &msg.attributes {
        match attr {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                addr = Some(IpAddr::V4(*a))
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                addr = Some(IpAddr::V6(*a))
            }
            NeighbourAttribute::LinkLayerAddress(l) => lladdr = Some(l.as_slice()),
            _ => {}
        }
    }
    Some(NeighEntry {
        ifindex: msg.header.ifindex,
        addr: addr?,
        reach: Reach::of(msg.header.state, lladdr),
    })
}

/// Where a route sends a destination: the gateway (`None`: on-link) and the interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteHop {
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
}

/// The hop of a route message (the answer to RTM_GETROUTE for one destination).
pub fn route_hop(msg: &RouteMessage) -> RouteHop {
    let mut hop = RouteHop::default();
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Gateway(RouteAddress::Inet(a)) => hop.gateway = Some(IpAddr::V4(*a)),
            RouteAttribute::Gateway(RouteAddress::Inet6(a)) => hop.gateway = Some(IpAddr::V6(*a)),
            RouteAttribute::Via(RouteVia::Inet(a)) => hop.gateway = Some(IpAddr::V4(*a)),
            RouteAttribute::Via(RouteVia::Inet6(a)) => hop.gateway = Some(IpAddr::V6(*a)),
            RouteAttribute::Oif(i) => hop.oif = Some(*i),
            _ => {}
        }
    }
    hop
}

fn route_change(msg: &RouteMessage) -> Option<RouteChange> {
    let v6 = match msg.header.address_family {
        rtnetlink::packet_route::AddressFamily::Inet => false,
        rtnetlink::packet_route::AddressFamily::Inet6 => true,
        _ => return None,
    };
    let dst = msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(a)) => Some(IpAddr::V4(*a)),
        RouteAttribute::Destination(RouteAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
        _ => None,
    });
    Some(RouteChange {
        dst,
        prefix_len: if dst.is_some() {
            msg.header.destination_prefix_length
        } else {
            0
        },
        v6,
    })
}

/// The event a route-netlink message carries, if lb cares.
pub fn event(msg: &RouteNetlinkMessage) -> Option<Event> {
    match msg {
        RouteNetlinkMessage::NewNeighbour(n) => neigh_entry(n).map(Event::Neigh),
        RouteNetlinkMessage::DelNeighbour(n) => neigh_entry(n).map(|e| Event::NeighGone {
            ifindex: e.ifindex,
            addr: e.addr,
        }),
        RouteNetlinkMessage::NewRoute(r) | RouteNetlinkMessage::DelRoute(r) => {
            route_change(r).map(Event::Route)
        }
        _ => None,
    }
}

/// A datagram read from the multicast socket was not netlink.
#[derive(Debug, thiserror::Error)]
#[error("undecodable netlink datagram at byte {offset}: {reason}")]
pub struct DecodeError {
    pub offset: usize,
    pub reason: String,
}

/// Every event in one datagram (the kernel may pack several messages into one).
pub fn datagram(buf: &[u8]) -> Result<Vec<Event>, DecodeError> {
    let mut events = Vec::new();
    let mut offset = 0;
    while buf.len().saturating_sub(offset) >= 16 {
        let msg =
            NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[offset..]).map_err(|e| {
                DecodeError {
                    offset,
                    reason: e.to_string(),
                }
            })?;
        let len = msg.header.length as usize;
        if len < 16 {
            return Err(DecodeError {
                offset,
                reason: format!("message length {len}"),
            });
        }
        if let NetlinkPayload::InnerMessage(inner) = &msg.payload
            && let Some(ev) = event(inner)
        {
            events.push(ev);
        }
        offset += len.next_multiple_of(4);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use rtnetlink::packet_route::{
        AddressFamily,
        route::{RouteHeader, RouteType},
    };

    use super::*;

    fn neigh(state: NeighbourState, addr: IpAddr, lladdr: Option<Vec<u8>>) -> NeighbourMessage {
        let mut msg = NeighbourMessage::default();
        msg.header.ifindex = 7;
        msg.header.state = state;
        msg.header.family = match addr {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        msg.attributes
            .push(NeighbourAttribute::Destination(match addr {
                IpAddr::V4(a) => NeighbourAddress::Inet(a),
                IpAddr::V6(a) => NeighbourAddress::Inet6(a),
            }));
        if let Some(l) = lladdr {
            msg.attributes.push(NeighbourAttribute::LinkLayerAddress(l));
        }
        msg
    }

    /// Serializes messages into one datagram as the kernel sends them.
    fn wire(msgs: Vec<RouteNetlinkMessage>) -> Vec<u8> {
        let mut out = Vec::new();
        for m in msgs {
            let mut nl = NetlinkMessage::from(m);
            nl.finalize();
            let mut buf = vec![0u8; nl.buffer_len()];
            nl.serialize(&mut buf);
            out.extend_from_slice(&buf);
            out.resize(out.len().next_multiple_of(4), 0);
        }
        out
    }

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x0b];

    #[test]
    fn states_with_an_address_are_usable() {
        for state in [
            NeighbourState::Reachable,
            NeighbourState::Stale,
            NeighbourState::Delay,
            NeighbourState::Probe,
            NeighbourState::Permanent,
        ] {
            assert_eq!(
                Reach::of(state, Some(&MAC)),
                Reach::Usable(MAC),
                "{state:?}"
            );
        }
        assert_eq!(Reach::of(NeighbourState::Failed, Some(&MAC)), Reach::Failed);
        assert_eq!(
            Reach::of(NeighbourState::Incomplete, None),
            Reach::Incomplete
        );
        assert_eq!(Reach::of(NeighbourState::Stale, None), Reach::Unknown);
        assert_eq!(
            Reach::of(NeighbourState::Reachable, Some(&[1, 2])),
            Reach::Unknown
        );
        assert_eq!(Reach::of(NeighbourState::None, Some(&MAC)), Reach::Unknown);
    }

    #[test]
    fn decodes_neighbour_and_route_messages_from_the_wire() {
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 0, 1, 11));
        let v6 = IpAddr::V6("fd00::11".parse::<Ipv6Addr>().unwrap());
        let mut route = RouteMessage::default();
        route.header = RouteHeader {
            address_family: AddressFamily::Inet,
            destination_prefix_length: 24,
            kind: RouteType::Unicast,
            ..Default::default()
        };
        route
            .attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet(
                Ipv4Addr::new(10, 0, 2, 0),
            )));
        let mut default6 = RouteMessage::default();
        default6.header.address_family = AddressFamily::Inet6;
        let buf = wire(vec![
            RouteNetlinkMessage::NewNeighbour(neigh(
                NeighbourState::Reachable,
                v4,
                Some(MAC.to_vec()),
            )),
            RouteNetlinkMessage::NewNeighbour(neigh(NeighbourState::Failed, v6, None)),
            RouteNetlinkMessage::DelNeighbour(neigh(NeighbourState::Stale, v4, None)),
            RouteNetlinkMessage::NewRoute(route),
            RouteNetlinkMessage::DelRoute(default6),
        ]);
        let events = datagram(&buf).unwrap();
        assert_eq!(
            events,
            vec![
                Event::Neigh(NeighEntry {
                    ifindex: 7,
                    addr: v4,
                    reach: Reach::Usable(MAC)
                }),
                Event::Neigh(NeighEntry {
                    ifindex: 7,
                    addr: v6,
                    reach: Reach::Failed
                }),
                Event::NeighGone {
                    ifindex: 7,
                    addr: v4
                },
                Event::Route(RouteChange {
                    dst: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 2, 0))),
                    prefix_len: 24,
                    v6: false
                }),
                Event::Route(RouteChange {
                    dst: None,
                    prefix_len: 0,
                    v6: true
                }),
            ]
        );
        assert!(datagram(&buf[..buf.len() - 8]).is_err());
    }

    #[test]
    fn a_route_change_covers_its_prefix_and_family() {
        let net = RouteChange {
            dst: Some("10.0.2.0".parse().unwrap()),
            prefix_len: 24,
            v6: false,
        };
        assert!(net.covers("10.0.2.9".parse().unwrap()));
        assert!(!net.covers("10.0.3.9".parse().unwrap()));
        assert!(!net.covers("fd00::9".parse().unwrap()));
        let default4 = RouteChange {
            dst: None,
            prefix_len: 0,
            v6: false,
        };
        assert!(default4.covers("192.0.2.1".parse().unwrap()));
        assert!(!default4.covers("fd00::1".parse().unwrap()));
        let host6 = RouteChange {
            dst: Some("fd00::11".parse().unwrap()),
            prefix_len: 128,
            v6: true,
        };
        assert!(host6.covers("fd00::11".parse().unwrap()));
        assert!(!host6.covers("fd00::12".parse().unwrap()));
    }

    #[test]
    fn route_answers_give_the_gateway_and_interface() {
        let mut msg = RouteMessage::default();
        msg.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::new(
                10, 0, 1, 1,
            ))));
        msg.attributes.push(RouteAttribute::Oif(3));
        assert_eq!(
            route_hop(&msg),
            RouteHop {
                gateway: Some("10.0.1.1".parse().unwrap()),
                oif: Some(3)
            }
        );
        assert_eq!(route_hop(&RouteMessage::default()), RouteHop::default());
    }
}
