//! Tunnel services in generic mode on a veth: the peer hands over the TSO packets of
//! senders on the same host whole, longer than the MTU, which XDP cannot encapsulate
//! (docs/tunnel.md, "Offloads"). `doctor` reports it; `run` logs it once attached.

use crate::config::{Config, XdpMode};

use super::{Finding, native_xdp};

/// The check's name.
pub const CHECK: &str = "merged segments";

/// Drivers whose peer hands over what senders on the same host built, whole.
const HANDS_OVER_WHOLE: &[&str] = &["veth"];

/// Whether `cfg` has a service that forwards through a tunnel.
pub fn has_tunnels(cfg: &Config) -> bool {
    cfg.services.iter().any(|s| s.forwarding.is_tunnel())
}

/// The finding for `interface` (driver `driver`) in `mode` with or without tunnel
/// services; `None` when it does not apply: native mode sees wire-sized frames (a veth
/// whose peer runs native XDP segments before handing over), and on a NIC generic mode
/// sees no merged segments (the kernel turns LRO and hardware GRO off for a generic
/// program and skips GRO on its interface).
pub fn finding(
    interface: &str,
    driver: Option<&str>,
    mode: XdpMode,
    tunnels: bool,
) -> Option<Finding> {
    let driver = driver.filter(|d| HANDS_OVER_WHOLE.contains(d))?;
    (mode == XdpMode::Generic && tunnels).then(|| {
        Finding::warning(
            CHECK,
            format!(
                "tunnel services in generic mode on `{interface}` ({driver}): its peer hands \
                 over the TSO packets of senders on the same host whole (up to 64 KiB), which \
                 XDP cannot encapsulate: they are dropped (`drop_tunnel`) and uploads from \
                 such senders stall; turn TX checksum offload off on the peer (`ethtool -K \
                 PEER tx off`, which takes TSO with it: the host then segments before the \
                 peer), or use native mode (docs/tunnel.md, \"Offloads\")"
            ),
        )
    })
}

/// [`finding`] for the interface as it is now.
pub fn check(interface: &str, mode: XdpMode, tunnels: bool) -> Option<Finding> {
    finding(
        interface,
        native_xdp::driver(interface).as_deref(),
        mode,
        tunnels,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Level;

    #[test]
    fn only_tunnel_services_in_generic_mode_on_a_veth() {
        let warned = finding("eth0", Some("veth"), XdpMode::Generic, true).expect("a finding");
        assert_eq!(warned.level, Level::Warning);
        assert!(
            warned.text.contains("ethtool -K PEER tx off"),
            "{}",
            warned.text
        );
        for (driver, mode, tunnels) in [
            (Some("veth"), XdpMode::Generic, false),
            (Some("veth"), XdpMode::Native, true),
            (Some("veth"), XdpMode::Auto, true),
            (Some("mlx5_core"), XdpMode::Generic, true),
            (None, XdpMode::Generic, true),
        ] {
            assert_eq!(
                finding("eth0", driver, mode, tunnels),
                None,
                "{driver:?} {mode:?} tunnels {tunnels}"
            );
        }
    }
}
