//! Tests of the incremental path: a verdict costs work for the changed backend only, and
//! incremental publishing always yields the maps a full publish (and one from scratch) does.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use lb_common::{
    IPPROTO_TCP, IPPROTO_UDP, NO_BACKEND,
    maps::{BACKEND_F_LIVE, Backend},
};

use super::*;
use crate::{
    dataplane::PublishedState,
    testing::{MemoryDataplane, Write},
};

const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

fn server(i: usize) -> DesiredBackend {
    DesiredBackend {
        addr: SocketAddr::new(
            IpAddr::from([10, 1, (i / 250) as u8, (1 + i % 250) as u8]),
            8080,
        ),
        weight: 1,
        mac: Some(MAC),
        role: Role::Active,
    }
}

fn service(index: usize, backends: Vec<DesiredBackend>) -> DesiredService {
    DesiredService {
        name: format!("svc{index}"),
        vip: SocketAddr::new(
            IpAddr::from([10, 0, (index / 250) as u8, (1 + index % 250) as u8]),
            80,
        ),
        proto: if index.is_multiple_of(2) {
            IPPROTO_TCP
        } else {
            IPPROTO_UDP
        },
        tunnel: None,
        nat: (index % 3 != 2).then(|| NatSpec {
            snat_ips: vec!["10.0.9.2".parse().unwrap()],
            ports: 20000..=29999,
            source_rate: 1000,
            source_burst: 2000,
        }),
        backends,
        maglev_size: None,
    }
}

#[test]
fn a_verdict_about_one_of_1000_servers_examines_and_writes_only_that_server() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::default();
    let all: Vec<DesiredBackend> = (0..1000).map(server).collect();
    let first = p.apply(&[service(0, all.clone())], &mut dp).unwrap();
    assert_eq!(
        first.backends_examined, 1000,
        "a new service is published whole"
    );

    let mut failed = all.clone();
    failed[617].role = Role::Removed;
    let id = p.backend_id("svc0", &all[617].addr).unwrap();
    dp.log.clear();
    let report = p.apply(&[service(0, failed)], &mut dp).unwrap();
    assert_eq!(
        (
            report.backends_examined,
            report.backends_written,
            report.tables_published
        ),
        (1, 1, 1),
        "a verdict about one server must cost work for that server only: {report:?}"
    );
    assert_eq!(dp.log, vec![Write::Slots(0), Write::Backend(id)]);
    assert_eq!(dp.backends[&id].flags & BACKEND_F_LIVE, 0);
    assert!(!dp.tables[&0].contains(&id));

    dp.log.clear();
    let report = p.apply(&[service(0, all.clone())], &mut dp).unwrap();
    assert_eq!(
        (
            report.backends_examined,
            report.backends_written,
            report.tables_published
        ),
        (1, 1, 1),
        "recovery: {report:?}"
    );
    assert_eq!(
        dp.log,
        vec![Write::Backend(id), Write::Slots(0)],
        "a returning backend is live before the table points at it"
    );

    // A role change that keeps the table (active -> sticky keeps LIVE, leaves the table;
    // sticky -> removed only takes LIVE away).
    let mut sticky = all.clone();
    sticky[3].role = Role::Sticky;
    let report = p.apply(&[service(0, sticky.clone())], &mut dp).unwrap();
    assert_eq!((report.backends_examined, report.tables_published), (1, 1));
    sticky[3].role = Role::Removed;
    let report = p.apply(&[service(0, sticky)], &mut dp).unwrap();
    assert_eq!(
        (
            report.backends_examined,
            report.backends_written,
            report.tables_published
        ),
        (1, 1, 0),
        "a backend already out of the table: its entry only"
    );
}

