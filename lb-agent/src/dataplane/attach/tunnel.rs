//! What tunnel forwarding needs from the interface, written into `LB_CONFIG` at every
//! attach: its MTU (a packet that no longer fits once encapsulated is answered with ICMP
//! "too big") and the outer source address of each family (`agent.tunnel_source`, else
//! the interface's first address of that family). docs/tunnel.md.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use lb_common::maps::DataplaneConfig;

/// The interface's MTU and the tunnels' outer source addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunnelConfig {
    /// 0: unknown (no check).
    pub mtu: u16,
    pub src4: Option<Ipv4Addr>,
    pub src6: Option<Ipv6Addr>,
}

impl TunnelConfig {
    /// Reads `interface`'s MTU and addresses; `source` (`agent.tunnel_source`) wins for
    /// its family.
    pub fn of(interface: &str, source: Option<IpAddr>) -> io::Result<Self> {
        let mtu = crate::hwaddr::mtu(interface)?;
        let addrs = crate::host::interface_addresses(interface)?;
        Ok(Self::choose(mtu, &addrs, source))
    }

    /// The choice [`TunnelConfig::of`] makes from the interface's `addrs`: `source` for
    /// its family, else the first address of the family (IPv6: the first that is not
    /// link-local, which no router forwards).
    pub fn choose(mtu: u32, addrs: &[IpAddr], source: Option<IpAddr>) -> Self {
        let mut src4 = addrs.iter().find_map(|a| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        });
        let mut src6 = addrs.iter().find_map(|a| match a {
            IpAddr::V6(a) if !a.is_unicast_link_local() => Some(*a),
            _ => None,
        });
        match source {
            Some(IpAddr::V4(a)) => src4 = Some(a),
            Some(IpAddr::V6(a)) => src6 = Some(a),
            None => {}
        }
        TunnelConfig {
            mtu: mtu.min(u16::MAX.into()) as u16,
            src4,
            src6,
        }
    }

    /// `current` (the MAC kept) with these values.
    pub fn apply(&self, current: DataplaneConfig) -> DataplaneConfig {
        DataplaneConfig {
            mtu: self.mtu,
            tunnel_src4: self.src4.map_or(0, |a| u32::from_ne_bytes(a.octets())),
            tunnel_src6: self.src6.map_or([0; 4], |a| {
                let o = a.octets();
                std::array::from_fn(|i| {
                    u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
                })
            }),
            ..current
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_source_wins_for_its_family_only() {
        let addrs: Vec<IpAddr> = ["fe80::1", "10.0.0.2", "2001:db8::2", "10.0.0.3"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let c = TunnelConfig::choose(1500, &addrs, None);
        assert_eq!(c.src4, Some("10.0.0.2".parse().unwrap()));
        assert_eq!(
            c.src6,
            Some("2001:db8::2".parse().unwrap()),
            "not link-local"
        );
        let c = TunnelConfig::choose(9000, &addrs, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(c.src4, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(c.src6, Some("2001:db8::2".parse().unwrap()));
        assert_eq!(c.mtu, 9000);
        assert_eq!(TunnelConfig::choose(70_000, &[], None).mtu, u16::MAX);
    }

    #[test]
    fn addresses_are_written_in_wire_order() {
        let c = TunnelConfig {
            mtu: 1500,
            src4: Some("10.0.0.2".parse().unwrap()),
            src6: Some("2001:db8::2".parse().unwrap()),
        };
        let mac = [2, 0, 0, 0, 0, 1];
        let v = c.apply(DataplaneConfig {
            mac,
            ..DataplaneConfig::default()
        });
        assert_eq!(v.mac, mac, "the MAC is kept");
        assert_eq!(v.tunnel_src4.to_ne_bytes(), [10, 0, 0, 2]);
        assert_eq!(v.tunnel_src6[0].to_ne_bytes(), [0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(v.tunnel_src6[3].to_ne_bytes(), [0, 0, 0, 2]);
    }
}
