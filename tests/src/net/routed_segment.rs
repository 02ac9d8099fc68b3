//! A second segment behind two routers, for the neighbour scenarios: routers `r1` and
//! `r2` each have `eth0` on the topology's bridge (10.77.k.51 and .52) and `eth1` on a
//! second bridge `br1` (10.79.k.1 and .2), where the backend `far` (10.79.k.10) lives.
//! The lb reaches 10.79.k.0/24 through a route the scenario switches from one router to
//! the other; `far` answers through r2 whatever the lb's route. Dropping it removes the
//! namespaces and links it made.

use std::net::{IpAddr, Ipv4Addr};

use crate::{
    net::{
        link::{self, Link, Mac, VethEnd},
        names,
        netns::NetNs,
        switch,
        topology::{BRIDGE, HOST_IF, Topology},
    },
    util::error::Error,
};

/// The second bridge in the switch namespace.
pub const FAR_BRIDGE: &str = "br1";
/// The far backend's role name.
pub const FAR: &str = "far";

/// The routers, the far backend and their links.
#[derive(Debug)]
pub struct RoutedSegment {
    // Fields drop in order: links, the bridge, then the namespaces.
    links: Vec<Link>,
    bridge: Option<Link>,
    pub r1: NetNs,
    pub r2: NetNs,
    pub far: NetNs,
    /// The routers' addresses on the lb's segment.
    pub gw1: Ipv4Addr,
    pub gw2: Ipv4Addr,
    /// r2's MAC on the lb's segment.
    pub gw2_mac: Mac,
    /// The far backend's address.
    pub far_addr: Ipv4Addr,
    /// The segment, `10.79.k.0/24`.
    pub prefix: String,
}

impl RoutedSegment {
    /// Builds the segment next to `topo` (subnet k of the topology) and routes the lb
    /// to it through r1.
    pub fn build(topo: &Topology) -> Result<Self, Error> {
        let k = topo.subnet();
        let tag = names::unique_tag();
        let switch_ns = topo.switch();
        let bridge = link::bridge(switch_ns, FAR_BRIDGE)?;
        let r1 = NetNs::create(&format!("{tag}-r1"))?;
        let r2 = NetNs::create(&format!("{tag}-r2"))?;
        let far = NetNs::create(&format!("{tag}-far"))?;
        let mut seg = RoutedSegment {
            links: Vec::new(),
            bridge: Some(bridge),
            r1,
            r2,
            far,
            gw1: Ipv4Addr::new(10, 77, k, 51),
            gw2: Ipv4Addr::new(10, 77, k, 52),
            gw2_mac: Mac([0x02, 0x79, k, 0, 0, 52]),
            far_addr: Ipv4Addr::new(10, 79, k, 10),
            prefix: format!("10.79.{k}.0/24"),
        };
        let mac = |seg: u8, i: u8| Mac([0x02, 0x79, k, 0, seg, i]);
        // (namespace, its interface, switch port, bridge, MAC)
        let ends = [
            (seg.r1.clone(), HOST_IF, "p-r1", BRIDGE, mac(0, 51)),
            (seg.r1.clone(), "eth1", "q-r1", FAR_BRIDGE, mac(1, 1)),
            (seg.r2.clone(), HOST_IF, "p-r2", BRIDGE, mac(0, 52)),
            (seg.r2.clone(), "eth1", "q-r2", FAR_BRIDGE, mac(1, 2)),
            (seg.far.clone(), HOST_IF, "q-far", FAR_BRIDGE, mac(1, 10)),
        ];
        for (i, (ns, ifname, port, br, m)) in ends.iter().enumerate() {
            seg.links.push(switch::plug(
                switch_ns,
                br,
                port,
                Mac([0x02, 0x7a, k, 0, 0, i as u8]),
                VethEnd {
                    ns,
                    name: ifname,
                    mac: *m,
                },
            )?);
            ns.ip_batch(&[format!("link set {ifname} up")])?;
            link::set_tx_checksum(ns, ifname, false)?;
        }
        let (gw1, gw2, far_addr) = (seg.gw1, seg.gw2, seg.far_addr);
        seg.r1.ip_batch(&[
            format!("addr add {gw1}/24 dev {HOST_IF}"),
            format!("addr add 10.79.{k}.1/24 dev eth1"),
        ])?;
        seg.r2.ip_batch(&[
            format!("addr add {gw2}/24 dev {HOST_IF}"),
            format!("addr add 10.79.{k}.2/24 dev eth1"),
        ])?;
        seg.far.ip_batch(&[
            format!("addr add {far_addr}/24 dev {HOST_IF}"),
            format!("route add default via 10.79.{k}.2"),
        ])?;
        for r in [&seg.r1, &seg.r2] {
            r.sysctl("net.ipv4.ip_forward", "1")?;
            r.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
        }
        seg.route_via(&topo.lb().ns, gw1)?;
        Ok(seg)
    }

    /// Points `ns`'s route to the segment at `gw` (`ip route replace`).
    pub fn route_via(&self, ns: &NetNs, gw: Ipv4Addr) -> Result<(), Error> {
        ns.ip(&[
            "route",
            "replace",
            &self.prefix,
            "via",
            &gw.to_string(),
            "dev",
            HOST_IF,
        ])
        .map(drop)
    }

    /// Stops `router` forwarding: frames still sent to it go nowhere.
    pub fn stop_forwarding(&self, router: &NetNs) -> Result<(), Error> {
        router.sysctl("net.ipv4.ip_forward", "0")
    }

    /// The far backend's address as an `IpAddr`.
    pub fn far_ip(&self) -> IpAddr {
        IpAddr::V4(self.far_addr)
    }
}

impl Drop for RoutedSegment {
    fn drop(&mut self) {
        self.links.clear();
        self.bridge.take();
    }
}