#[test]
fn one_changed_backend_of_1000_is_published_from_its_own_want() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::default();
    let all: Vec<DesiredBackend> = (0..1000).map(server).collect();
    assert_eq!(
        p.apply_backends("svc0", &all[..1], &mut dp).unwrap(),
        None,
        "nothing published yet: the whole description is needed"
    );
    p.apply(&[service(0, all.clone())], &mut dp).unwrap();

    let mut failed = all[617].clone();
    failed.role = Role::Removed;
    let id = p.backend_id("svc0", &failed.addr).unwrap();
    dp.log.clear();
    let report = p
        .apply_backends("svc0", &[failed], &mut dp)
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            report.backends_examined,
            report.backends_written,
            report.tables_published,
            report.services_given
        ),
        (1, 1, 1, 1),
        "{report:?}"
    );
    assert_eq!(dp.log, vec![Write::Slots(0), Write::Backend(id)]);
    assert!(!dp.tables[&0].contains(&id));
    // The last want was updated in place: the whole want with the failure is no change.
    let mut with_failure = all.clone();
    with_failure[617].role = Role::Removed;
    dp.log.clear();
    let report = p.apply(&[service(0, with_failure)], &mut dp).unwrap();
    assert_eq!(
        (report.backends_examined, dp.log.len()),
        (0, 0),
        "{report:?}"
    );

    // What the want alone cannot say is refused, with nothing written.
    let mut heavier = all[3].clone();
    heavier.weight = 2;
    let stranger = server(5000);
    for refused in [heavier, stranger] {
        assert_eq!(p.apply_backends("svc0", &[refused], &mut dp).unwrap(), None);
    }
    assert_eq!(dp.log, vec![]);

    // Recovery: the entry before the table.
    dp.log.clear();
    p.apply_backends("svc0", &all[617..618], &mut dp)
        .unwrap()
        .unwrap();
    assert_eq!(dp.log, vec![Write::Backend(id), Write::Slots(0)]);
}

#[test]
fn a_verdict_in_one_of_the_most_services_touches_only_that_service() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::default();
    // As many backends each as the backend ids allow.
    let per = (MAX_BACKENDS as usize - 1) / MAX_SERVICES as usize;
    let mut want: Vec<DesiredService> = (0..MAX_SERVICES as usize)
        .map(|s| service(s, (s * per..(s + 1) * per).map(server).collect()))
        .collect();
    p.apply(&want, &mut dp).unwrap();
    want[42].backends[7].role = Role::Removed;
    dp.log.clear();
    let report = p.apply(&want, &mut dp).unwrap();
    let sid = p.service_id("svc42").unwrap();
    let id = p.backend_id("svc42", &want[42].backends[7].addr).unwrap();
    assert_eq!(report.backends_examined, 1, "{report:?}");
    assert_eq!(dp.log, vec![Write::Slots(sid), Write::Backend(id)]);
}

#[test]
fn structural_changes_take_the_full_path() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::default();
    let all: Vec<DesiredBackend> = (0..10).map(server).collect();
    p.apply(&[service(0, all.clone())], &mut dp).unwrap();
    let mut heavier = all.clone();
    heavier[4].weight = 3;
    let report = p.apply(&[service(0, heavier)], &mut dp).unwrap();
    assert_eq!(
        report.backends_examined, 10,
        "a weight rebuilds the home table"
    );
    let report = p.apply(&[service(0, all[..9].to_vec())], &mut dp).unwrap();
    assert_eq!(report.backends_examined, 9, "a removal takes the full path");
}

/// xorshift64*: a deterministic pseudo-random sequence (no dependency, reproducible).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One random change to the wanted state: mostly verdicts (roles, MACs), sometimes
/// admin changes (weight, add, remove), a changed VIP or a service added or removed.
fn mutate(rng: &mut Rng, want: &mut Vec<DesiredService>, next_server: &mut usize) {
    let s = rng.below(want.len());
    let backends = &mut want[s].backends;
    match rng.below(20) {
        0..=9 if !backends.is_empty() => {
            let i = rng.below(backends.len());
            backends[i].role = [Role::Active, Role::Sticky, Role::Removed][rng.below(3)];
        }
        10..=11 if !backends.is_empty() => {
            let i = rng.below(backends.len());
            backends[i].mac = if backends[i].mac.is_some() {
                None
            } else {
                Some(MAC)
            };
        }
        12 if !backends.is_empty() => {
            // A storm: several verdicts in one publish.
            for _ in 0..1 + rng.below(5) {
                let i = rng.below(backends.len());
                backends[i].role = [Role::Active, Role::Removed][rng.below(2)];
            }
        }
        13 if !backends.is_empty() => {
            let i = rng.below(backends.len());
            backends[i].weight = rng.below(4) as u32;
        }
        14 => {
            *next_server += 1;
            let mut b = server(*next_server);
            b.role = [Role::Active, Role::Sticky, Role::Removed][rng.below(3)];
            let at = rng.below(backends.len() + 1);
            backends.insert(at, b);
        }
        15 if !backends.is_empty() => {
            let i = rng.below(backends.len());
            backends.remove(i);
        }
        16 => want[s].vip.set_port(80 + rng.below(3) as u16),
        17 if want.len() > 1 => {
            want.remove(s);
        }
        18 => {
            let index = (0..8).find(|i| !want.iter().any(|w| w.name == format!("svc{i}")));
            if let Some(index) = index {
                *next_server += 3;
                let backends = (*next_server - 2..=*next_server).map(server).collect();
                want.push(service(index, backends));
            }
        }
        _ => {}
    }
}

