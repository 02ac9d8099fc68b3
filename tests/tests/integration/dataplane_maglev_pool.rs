//! The Maglev pool on real maps (root): the data plane gives each service a pair of
//! tables of its size, moves a resized service to a new pair, and a data plane that
//! adopts the pinned maps (an agent restart) recovers the allocation from the live VIP
//! slots, so a new service never gets the blocks of a live table.

use aya::maps::MapData;
use lb_agent::dataplane::{
    BpfDataplane, Dataplane,
    adopt::{ADOPTED_MAPS, AdoptedMaps, pin::PinDir},
    tables::maglev_pool::pair_blocks,
};
use lb_common::{
    FAMILY_V4, IPPROTO_TCP, MAGLEV_BLOCKS,
    maps::{ServiceMeta, VipKey},
};
use lb_tests::agent::bpffs::PrivateBpffs;

fn vip(sid: u32) -> VipKey {
    VipKey {
        addr: [u32::from_ne_bytes([10, 70, 0, sid as u8 + 1]), 0, 0, 0],
        port: 80u16.to_be(),
        proto: IPPROTO_TCP,
        family: FAMILY_V4,
    }
}

fn meta(sid: u32) -> ServiceMeta {
    ServiceMeta {
        service_id: sid,
        ..ServiceMeta::default()
    }
}

/// Publishes service `sid` as the agent does: the table, then the VIP slot.
fn publish(dp: &mut BpfDataplane, sid: u32, size: u32, backend: u32) {
    dp.publish_table(sid, &vec![backend; size as usize])
        .expect("publishing a table");
    dp.upsert_service(&vip(sid), &meta(sid))
        .expect("publishing the service");
}

fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    let end = |p: (u32, u32)| p.0 + pair_blocks(p.1);
    a.0 < end(b) && b.0 < end(a)
}

#[test]
fn pairs_follow_sizes_and_survive_an_adopting_restart() {
    let fs = PrivateBpffs::mount("maglev-pool").expect("a private bpffs");
    let pins = PinDir::prepare(&fs.pins().join("lb")).expect("a pin directory");
    let dir = pins.path().to_path_buf();
    let mut first = BpfDataplane::load_with(None, Some(pins)).expect("loading");
    publish(&mut first, 0, 4099, 1);
    publish(&mut first, 1, 16411, 2);
    publish(&mut first, 2, 4099, 3);
    let before = first.maglev_pair(1).expect("a pair");
    assert_eq!(before.1, 16411);
    // Service 1 grows: a new pair of 65,537-slot tables; its slot names it.
    publish(&mut first, 1, 65537, 4);
    let after = first.maglev_pair(1).expect("a pair");
    assert_eq!(after.1, 65537);
    assert!(
        !overlaps(before, after),
        "a new pair while the old one may be read"
    );
    assert_eq!(first.live_table(1), vec![4; 65537]);
    // Same size again: in place.
    publish(&mut first, 1, 65537, 5);
    assert_eq!(first.maglev_pair(1), Some(after));
    assert_eq!(first.live_table(1), vec![5; 65537]);
    // Services that come and go: their slots must be cleared in both VIP tables (the
    // index writes only the slots that change).
    for s in 10..20 {
        publish(&mut first, s, 4099, 9);
    }
    for s in 10..20 {
        first.remove_service(&vip(s), s).expect("removing");
    }
    let state = first.published_state().expect("reading back");
    assert!(
        state
            .services
            .iter()
            .all(|(_, m)| (m.maglev_base, m.maglev_size) == (0, 0)),
        "the publisher sees metas without the data plane's own allocation"
    );

    // A restart: a second data plane adopts the pinned maps.
    let pairs: Vec<(u32, u32)> = (0..3).map(|s| first.maglev_pair(s).unwrap()).collect();
    let maps = ADOPTED_MAPS
        .iter()
        .map(|&name| {
            let map = MapData::from_pin(dir.join(name))
                .unwrap_or_else(|e| panic!("opening pinned {name}: {e}"));
            (name, map)
        })
        .collect();
    let adopted = AdoptedMaps {
        maps,
        ..AdoptedMaps::default()
    };
    let mut second = BpfDataplane::load_with(Some(&adopted), None).expect("adopting");
    drop(first);
    let found: Vec<u32> = second
        .published_state()
        .unwrap()
        .services
        .iter()
        .map(|(_, m)| m.service_id)
        .collect();
    assert_eq!(
        found.len(),
        3,
        "the live VIP table holds exactly 0..3: {found:?}"
    );
    let tables = [vec![1; 4099], vec![5; 65537], vec![3; 4099]];
    for (s, pair) in pairs.iter().enumerate() {
        assert_eq!(second.maglev_pair(s as u32), Some(*pair), "service {s}");
        assert_eq!(second.live_table(s as u32), tables[s], "service {s}");
    }
    let used: u64 = pairs.iter().map(|p| u64::from(pair_blocks(p.1))).sum();
    assert_eq!(
        second.maglev_free_blocks(),
        u64::from(MAGLEV_BLOCKS) - used,
        "exactly the live pairs are allocated (service 1's old pair is free again)"
    );
    // New services never land on a live pair.
    for s in 3..40 {
        publish(&mut second, s, 16411, 6);
        let p = second.maglev_pair(s).unwrap();
        for (k, live) in pairs.iter().enumerate() {
            assert!(!overlaps(p, *live), "service {s} on service {k}'s pair");
        }
    }
    // And the adopted services still publish in place.
    publish(&mut second, 0, 4099, 7);
    assert_eq!(second.maglev_pair(0), Some(pairs[0]));
    assert_eq!(second.live_table(0), vec![7; 4099]);
}
