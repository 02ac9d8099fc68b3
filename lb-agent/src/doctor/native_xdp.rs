//! Whether native XDP can carry lb's traffic on an interface: judged from the XDP
//! features the kernel reports for it (netdev family, kernel 6.3 and later), else from
//! the list of mainline drivers known to have native XDP. `doctor` reports it and
//! `xdp_mode = "auto"` follows it.

use crate::netlink::{XdpFeatures, query_xdp_features};

use super::ethtool;

/// Drivers with native (driver-mode) XDP in mainline Linux, by the name `ethtool -i`
/// gives: what is known where the kernel does not report XDP features.
pub const NATIVE_XDP_DRIVERS: &[&str] = &[
    "am65-cpsw-nuss",
    "atlantic",
    "bnxt_en",
    "bonding",
    "cpsw",
    "ena",
    "fec",
    "fsl_dpaa2_eth",
    "fsl_enetc",
    "fsl_enetc_vf",
    "gve",
    "hv_netvsc",
    "i40e",
    "ice",
    "igb",
    "igc",
    "ionic",
    "ixgbe",
    "ixgbevf",
    "lan966x-switch",
    "mana",
    "mlx4_en",
    "mlx5_core",
    "mtk_soc_eth",
    "mvneta",
    "mvpp2",
    "netdevsim",
    "netsec",
    "nfp",
    "nicvf",
    "qede",
    "rvu_nicpf",
    "rvu_nicvf",
    "sfc",
    "st_gmac",
    "tsnep",
    "tun",
    "veth",
    "virtio_net",
    "vmxnet3",
    "vif",
];

/// What native XDP does on an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeXdp {
    /// The kernel reports the features lb's `XDP_TX` needs.
    Delivers {
        driver: String,
        features: XdpFeatures,
    },
    /// Native XDP cannot forward here; the text names the missing feature and what to do.
    CannotDeliver { driver: String, why: String },
    /// The kernel reports no features (before 6.3): whether the driver is on the list.
    Listed { driver: String, known: bool },
    /// Neither the features nor the driver could be read.
    Unknown,
}

/// Judges native XDP on interface `name` (index `ifindex`).
pub fn judge(name: &str, ifindex: u32) -> NativeXdp {
    let driver = driver(name).unwrap_or_default();
    match query_xdp_features(ifindex) {
        Ok(Some(features)) => from_features(name, driver, features),
        _ if driver.is_empty() => NativeXdp::Unknown,
        _ => NativeXdp::Listed {
            known: NATIVE_XDP_DRIVERS.contains(&driver.as_str()),
            driver,
        },
    }
}

/// The judgement from the kernel's features: lb's program returns `XDP_TX`, which
/// needs `basic`; on a veth, `XDP_TX` hands the frame to the peer, which takes it only
/// when it can receive XDP frames itself (the kernel then reports `ndo-xmit` here).
pub fn from_features(name: &str, driver: String, features: XdpFeatures) -> NativeXdp {
    if !features.has(XdpFeatures::BASIC) {
        let why = format!(
            "the kernel reports no native XDP for {name} (driver {}, XDP features: {}): \
             lb's XDP_TX needs `basic`",
            if driver.is_empty() {
                "unknown"
            } else {
                &driver
            },
            features.names()
        );
        return NativeXdp::CannotDeliver { driver, why };
    }
    if driver == "veth" && !features.has(XdpFeatures::NDO_XMIT) {
        let why = format!(
            "{name} is a veth whose peer takes no XDP frames (XDP features: {}, no \
             `ndo-xmit`): in native mode the program's XDP_TX hands each frame to the peer, \
             which drops it while lb counts it as forwarded. Attach an XDP program to the \
             peer (any that passes) or turn GRO on there (`ethtool -K PEER gro on`)",
            features.names()
        );
        return NativeXdp::CannotDeliver { driver, why };
    }
    NativeXdp::Delivers { driver, features }
}

/// The driver's name as `ethtool -i` shows it, else from sysfs.
pub fn driver(name: &str) -> Option<String> {
    ethtool::driver(name).ok().or_else(|| {
        let link = std::fs::read_link(format!("/sys/class/net/{name}/device/driver")).ok()?;
        Some(link.file_name()?.to_string_lossy().into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdp_tx_needs_basic_and_on_veth_a_peer_that_takes_xdp_frames() {
        let basic = XdpFeatures(XdpFeatures::BASIC | XdpFeatures::REDIRECT | XdpFeatures::RX_SG);
        let veth = from_features("eth0", "veth".into(), basic);
        let NativeXdp::CannotDeliver { why, .. } = veth else {
            panic!("a veth without ndo-xmit cannot deliver: {veth:?}");
        };
        assert!(
            why.contains("no `ndo-xmit`") && why.contains("peer"),
            "{why}"
        );
        let peered = XdpFeatures(basic.0 | XdpFeatures::NDO_XMIT);
        assert!(matches!(
            from_features("eth0", "veth".into(), peered),
            NativeXdp::Delivers { .. }
        ));
        assert!(matches!(
            from_features("eth0", "ice".into(), basic),
            NativeXdp::Delivers { .. }
        ));
        let NativeXdp::CannotDeliver { why, .. } =
            from_features("eth0", "e1000e".into(), XdpFeatures(0))
        else {
            panic!("no basic, no native XDP");
        };
        assert!(
            why.contains("needs `basic`") && why.contains("features: none"),
            "{why}"
        );
    }
}
