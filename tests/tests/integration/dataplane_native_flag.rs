//! The mode flag the program reads (`CONFIG_F_NATIVE` in `LB_CONFIG`) follows the mode
//! the attach got (root, a namespace of its own): `auto` on an interface whose driver has
//! no native XDP (`ifb`) falls back to generic and clears it, so the program leaves
//! partial checksums to the kernel; `auto` on a veth attaches natively and sets it;
//! `generic` never sets it.

use lb_agent::dataplane::{AttachMode, BpfDataplane, DataplaneLifecycle};
use lb_common::maps::CONFIG_F_NATIVE;
use lb_tests::net::{names::unique_tag, netns::NetNs};

fn native_flag_after(ns: &NetNs, interface: &str, mode: AttachMode) -> bool {
    ns.run(|| {
        let mut dp = BpfDataplane::load().expect("loading the balancer");
        dp.attach(interface, mode, None)
            .unwrap_or_else(|e| panic!("attaching to {interface} ({}): {e}", mode.name()));
        // The program stays attached until the namespace goes, with its interfaces.
        let flags = dp.dataplane_config().expect("reading LB_CONFIG").flags;
        flags & CONFIG_F_NATIVE != 0
    })
    .expect("entering the namespace")
}

#[test]
fn the_native_flag_follows_the_mode_the_attach_got() {
    let ns = NetNs::create(&format!("{}nf", unique_tag())).expect("a namespace");
    ns.ip_batch(&[
        "link add ifb0 type ifb".to_owned(),
        "link set ifb0 up".to_owned(),
        "link add v0 type veth peer name v1".to_owned(),
        "link set v0 up".to_owned(),
        "link set v1 up".to_owned(),
    ])
    .expect("an ifb and a veth pair");
    assert!(
        !native_flag_after(&ns, "ifb0", AttachMode::Auto),
        "auto on ifb falls back to generic: the flag is cleared"
    );
    assert!(
        native_flag_after(&ns, "v0", AttachMode::Auto),
        "auto on veth attaches natively: the flag is set"
    );
    assert!(
        !native_flag_after(&ns, "v1", AttachMode::Generic),
        "generic: the flag stays clear"
    );
}
