//! The interface: exists, whether native XDP can forward on it (and, on a veth, whether
//! the peer completes checksums), the program attached now, the MTU against what native
//! XDP takes, LRO and GRO.

use crate::{config::XdpMode, dataplane, netlink::XdpAttached};

use super::{
    Finding, Level, ethtool,
    native_xdp::{self, NativeXdp},
    veth_peer,
};

/// The check name of a missing interface (the caller skips what needs it).
pub const MISSING: &str = "interface";

/// The largest MTU most drivers take in native XDP mode with single-buffer programs
/// (a frame, its headroom and `skb_shared_info` in one 4 KiB page; mlx5, i40e, ice and
/// virtio_net refuse above about this; the exact bound is the driver's).
pub const NATIVE_XDP_MAX_MTU: u32 = 3498;

pub fn check(name: &str, mode: XdpMode) -> Vec<Finding> {
    let check = format!("interface {name}");
    let ifindex = match dataplane::if_index(name) {
        Ok(i) => i,
        Err(_) => {
            return vec![Finding::blocker(
                MISSING,
                format!(
                    "`{name}` does not exist in this network namespace (`ip link` lists them; \
                     run doctor where the agent will run, e.g. under `ip netns exec`)"
                ),
            )];
        }
    };
    let mut out = Vec::new();
    let up = read(name, "operstate").unwrap_or_default();
    out.push(Finding::ok(
        check.clone(),
        format!("exists (index {ifindex}, {up})"),
    ));
    let judged = native_xdp::judge(name, ifindex);
    out.push(native(name, &judged, mode));
    out.extend(veth_peer::check(name, ifindex, &judged, mode));
    out.push(attached(name, ifindex));
    if let Some(mtu) = read(name, "mtu").and_then(|m| m.parse().ok()) {
        out.push(mtu_finding(name, mtu, mode));
    }
    out.extend(offloads(name, mode));
    out
}