/// Publishes `want` as the agent does after verdicts: for each service whose backend
/// list has the same addresses as in `before`, only the backends that differ through
/// [`Publisher::apply_backends`] (which must refuse, writing nothing, what it cannot take:
/// a weight, a service never published or not since a failure); then `apply` of the
/// whole want, which finds those services unchanged. Counts the services taken per backend.
fn by_backends(
    p: &mut Publisher,
    dp: &mut MemoryDataplane,
    before: &[DesiredService],
    want: &[DesiredService],
    taken: &mut usize,
) -> PublishReport {
    let mut report = PublishReport::default();
    for w in want {
        let Some(was) = before.iter().find(|b| b.name == w.name) else {
            continue;
        };
        if was.vip != w.vip
            || was.backends.len() != w.backends.len()
            || was
                .backends
                .iter()
                .zip(&w.backends)
                .any(|(a, b)| a.addr != b.addr)
        {
            continue;
        }
        let changed: Vec<DesiredBackend> = was
            .backends
            .iter()
            .zip(&w.backends)
            .filter(|(a, b)| a != b)
            .map(|(_, b)| b.clone())
            .collect();
        if changed.is_empty() {
            continue;
        }
        let writes = dp.log.len();
        let weighed = was
            .backends
            .iter()
            .zip(&w.backends)
            .any(|(a, b)| a.weight != b.weight);
        match p.apply_backends(&w.name, &changed, dp).unwrap() {
            Some(done) => {
                assert!(!weighed, "a weight change must take the full path");
                assert_eq!(done.backends_examined, changed.len());
                *taken += 1;
                report.absorb(done);
            }
            None => assert_eq!(dp.log.len(), writes, "a refused change writes nothing"),
        }
    }
    let rest = p.apply(want, dp).unwrap();
    report.absorb(rest);
    report
}

/// A service's table as backend addresses, and its backends' entries by address.
type AddressView = (Vec<Option<SocketAddr>>, BTreeMap<SocketAddr, Backend>);

/// Per service: its table as backend addresses, and every backend's entry by address
/// (a publisher from scratch may hand out other ids; Maglev orders by address).
fn by_address(
    p: &Publisher,
    dp: &MemoryDataplane,
    want: &[DesiredService],
) -> BTreeMap<String, AddressView> {
    want.iter()
        .map(|w| {
            let sid = p.service_id(&w.name).unwrap();
            let addr_of: BTreeMap<u32, SocketAddr> = w
                .backends
                .iter()
                .map(|b| (p.backend_id(&w.name, &b.addr).unwrap(), b.addr))
                .collect();
            let table = dp.tables[&sid]
                .iter()
                .map(|id| (*id != NO_BACKEND).then(|| addr_of[id]))
                .collect();
            let entries = addr_of
                .iter()
                .map(|(id, addr)| {
                    let mut e = dp.backends[id];
                    e.service_id = 0;
                    (*addr, e)
                })
                .collect();
            (w.name.clone(), (table, entries))
        })
        .collect()
}

