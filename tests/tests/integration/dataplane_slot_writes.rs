//! Slots written in place on real maps (root): `write_slots` changes exactly the given
//! slots of the live half (the half the generation word names, which the XDP program
//! reads), leaves the generation alone, follows a service moved to a new pair, and
//! refuses slots outside the table or a service without one.

use lb_agent::dataplane::{BpfDataplane, Dataplane, DataplaneError, adopt::pin::PinDir};
use lb_tests::agent::bpffs::PrivateBpffs;

#[test]
fn slot_writes_change_only_those_slots_of_the_live_table() {
    let fs = PrivateBpffs::mount("slot-writes").expect("a private bpffs");
    let pins = PinDir::prepare(&fs.pins().join("lb")).expect("a pin directory");
    let mut dp = BpfDataplane::load_with(None, Some(pins)).expect("loading");

    let mut table: Vec<u32> = (0..4099).map(|s| 1 + s % 7).collect();
    dp.publish_table(3, &table).expect("a whole table");
    // A second whole publish flips to the other half: slot writes go to the live one.
    table.iter_mut().for_each(|s| *s += 10);
    dp.publish_table(3, &table).expect("a whole table, flipped");
    let pair = dp.maglev_pair(3);

    let writes = [(0, 100), (17, 101), (4098, 102)];
    dp.write_slots(3, &writes).expect("slots in place");
    for (slot, id) in writes {
        table[slot as usize] = id;
    }
    assert_eq!(dp.live_table(3), table, "exactly those slots changed");
    assert_eq!(dp.maglev_pair(3), pair, "in place: the same pair");

    // The next whole publish (the other half) still gives exactly its table.
    let next: Vec<u32> = vec![55; 4099];
    dp.publish_table(3, &next)
        .expect("a whole table after slot writes");
    assert_eq!(dp.live_table(3), next);
    dp.write_slots(3, &[(5, 56)])
        .expect("a slot in the other half");
    let mut expect = next.clone();
    expect[5] = 56;
    assert_eq!(dp.live_table(3), expect);

    // A resized service moves to a new pair: slot writes follow it.
    let big = vec![60; 16411];
    dp.publish_table(3, &big).expect("a resized table");
    assert_ne!(dp.maglev_pair(3), pair);
    dp.write_slots(3, &[(16410, 61)])
        .expect("the last slot of the new pair");
    let mut expect = big.clone();
    expect[16410] = 61;
    assert_eq!(dp.live_table(3), expect);

    assert!(matches!(
        dp.write_slots(3, &[(16411, 1)]),
        Err(DataplaneError::SlotOutside { slot: 16411, .. })
    ));
    assert!(matches!(
        dp.write_slots(9, &[(0, 1)]),
        Err(DataplaneError::SlotOutside { service_id: 9, .. })
    ));
    assert_eq!(dp.live_table(3), expect, "a refused write writes nothing");
}
