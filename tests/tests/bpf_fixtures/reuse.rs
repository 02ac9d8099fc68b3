//! One verified load serves every fixture of this binary (`Lb::load` hands a dropped
//! object out again): an object used by a fixture and recycled must be what a fresh
//! load is — every map back, the event ring empty, the tail call in place — and answer
//! a fixture exactly as a fresh load does.

use super::{passive::age_flow, prelude::*};

/// The first packet of a nat flow and a dsr SYN retransmission (an event), run as
/// fixtures that check every counter they move.
fn traffic(lb: &mut Lb) {
    let syn = to_vip(NAT4, CPORT, TCP_SYN);
    nat_forward(
        lb,
        "nat SYN",
        &syn,
        NAT4,
        &[(TX_NAT_FORWARD, 1), (FLOW_NEW, 1), (NAT_PORT_FIRST, 1)],
    );
    let dsr = to_vip(DSR4, CPORT, TCP_SYN);
    let fx = |desc, counters| Fixture {
        desc,
        input: dsr.bytes(),
        action: XDP_TX,
        output: Out::Frame(dsr_expected(&dsr, 1)),
        counters,
    };
    check(lb, fx("dsr SYN", &[(TX_DSR, 1), (FLOW_NEW, 1)]));
    age_flow(lb, &client_key(DSR4, CPORT), 1_000_000_000);
    check(
        lb,
        fx(
            "dsr SYN retransmitted an initial RTO later",
            &[(TX_DSR, 1), (FLOW_HIT, 1), (EVENTS_SENT, 1)],
        ),
    );
}

#[test]
fn a_recycled_object_is_a_fresh_load() {
    let fresh = world_in(Lb::load_sized(Lb::load().sizes()), &[DSR4, NAT4]);
    let clean: Vec<(String, u64)> = fresh
        .dirty_maps()
        .into_iter()
        .map(|(name, _)| (name, 0))
        .collect();
    drop(fresh);
    assert!(
        clean.len() >= 15,
        "every map of the object is checked: {clean:?}"
    );

    // Used as a fixture uses it, and beyond: config, decap address, tail call cleared.
    let mut lb = world(&[DSR4, NAT4]);
    traffic(&mut lb);
    lb.add_decap_addr(ip4(10, 0, 9, 9));
    lb.set_interface_mac([0x02, 0, 0, 0, 0, 0x99]);
    lb.clear_full_path();
    let dirty: Vec<String> = lb
        .dirty_maps()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, _)| name)
        .collect();
    for map in [
        "LB_BACKENDS",
        "LB_CONFIG",
        "LB_COUNTERS",
        "LB_DECAP_ADDRS",
        "LB_FLOWS",
        "LB_MAGLEV",
        "LB_NAT",
        "LB_VIP_INDEX",
    ] {
        assert!(
            dirty.iter().any(|d| d == map),
            "{map} was written: {dirty:?}"
        );
    }

    let mut lb = lb.recycled();
    assert_eq!(
        lb.dirty_maps(),
        clean,
        "every map as a fresh load leaves it"
    );
    assert!(lb.drain_events().is_empty(), "the event ring is drained");
    // The same fixture passes again, every counter as on a fresh load (the tail call is
    // back: a nat SYN needs the full path).
    let mut lb = world_in(lb, &[DSR4, NAT4]);
    traffic(&mut lb);
    assert_eq!(lb.drain_events().len(), 1, "one retransmission event");
}