fn read(name: &str, what: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/{what}"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// What native XDP does on the interface, and what `mode` then does.
pub fn native(name: &str, judged: &NativeXdp, mode: XdpMode) -> Finding {
    let check = "xdp driver";
    match (judged, mode) {
        (NativeXdp::Unknown, _) => Finding::warning(
            check,
            format!("cannot tell `{name}`'s driver nor its XDP features: native XDP unknown"),
        ),
        (
            NativeXdp::Delivers { driver, .. }
            | NativeXdp::Listed {
                driver,
                known: true,
            },
            XdpMode::Generic,
        ) => Finding::warning(
            check,
            format!(
                "{driver} has native XDP but xdp_mode = \"generic\": the program runs after \
                 the kernel allocated an skb per packet (several times slower); use \"auto\" \
                 or \"native\""
            ),
        ),
        (NativeXdp::Delivers { driver, features }, _) => Finding::ok(
            check,
            format!(
                "{driver} has native XDP (the kernel reports: {})",
                features.names()
            ),
        ),
        (
            NativeXdp::Listed {
                driver,
                known: true,
            },
            _,
        ) => Finding::ok(
            check,
            format!("{driver} has native XDP (known driver; this kernel reports no XDP features)"),
        ),
        (
            NativeXdp::CannotDeliver { driver, .. }
            | NativeXdp::Listed {
                driver,
                known: false,
            },
            XdpMode::Generic,
        ) => Finding::ok(
            check,
            format!("{driver}: xdp_mode = \"generic\" works on every driver"),
        ),
        (NativeXdp::CannotDeliver { why, .. }, XdpMode::Auto) => Finding::warning(
            check,
            format!(
                "{why}. \"auto\" attaches in generic mode, which delivers (an skb per packet, \
                 several times slower)"
            ),
        ),
        (NativeXdp::CannotDeliver { why, .. }, XdpMode::Native) => Finding::blocker(
            check,
            format!(
                "{why}. With xdp_mode = \"native\" nothing is forwarded: fix that or use \
                 \"auto\" (generic mode here)"
            ),
        ),
        (
            NativeXdp::Listed {
                driver,
                known: false,
            },
            XdpMode::Auto,
        ) => Finding::warning(
            check,
            format!(
                "{driver} is not known to have native XDP: \"auto\" falls back to generic mode \
                 (an skb per packet, several times slower); a NIC with native XDP (ice, i40e, \
                 mlx5_core, bnxt_en, virtio_net, ...) runs lb at full speed"
            ),
        ),
        (
            NativeXdp::Listed {
                driver,
                known: false,
            },
            XdpMode::Native,
        ) => Finding::warning(
            check,
            format!(
                "{driver} is not known to have native XDP and xdp_mode = \"native\": the \
                 attach may be refused; use \"auto\" to fall back to generic"
            ),
        ),
    }
}

/// The program attached to the interface now.
fn attached(name: &str, ifindex: u32) -> Finding {
    let check = "xdp program";
    match dataplane::adopt::attached_program(ifindex, name) {
        Ok(None) => Finding::ok(check, format!("none attached to {name}")),
        Ok(Some(p)) if p.is_ours() => Finding::ok(
            check,
            format!(
                "lb's program (id {}, {}) is attached: `run` adopts it and its flows",
                p.id,
                p.mode.name()
            ),
        ),
        Ok(Some(p)) => Finding::blocker(
            check,
            format!(
                "another XDP program ({} id {}, {}) is attached to {name}: `run` will not \
                 replace it; remove it with `ip link set dev {name} {}` if it is not needed",
                p.name,
                p.id,
                p.mode.name(),
                match p.mode {
                    XdpAttached::Generic => "xdpgeneric off",
                    XdpAttached::Driver => "xdpdrv off",
                    XdpAttached::Offload => "xdpoffload off",
                    XdpAttached::Multi => "xdp off",
                }
            ),
        ),
        Err(err) => Finding::warning(check, format!("cannot read it: {err}")),
    }
}

/// The MTU against native XDP's bound.
pub fn mtu_finding(name: &str, mtu: u32, mode: XdpMode) -> Finding {
    let check = "mtu";
    if mtu <= NATIVE_XDP_MAX_MTU || mode == XdpMode::Generic {
        return Finding::ok(
            check,
            format!(
                "{mtu} (native XDP takes up to about {NATIVE_XDP_MAX_MTU}; lb adds no header: \
                 nat and dsr rewrite in place)"
            ),
        );
    }
    let level = if mode == XdpMode::Native {
        Level::Blocker
    } else {
        Level::Warning
    };
    Finding::new(
        check,
        level,
        format!(
            "{mtu} is above the about {NATIVE_XDP_MAX_MTU} bytes most drivers take in native \
             XDP in one page; larger frames come in several buffers (the driver's `rx-sg` XDP \
             feature), which lb's single-buffer program does not take: the attach is \
             refused{}; lower it (`ip link set dev {name} mtu 1500`) or accept generic mode",
            if mode == XdpMode::Auto {
                " and \"auto\" falls back to generic mode"
            } else {
                ""
            }
        ),
    )
}

fn offloads(name: &str, mode: XdpMode) -> Vec<Finding> {
    let mut out = Vec::new();
    match ethtool::lro(name) {
        Ok(true) => out.push(Finding::warning(
            "lro",
            format!(
                "on: drivers refuse native XDP while LRO merges segments{}; `ethtool -K {name} \
                 lro off`",
                if mode == XdpMode::Generic {
                    " (and in generic mode the program sees merged super-frames)"
                } else {
                    ""
                }
            ),
        )),
        Ok(false) => out.push(Finding::ok("lro", "off")),
        Err(_) => out.push(Finding::ok("lro", "not reported by the driver")),
    }
    match ethtool::gro(name) {
        Ok(true) if mode == XdpMode::Generic => out.push(Finding::ok(
            "gro",
            "on (the kernel skips GRO on an interface that runs a generic XDP program: the \
             program sees every packet)",
        )),
        Ok(true) => out.push(Finding::ok(
            "gro",
            "on (native XDP runs before GRO: the program sees every packet)",
        )),
        Ok(false) => out.push(Finding::ok("gro", "off")),
        Err(_) => out.push(Finding::ok("gro", "not reported by the driver")),
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::netlink::XdpFeatures;

    use super::*;

    #[test]
    fn native_xdp_by_judgement_and_mode() {
        let listed = |driver: &str, known| NativeXdp::Listed {
            driver: driver.into(),
            known,
        };
        assert_eq!(
            native("eth0", &listed("ice", true), XdpMode::Auto).level,
            Level::Ok
        );
        assert_eq!(
            native("eth0", &listed("e1000e", false), XdpMode::Auto).level,
            Level::Warning
        );
        assert_eq!(
            native("eth0", &listed("e1000e", false), XdpMode::Generic).level,
            Level::Ok
        );
        assert_eq!(
            native("eth0", &listed("mlx5_core", true), XdpMode::Generic).level,
            Level::Warning
        );
        let veth =
            native_xdp::from_features("eth0", "veth".into(), XdpFeatures(XdpFeatures::BASIC));
        assert_eq!(native("eth0", &veth, XdpMode::Auto).level, Level::Warning);
        assert_eq!(native("eth0", &veth, XdpMode::Native).level, Level::Blocker);
        assert_eq!(native("eth0", &veth, XdpMode::Generic).level, Level::Ok);
        assert_eq!(mtu_finding("eth0", 1500, XdpMode::Auto).level, Level::Ok);
        assert_eq!(
            mtu_finding("eth0", 9000, XdpMode::Auto).level,
            Level::Warning
        );
        assert_eq!(mtu_finding("eth0", 9000, XdpMode::Generic).level, Level::Ok);
        assert_eq!(
            mtu_finding("eth0", 9000, XdpMode::Native).level,
            Level::Blocker
        );
    }
}
