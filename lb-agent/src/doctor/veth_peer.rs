//! A veth's peer and its TX checksum offload. The peer hands over packets as the host
//! built them: with the offload on (veth's default), what the host sends or merges (GRO)
//! through the peer carries a partial checksum (the pseudo-header's sum only) that the
//! receiver was to complete. Generic mode keeps that promise (the frame leaves as an skb
//! that still says so); native mode's `XDP_TX` frames lose it, and receivers drop them as
//! corrupt. With the offload off the host completes every checksum (and segments TSO
//! packets) before the peer hands them over.

use crate::{
    config::XdpMode,
    netlink::{LinkPeer, query_link_peer},
};

use super::{Finding, ethtool, native_xdp::NativeXdp};

const CHECK: &str = "veth peer";

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
            return Some(Finding::warning(
                CHECK,
                format!("cannot read {name}'s peer: {err}. {}", remedy("PEER")),
            ));
        }
    };
    let Some(peer) = peer else {
        return Some(Finding::warning(
            CHECK,
            format!(
                "{name}'s peer is in another network namespace, where doctor cannot read its \
                 offloads. {}",
                remedy("PEER")
            ),
        ));
    };
    Some(match ethtool::tx_checksum(&peer) {
        Ok(false) => Finding::ok(
            CHECK,
            format!(
                "{peer} sends full checksums (TX checksum offload off): native mode's forwarded \
                 frames are complete"
            ),
        ),
        Ok(true) => Finding::warning(
            CHECK,
            format!(
                "{peer}, {name}'s peer, has TX checksum offload on. {}",
                remedy(&peer)
            ),
        ),
        Err(err) => Finding::warning(
            CHECK,
            format!(
                "cannot read {peer}'s TX checksum offload: {err}. {}",
                remedy(&peer)
            ),
        ),
    })
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

fn remedy(peer: &str) -> String {
    format!(
        "With TX checksum offload on there (veth's default), packets the host sends or merges \
         through the peer carry partial checksums, which native mode's XDP_TX frames keep and \
         receivers drop: `ethtool -K {peer} tx off` where the peer lives (it takes TSO with \
         it), or xdp_mode = \"generic\""
    )
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
