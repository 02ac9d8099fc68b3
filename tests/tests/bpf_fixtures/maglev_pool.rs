//! Maglev tables of per-service size in the shared `LB_MAGLEV` pool: a service steers by
//! its own table (its size and place come from its VIP slot), a thousand services each
//! reach theirs, and a resize (a new pair, the VIP slot switched) keeps pinned flows and
//! sends new ones by the new table.

use super::prelude::*;

/// A table of `size` slots all on `rest`, but for the slot `key` hashes to: `one`.
fn table_with_one_slot(size: u32, key: &FlowKey, one: u32, rest: u32) -> Vec<u32> {
    let slot = lb_common::hash::flow_hash(key, lb_common::hash::SEED_MAGLEV) % size;
    let mut table = vec![rest; size as usize];
    table[slot as usize] = one;
    table
}

#[test]
fn a_service_with_a_small_table_steers_by_its_own_table() {
    let mut lb = world(&[DSR4_UDP]);
    lb.set_backend(10, backend(ip4(10, 0, 1, 20), 80, 10, DSR4));
    lb.set_backend(11, backend(ip4(10, 0, 1, 21), 80, 11, DSR4));
    let key = client_key(DSR4, CPORT);
    // Backend 10 holds only the slot `flow_hash % 4099`: a program indexing by any other
    // size (or another service's table) lands on 11 (or elsewhere).
    lb.set_maglev(DSR4, &table_with_one_slot(4099, &key, 10, 11));
    let (base, size) = lb.maglev_pair(DSR4).expect("a pair");
    assert_eq!(size, 4099);
    let slot = lb.service_meta(svc(DSR4).vip, svc(DSR4).port, IPPROTO_TCP);
    assert_eq!(
        slot.map(|m| (m.maglev_base, m.maglev_size)),
        Some((base, size)),
        "the VIP slot names the pair"
    );
    let (other_base, other_size) = lb.maglev_pair(DSR4_UDP).expect("a pair");
    assert_eq!(other_size, MAGLEV_RING_SIZE);
    assert_ne!(base, other_base);
    let syn = to_vip(DSR4, CPORT, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "the flow lands on the one slot of the 4,099-slot table holding backend 10",
            input: syn.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&syn, 10)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
    // The neighbour in the pool still steers by its own 65,537-slot table.
    let udp = to_vip(DSR4_UDP, CPORT, 0);
    let backend_udp = svc(DSR4_UDP).backend;
    check(
        &mut lb,
        Fixture {
            desc: "the other service's table is its own",
            input: udp.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&udp, backend_udp)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
}

#[test]
fn every_one_of_a_thousand_services_reaches_its_own_table() {
    const N: u32 = 1000;
    const { assert!(N <= lb_common::MAX_SERVICES) };
    let mut lb = Lb::load();
    lb.set_interface_mac(LB_MAC);
    let vip = |i: u32| ip4(10, 60, (i / 200) as u8, (i % 200) as u8 + 1);
    let port = |i: u32| 2000 + i as u16;
    // A MAC per backend id (world's `backend_mac` repeats after 255).
    let mac = |id: u32| [0x02, 0, 0, 0x02, (id >> 8) as u8, id as u8];
    for i in 0..N {
        let id = i + 1;
        let b = backend(
            ip4(10, 61, (i / 200) as u8, (i % 200) as u8 + 1),
            port(i),
            id,
            i,
        );
        lb.set_backend(id, Backend { mac: mac(id), ..b });
        // The table first, then the slot naming it (as the agent publishes).
        lb.set_maglev(i, &vec![id; lb_common::maglev_size_for(1) as usize]);
        let meta = ServiceMeta {
            service_id: i,
            ..ServiceMeta::default()
        };
        lb.add_service(vip(i), port(i), IPPROTO_TCP, meta);
    }
    let mut bases: Vec<u32> = (0..N).map(|i| lb.maglev_pair(i).unwrap().0).collect();
    bases.sort_unstable();
    bases.dedup();
    assert_eq!(bases.len(), N as usize, "a pair each");
    for i in 0..N {
        let syn = Frame::tcp(client4(), CPORT, vip(i), port(i), TCP_SYN).macs(CLIENT_MAC, LB_MAC);
        check(
            &mut lb,
            Fixture {
                desc: "a SYN to one of a thousand services goes to that service's backend",
                input: syn.bytes(),
                action: XDP_TX,
                output: Out::Frame(syn.clone().macs(LB_MAC, mac(i + 1)).bytes()),
                counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
            },
        );
        assert_eq!(lb.service_stats(i).new_flows, 1, "service {i} counted");
    }
}

#[test]
fn a_resize_keeps_pinned_flows_and_sends_new_ones_by_the_new_table() {
    let mut lb = world(&[]);
    lb.set_backend(10, backend(ip4(10, 0, 1, 20), 80, 10, DSR4));
    lb.set_backend(11, backend(ip4(10, 0, 1, 21), 80, 11, DSR4));
    lb.set_maglev(DSR4, &vec![10; 4099]);
    let before = lb.maglev_pair(DSR4).unwrap();
    let old = to_vip(DSR4, CPORT, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "a flow opened on the 4,099-slot table",
            input: old.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&old, 10)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
    // The service grows past 40 backends: a 16,411-slot table in a new pair, the VIP
    // slot switched to it. (Here it names only backend 11, to tell the tables apart.)
    lb.set_maglev(DSR4, &vec![11; 16411]);
    let after = lb.maglev_pair(DSR4).unwrap();
    assert_eq!(after.1, 16411);
    assert_ne!(after.0, before.0, "a new pair");
    let meta = lb
        .service_meta(svc(DSR4).vip, svc(DSR4).port, IPPROTO_TCP)
        .unwrap();
    assert_eq!((meta.maglev_base, meta.maglev_size), after);
    let ack = to_vip(DSR4, CPORT, TCP_ACK);
    check(
        &mut lb,
        Fixture {
            desc: "the established flow keeps its backend across the resize",
            input: ack.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&ack, 10)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
    let new = to_vip(DSR4, CPORT + 1, TCP_SYN);
    check(
        &mut lb,
        Fixture {
            desc: "a new flow goes by the new table",
            input: new.bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&new, 11)),
            counters: &[(TX_DSR, 1), (FLOW_NEW, 1)],
        },
    );
    // And back down: the freed run is reused, flows still pinned.
    lb.set_maglev(DSR4, &vec![10; 4099]);
    assert_eq!(lb.maglev_pair(DSR4).unwrap().1, 4099);
    check(
        &mut lb,
        Fixture {
            desc: "the second flow stays on 11 after the table shrinks",
            input: to_vip(DSR4, CPORT + 1, TCP_ACK).bytes(),
            action: XDP_TX,
            output: Out::Frame(dsr_expected(&to_vip(DSR4, CPORT + 1, TCP_ACK), 11)),
            counters: &[(TX_DSR, 1), (FLOW_HIT, 1)],
        },
    );
}
