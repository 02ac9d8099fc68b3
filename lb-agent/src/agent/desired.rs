//! The data-plane view of a service as the agent wants it ([`DesiredService`]): pure,
//! from its configuration, its servers, their membership roles and the known MACs.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
};

use lb_common::{IPPROTO_TCP, IPPROTO_UDP};

use super::ServiceRt;
use crate::{
    config::{Forwarding, Protocol},
    membership::Outcome,
    publish::{DesiredBackend, DesiredService, NatSpec, Tunnel},
};

/// The data-plane view of one server of a service given its role.
pub(super) fn desired_backend(
    svc: &ServiceRt,
    (addr, role): (SocketAddr, crate::publish::Role),
    macs: &HashMap<IpAddr, [u8; 6]>,
) -> DesiredBackend {
    DesiredBackend {
        addr,
        weight: svc.servers.get(&addr).map_or(0, |s| s.weight),
        mac: macs.get(&addr.ip()).copied(),
        role,
    }
}

/// The data-plane view of one service given its membership outcome.
pub(super) fn desired_service(
    svc: &ServiceRt,
    outcome: &Outcome,
    macs: &HashMap<IpAddr, [u8; 6]>,
) -> DesiredService {
    DesiredService {
        name: svc.cfg.name.clone(),
        vip: svc.cfg.vip,
        proto: match svc.cfg.protocol {
            Protocol::Tcp => IPPROTO_TCP,
            Protocol::Udp => IPPROTO_UDP,
        },
        nat: match svc.cfg.forwarding {
            Forwarding::Nat => (!svc.cfg.snat_ips.is_empty()).then(|| NatSpec {
                snat_ips: svc.cfg.snat_ips.clone(),
                ports: svc.cfg.snat_ports.clone(),
                source_rate: svc.cfg.source_rate,
                source_burst: svc.cfg.source_burst,
            }),
            Forwarding::Dsr | Forwarding::Ipip | Forwarding::Gue => None,
        },
        tunnel: match svc.cfg.forwarding {
            Forwarding::Ipip => Some(Tunnel::Ipip),
            Forwarding::Gue => Some(Tunnel::Gue),
            Forwarding::Nat | Forwarding::Dsr => None,
        },
        // `outcome.roles` follows the input order, which is `svc.servers`' order.
        backends: svc
            .servers
            .values()
            .zip(&outcome.roles)
            .map(|(s, &(addr, role))| {
                debug_assert_eq!(s.addr, addr, "membership keeps the input order");
                DesiredBackend {
                    addr: s.addr,
                    weight: s.weight,
                    mac: macs.get(&s.addr.ip()).copied(),
                    role,
                }
            })
            // Removed from the config: out of the home table (weight 0), flows kept.
            .chain(svc.departing.keys().map(|&addr| DesiredBackend {
                addr,
                weight: 0,
                mac: macs.get(&addr.ip()).copied(),
                role: crate::publish::Role::Sticky,
            }))
            .collect(),
        maglev_size: svc.cfg.maglev_size,
    }
}