#[test]
fn incremental_publish_yields_the_maps_of_a_full_and_of_a_fresh_publish() {
    for seed in 1..=4u64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
        let mut next_server = 0;
        let mut want: Vec<DesiredService> = (0..3)
            .map(|s| {
                let n = 1 + rng.below(20);
                let backends = (next_server..next_server + n).map(server).collect();
                next_server += n;
                service(s, backends)
            })
            .collect();
        let (mut inc_dp, mut full_dp) = (MemoryDataplane::default(), MemoryDataplane::default());
        let mut inc = Publisher::default();
        let mut full = Publisher {
            incremental: false,
            ..Publisher::default()
        };
        let mut incremental_steps = 0;
        let mut per_backend_steps = 0;
        for step in 0..150 {
            let restart = rng.below(50) == 0;
            if restart {
                // A restart: both adopt what their maps hold.
                for (p, dp) in [(&mut inc, &inc_dp), (&mut full, &full_dp)] {
                    let state = PublishedState {
                        services: dp.services.values().copied().collect(),
                        backends: dp.backends.iter().map(|(id, b)| (*id, *b)).collect(),
                    };
                    let incremental = p.incremental;
                    *p = Publisher {
                        incremental,
                        ..Publisher::default()
                    };
                    p.adopt(&state);
                }
            }
            let before = want.clone();
            if !restart {
                mutate(&mut rng, &mut want, &mut next_server);
            }
            // Half the steps as the agent publishes a verdict: the changed backends alone
            // where the publisher takes them, the rest (and every service) described whole.
            let a = if rng.below(2) == 0 {
                by_backends(
                    &mut inc,
                    &mut inc_dp,
                    &before,
                    &want,
                    &mut per_backend_steps,
                )
            } else {
                inc.apply(&want, &mut inc_dp).unwrap()
            };
            let b = full.apply(&want, &mut full_dp).unwrap();
            if a.backends_examined < b.backends_examined {
                incremental_steps += 1;
            }
            let ctx = format!("seed {seed} step {step}");
            let mut published = 0;
            for w in &want {
                for b in &w.backends {
                    let id = inc.backend_id(&w.name, &b.addr).unwrap();
                    assert_eq!(
                        inc.backend_by_id(id),
                        Some((w.name.clone(), b.addr)),
                        "{ctx}: owner of backend {id}"
                    );
                    published += 1;
                }
            }
            assert_eq!(inc.owners.len(), published, "{ctx}: owners of freed ids");
            assert_eq!(inc_dp.backends, full_dp.backends, "{ctx}: backend entries");
            // Compared without printing 65,537 slots.
            assert_eq!(
                inc_dp.tables.keys().collect::<Vec<_>>(),
                full_dp.tables.keys().collect::<Vec<_>>(),
                "{ctx}: tables"
            );
            for (sid, table) in &inc_dp.tables {
                let differ = table
                    .iter()
                    .zip(&full_dp.tables[sid])
                    .position(|(a, b)| a != b);
                assert_eq!(
                    differ, None,
                    "{ctx}: table of service {sid} differs at this slot"
                );
            }
            assert_eq!(inc_dp.services, full_dp.services, "{ctx}: services");
            assert_eq!(
                (a.backends_written, a.tables_published, a.services_written),
                (b.backends_written, b.tables_published, b.services_written),
                "{ctx}: the same writes"
            );

            if step % 10 != 9 {
                continue; // a publish from scratch is a Maglev build per service
            }
            let mut fresh_dp = MemoryDataplane::default();
            let mut fresh = Publisher::default();
            fresh.apply(&want, &mut fresh_dp).unwrap();
            let (ours, theirs) = (
                by_address(&inc, &inc_dp, &want),
                by_address(&fresh, &fresh_dp, &want),
            );
            for (name, (slots, entries)) in &ours {
                let (fresh_slots, fresh_entries) = &theirs[name];
                assert_eq!(slots.len(), fresh_slots.len(), "{ctx}: {name}: table size");
                let differ = slots.iter().zip(fresh_slots).position(|(a, b)| a != b);
                assert_eq!(
                    differ, None,
                    "{ctx}: {name}: the table differs at this slot"
                );
                for (addr, e) in entries {
                    assert_eq!(
                        Some(e),
                        fresh_entries.get(addr),
                        "{ctx}: {name}: entry of {addr}"
                    );
                }
            }
            let current: std::collections::HashSet<u32> = want
                .iter()
                .flat_map(|w| w.backends.iter().map(|b| inc.backend_id(&w.name, &b.addr)))
                .map(Option::unwrap)
                .collect();
            for (id, e) in &inc_dp.backends {
                assert!(
                    current.contains(id) || e.flags & BACKEND_F_LIVE == 0,
                    "{ctx}: backend {id} left every service but is still live"
                );
            }
        }
        assert!(
            incremental_steps > 50,
            "seed {seed}: the sequence must exercise the incremental path ({incremental_steps} steps)"
        );
        let slot_steps = inc_dp
            .log
            .iter()
            .filter(|w| matches!(w, Write::Slots(_)))
            .count();
        assert!(
            slot_steps > 20,
            "seed {seed}: the sequence must exercise tables written slot by slot ({slot_steps})"
        );
        assert!(
            per_backend_steps > 20,
            "seed {seed}: the sequence must exercise publishes of changed backends alone \
             ({per_backend_steps} steps)"
        );
    }
}

/// Slots of `table` that differ from `other`.
fn differing(table: &[u32], other: &[u32]) -> u64 {
    table.iter().zip(other).filter(|(a, b)| a != b).count() as u64
}

