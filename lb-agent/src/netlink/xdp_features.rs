//! What XDP an interface's driver offers, as the kernel reports it (since 6.3) over the
//! netdev generic netlink family: `NETDEV_CMD_DEV_GET`, attribute
//! `NETDEV_A_DEV_XDP_FEATURES` (`enum netdev_xdp_act` of `linux/netdev.h`).

use super::{
    NetlinkError,
    generic::{self, GenericMessage},
};

const NETDEV_FAMILY: &str = "netdev";
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;

/// The flags of `enum netdev_xdp_act`, with the names `ynl` and the kernel's
/// documentation give them.
const FEATURES: [(u64, &str); 7] = [
    (XdpFeatures::BASIC, "basic"),
    (XdpFeatures::REDIRECT, "redirect"),
    (XdpFeatures::NDO_XMIT, "ndo-xmit"),
    (1 << 3, "xsk-zerocopy"),
    (1 << 4, "hw-offload"),
    (XdpFeatures::RX_SG, "rx-sg"),
    (1 << 6, "ndo-xmit-sg"),
];

/// An interface's XDP features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpFeatures(pub u64);

impl XdpFeatures {
    /// Native XDP with `XDP_ABORTED`, `XDP_DROP`, `XDP_PASS` and `XDP_TX`.
    pub const BASIC: u64 = 1 << 0;
    /// `XDP_REDIRECT` from this interface.
    pub const REDIRECT: u64 = 1 << 1;
    /// Frames can be sent out of this interface from XDP (`ndo_xdp_xmit`); on veth
    /// also what its own `XDP_TX` needs, since that delivers to the peer.
    pub const NDO_XMIT: u64 = 1 << 2;
    /// Frames larger than a page reach the program in several buffers (jumbo frames).
    pub const RX_SG: u64 = 1 << 5;

    pub fn has(self, flag: u64) -> bool {
        self.0 & flag == flag
    }

    /// The names of the flags set, in the kernel's order (`none` without any).
    pub fn names(self) -> String {
        let names: Vec<&str> = FEATURES
            .iter()
            .filter(|(bit, _)| self.has(*bit))
            .map(|(_, name)| *name)
            .collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    }
}

/// The XDP features of interface `ifindex`; `None` on a kernel without the netdev
/// family (before 6.3).
pub fn query_xdp_features(ifindex: u32) -> Result<Option<XdpFeatures>, NetlinkError> {
    let Some(family) = generic::family_id(NETDEV_FAMILY)? else {
        return Ok(None);
    };
    let ask = GenericMessage {
        family,
        command: NETDEV_CMD_DEV_GET,
        version: 1,
        attributes: vec![(NETDEV_A_DEV_IFINDEX, ifindex.to_ne_bytes().to_vec())],
    };
    let answers = generic::request(ask, 0)?;
    let value = answers
        .iter()
        .find_map(|m| m.attribute(NETDEV_A_DEV_XDP_FEATURES))
        .ok_or_else(|| {
            NetlinkError::Decode(format!("no XDP features in the answer for index {ifindex}"))
        })?;
    let bits = <[u8; 8]>::try_from(value)
        .map(u64::from_ne_bytes)
        .map_err(|_| NetlinkError::Decode(format!("XDP features of {} bytes", value.len())))?;
    Ok(Some(XdpFeatures(bits)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_reports_no_xdp_feature_and_a_missing_index_is_refused() {
        let lo = crate::netlink::link_index("lo").expect("lo");
        let features = query_xdp_features(lo)
            .expect("netdev family")
            .expect("6.3+");
        assert_eq!(features.names(), "none");
        let err = query_xdp_features(i32::MAX as u32).unwrap_err();
        assert_eq!(err.errno(), Some(libc::ENODEV), "{err}");
    }

    #[test]
    fn names_follow_the_kernels_order() {
        let f = XdpFeatures(XdpFeatures::RX_SG | XdpFeatures::BASIC | XdpFeatures::NDO_XMIT);
        assert_eq!(f.names(), "basic, ndo-xmit, rx-sg");
        assert!(f.has(XdpFeatures::BASIC) && !f.has(XdpFeatures::REDIRECT));
    }
}
