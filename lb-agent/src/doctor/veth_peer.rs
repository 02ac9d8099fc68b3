//! A veth's peer and its TX checksum offload, on a veth where native mode forwards. With
//! the offload on (veth's default) the peer hands over what the host sends or merges
//! (GRO) with partial checksums (the pseudo-header's sum only), which the receiver was to
//! complete; native mode's `XDP_TX` frames lose that promise, so the program completes
//! them before it forwards (docs/internals/fast-path.md, "Partial checksums"). With the
//! offload off the host completes every checksum before the peer hands packets over.
//! Either way forwarding delivers: the finding says which (an `ok`), so that the
//! operator knows whether `lb_checksums_completed_total` is to move.

use crate::{
    config::XdpMode,
    netlink::{LinkPeer, query_link_peer},
};

use super::{Finding, ethtool, native_xdp::NativeXdp};

const CHECK: &str = "veth peer";

/// What the program does about partial checksums on a veth, said after each finding.
const COMPLETED: &str = "native mode completes the partial checksums such a peer hands over \
                         (lb_checksums_completed_total)";

/// The finding for interface `name` (index `ifindex`) judged `judged`, run in `mode`;
/// `None` unless it is a veth on which native mode forwards.
pub fn check(name: &str, ifindex: u32, judged: &NativeXdp, mode: XdpMode) -> Option<Finding> {
    let veth = match judged {
        NativeXdp::Delivers { driver, .. } | NativeXdp::Listed { driver, .. } => driver == "veth",
        NativeXdp::CannotDeliver { .. } | NativeXdp::Unknown => false,
    };
    if !veth || mode == XdpMode::Generic {
        return None;
    }
    let peer = match query_link_peer(ifindex) {
        Ok(LinkPeer::Here(index)) => name_of(index),
        Ok(LinkPeer::Elsewhere) => None,
        Ok(LinkPeer::None) => return None,
        Err(err) => {
            return Some(Finding::ok(
                CHECK,
                format!(
                    "cannot read {name}'s peer ({err}); if it has TX checksum offload on, {COMPLETED}"
                ),
            ));
        }
    };
    let Some(peer) = peer else {
        return Some(Finding::ok(
            CHECK,
            format!(
                "{name}'s peer is in another network namespace, where doctor cannot read its \
                 TX checksum offload; if it is on (veth's default), {COMPLETED}"
            ),
        ));
    };
    Some(Finding::ok(
        CHECK,
        match ethtool::tx_checksum(&peer) {
            Ok(false) => format!("{peer} sends full checksums (TX checksum offload off)"),
            Ok(true) => format!(
                "{peer}, {name}'s peer, has TX checksum offload on (veth's default): {COMPLETED}"
            ),
            Err(err) => format!(
                "cannot read {peer}'s TX checksum offload ({err}); if it is on, {COMPLETED}"
            ),
        },
    ))
}

/// The name of interface `index` in this network namespace.
fn name_of(index: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` holds IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success the kernel wrote a NUL-terminated name into `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use crate::netlink::XdpFeatures;

    use super::*;

    #[test]
    fn only_a_veth_that_forwards_in_native_mode_is_looked_at() {
        let ice = NativeXdp::Listed {
            driver: "ice".into(),
            known: true,
        };
        assert_eq!(check("eth0", 1, &ice, XdpMode::Native), None);
        let veth = NativeXdp::Delivers {
            driver: "veth".into(),
            features: XdpFeatures(XdpFeatures::BASIC | XdpFeatures::NDO_XMIT),
        };
        assert_eq!(check("eth0", 1, &veth, XdpMode::Generic), None);
        let no_peer_xdp = NativeXdp::CannotDeliver {
            driver: "veth".into(),
            why: String::new(),
        };
        assert_eq!(check("eth0", 1, &no_peer_xdp, XdpMode::Auto), None);
    }
}
