//! dsr backends off the attached interface's segment. In dsr the program only rewrites
//! the destination MAC and sends the frame back out of the interface, so a backend
//! reached through a router (the router sends the frame, addressed to the VIP, straight
//! back until its TTL runs out) or out of another interface never receives it. One
//! check for `doctor` (a blocker), `run` and `reload` (both refuse the config).

use std::{collections::HashMap, fmt, net::IpAddr};

use crate::{
    config::{Config, Forwarding, ServerAddress},
    neighbour::rtnl,
};

/// A dsr backend the program cannot reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffSegment {
    pub service: String,
    pub backend: IpAddr,
    pub interface: String,
    pub route: Route,
}

/// How this host routes to the backend instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Through a router.
    Gateway(IpAddr),
    /// Out of another interface.
    OtherInterface,
}

impl fmt::Display for OffSegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            service,
            backend,
            interface,
            route,
        } = self;
        match route {
            Route::Gateway(gw) => write!(
                f,
                "service {service:?}: dsr backend {backend} is reached through the router \
                 {gw}: dsr sends the client's packet, addressed to the VIP, to the backend's MAC \
                 on {interface}'s segment, and the router sends it back until its TTL runs out; \
                 put the backend on that segment or use nat"
            ),
            Route::OtherInterface => write!(
                f,
                "service {service:?}: dsr backend {backend} is on another interface's segment \
                 than {interface}: dsr sends frames back out of {interface} only; put it on \
                 that segment or use nat"
            ),
        }
    }
}

/// Every dsr backend given as an address that this host routes through a router or out
/// of another interface than `interface`. Backends that are this host's own addresses,
/// and those without a route (the lookup fails), are not judged here.
pub fn off_segment(cfg: &Config, interface: &str) -> Vec<OffSegment> {
    let Ok(ifindex) = crate::dataplane::if_index(interface) else {
        return Vec::new();
    };
    let local = crate::host::local_addresses().unwrap_or_default();
    // One route lookup per address, however many ports and services name it.
    let mut routes: HashMap<IpAddr, Option<Route>> = HashMap::new();
    let mut out = Vec::new();
    for s in cfg
        .services
        .iter()
        .filter(|s| s.forwarding == Forwarding::Dsr)
    {
        for srv in &s.servers {
            let ServerAddress::Socket(sa) = &srv.address else {
                continue;
            };
            let ip = sa.ip();
            if local.contains(&ip) {
                continue;
            }
            let route = *routes.entry(ip).or_insert_with(|| {
                let hop = rtnl::route(ip).ok()?;
                match (hop.gateway, hop.oif) {
                    (Some(gw), _) => Some(Route::Gateway(gw)),
                    (None, Some(oif)) if oif != ifindex => Some(Route::OtherInterface),
                    _ => None,
                }
            });
            let Some(route) = route else {
                continue;
            };
            out.push(OffSegment {
                service: s.name.clone(),
                backend: ip,
                interface: interface.to_string(),
                route,
            });
        }
    }
    out
}

/// The refusal of `run` and `reload` for a config with [`off_segment`] backends.
pub fn check(cfg: &Config, interface: &str) -> Result<(), String> {
    let off = off_segment(cfg, interface);
    if off.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = off.iter().map(ToString::to_string).collect();
    Err(lines.join("; "))
}