#[test]
fn a_verdict_writes_only_the_slots_that_change() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::default();
    let all: Vec<DesiredBackend> = (0..1000).map(server).collect();
    p.apply(&[service(0, all.clone())], &mut dp).unwrap();
    let size = dp.tables[&0].len() as u64;
    let id = |i: usize| p.backend_id("svc0", &all[i].addr).unwrap();
    let (a, b) = (id(617), id(42));
    let held = |dp: &MemoryDataplane, id: u32| dp.tables[&0].iter().filter(|&&s| s == id).count();
    let home_a = held(&dp, a) as u64;
    assert!(home_a > 0 && home_a * 100 < size);

    // One server leaves: exactly its slots are written, in place.
    let mut want = all.clone();
    want[617].role = Role::Removed;
    let (before, written) = (dp.tables[&0].clone(), dp.slots_written);
    dp.log.clear();
    let report = p
        .apply_backends("svc0", &want[617..618], &mut dp)
        .unwrap()
        .unwrap();
    assert_eq!(dp.log, vec![Write::Slots(0), Write::Backend(a)]);
    assert_eq!(
        dp.slots_written - written,
        home_a,
        "its slots, nothing else"
    );
    assert_eq!(report.slots_written as u64, home_a);
    assert_eq!(differing(&before, &dp.tables[&0]), home_a);
    assert_eq!(held(&dp, a), 0);

    // A second one leaves: its home slots and those of the first that failed over to it.
    want[42].role = Role::Removed;
    let held_b = held(&dp, b) as u64;
    let (before, written) = (dp.tables[&0].clone(), dp.slots_written);
    p.apply_backends("svc0", &want[42..43], &mut dp)
        .unwrap()
        .unwrap();
    assert_eq!(dp.slots_written - written, held_b);
    assert_eq!(differing(&before, &dp.tables[&0]), held_b);

    // The first returns: its home slots, and those of the second whose walk meets one of
    // its home slots first — exactly the slots that differ, which a whole pass gives.
    want[617].role = Role::Active;
    let (before, written) = (dp.tables[&0].clone(), dp.slots_written);
    p.apply_backends("svc0", &want[617..618], &mut dp)
        .unwrap()
        .unwrap();
    let moved = differing(&before, &dp.tables[&0]);
    assert_eq!(dp.slots_written - written, moved);
    assert!(moved >= home_a && moved < home_a + held_b);
    assert_eq!(held(&dp, a) as u64, moved);

    // The maps are those of a publish from scratch.
    let mut fresh_dp = MemoryDataplane::default();
    let mut fresh = Publisher::default();
    fresh
        .apply(&[service(0, want.clone())], &mut fresh_dp)
        .unwrap();
    assert!(
        dp.tables[&0] == fresh_dp.tables[&0],
        "slot by slot == whole"
    );
}

/// The maps `want` gives when published from scratch.
fn fresh_table(want: &[DesiredBackend]) -> Vec<u32> {
    let mut dp = MemoryDataplane::default();
    Publisher::default()
        .apply(&[service(0, want.to_vec())], &mut dp)
        .unwrap();
    dp.tables[&0].clone()
}

#[test]
fn a_storm_of_verdicts_is_published_whole_and_a_few_dozen_slot_by_slot() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::default();
    let all: Vec<DesiredBackend> = (0..1000).map(server).collect();
    p.apply(&[service(0, all.clone())], &mut dp).unwrap();
    let size = dp.tables[&0].len();

    // 50 of 1,000 at once: slot by slot, only what changes.
    let mut want = all.clone();
    for w in &mut want[100..150] {
        w.role = Role::Removed;
    }
    let report = p
        .apply_backends("svc0", &want[100..150], &mut dp)
        .unwrap()
        .unwrap();
    assert!(
        report.slots_written > 0 && report.slots_written * 10 < size,
        "a few dozen leaving are written slot by slot ({} of {size})",
        report.slots_written
    );
    assert!(dp.tables[&0] == fresh_table(&want), "slot by slot == fresh");

    // A rack: 300 of the 950 left at once (more than an eighth), then all back at once
    // — whole tables, bounded work, the same maps as a fresh publish each time.
    for w in &mut want[150..450] {
        w.role = Role::Removed;
    }
    let report = p
        .apply_backends("svc0", &want[150..450], &mut dp)
        .unwrap()
        .unwrap();
    assert_eq!(report.tables_published, 1);
    assert_eq!(report.slots_written, size, "a storm is published whole");
    assert!(
        dp.tables[&0] == fresh_table(&want),
        "after the storm == fresh"
    );

    let report = p.apply_backends("svc0", &all, &mut dp).unwrap().unwrap();
    assert_eq!(
        report.slots_written, size,
        "the return of most is published whole"
    );
    assert!(
        dp.tables[&0] == fresh_table(&all),
        "after the return == fresh"
    );

    // The walk state is rebuilt by the whole publish: one verdict is slot by slot again.
    want = all.clone();
    want[7].role = Role::Removed;
    let report = p
        .apply_backends("svc0", &want[7..8], &mut dp)
        .unwrap()
        .unwrap();
    assert!(
        report.slots_written * 100 < size,
        "one verdict after a storm: its slots only"
    );
    assert!(dp.tables[&0] == fresh_table(&want));
}
