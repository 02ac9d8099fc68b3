//! Tests of the publisher as a whole against the in-memory data plane: write order,
//! roles and flags, ids, adoption, liveness kept until the table moves away.

use lb_common::{
    IPPROTO_TCP, NO_BACKEND,
    maps::{BACKEND_F_LIVE, BACKEND_F_SERVING, SERVICE_F_GUE, SERVICE_F_NAT, SERVICE_F_TUNNEL},
};

use super::*;
use crate::{
    dataplane::PublishedState,
    testing::{MemoryDataplane, Write},
};

const MAC: Option<[u8; 6]> = Some([2, 0, 0, 0, 0, 1]);

fn backend(addr: &str, weight: u32, role: Role) -> DesiredBackend {
    DesiredBackend {
        addr: addr.parse().unwrap(),
        weight,
        mac: MAC,
        role,
    }
}

fn web(backends: Vec<DesiredBackend>) -> DesiredService {
    DesiredService {
        name: "web".into(),
        vip: "10.0.0.100:80".parse().unwrap(),
        proto: IPPROTO_TCP,
        tunnel: None,
        nat: Some(NatSpec {
            snat_ips: vec!["10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap()],
            ports: 20000..=29999,
            source_rate: 250,
            source_burst: 500,
        }),
        backends,
        maglev_size: None,
    }
}

fn slots_of(dp: &MemoryDataplane, service: u32, id: u32) -> usize {
    dp.tables[&service].iter().filter(|&&s| s == id).count()
}

/// A fresh dataplane and publisher after one apply of `services`.
fn applied(services: &[DesiredService]) -> (MemoryDataplane, Publisher) {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::default();
    p.apply(services, &mut dp).unwrap();
    (dp, p)
}

/// Applies `services` and returns what that apply wrote, in order.
fn writes(p: &mut Publisher, dp: &mut MemoryDataplane, services: &[DesiredService]) -> Vec<Write> {
    dp.log.clear();
    p.apply(services, dp).unwrap();
    dp.log.clone()
}

/// Two active backends, 10.0.1.1:80 and 10.0.1.2:80, weight 1.
fn two_active() -> Vec<DesiredBackend> {
    vec![
        backend("10.0.1.1:80", 1, Role::Active),
        backend("10.0.1.2:80", 1, Role::Active),
    ]
}

/// `all` with backend `i` in `role`.
fn with_role(all: &[DesiredBackend], i: usize, role: Role) -> Vec<DesiredBackend> {
    let mut out = all.to_vec();
    out[i].role = role;
    out
}

/// What a restarted agent reads back from the maps `dp` holds.
fn state_of(dp: &MemoryDataplane) -> PublishedState {
    PublishedState {
        services: dp.services.values().copied().collect(),
        backends: dp.backends.iter().map(|(id, b)| (*id, *b)).collect(),
    }
}

#[test]
fn new_service_writes_backends_then_table_then_vip() {
    let svc = web(two_active());
    let (dp, _) = applied(std::slice::from_ref(&svc));
    let vip = vip_key(svc.vip, IPPROTO_TCP);
    assert_eq!(
        dp.log,
        vec![
            Write::Backend(1),
            Write::Backend(2),
            Write::Table(0),
            Write::Service(vip)
        ],
        "a VIP must only appear once its backends and table are in place"
    );
    let meta = dp.service(&vip).expect("VIP published");
    assert_eq!(meta.flags, SERVICE_F_NAT);
    assert_eq!((meta.nat_port_min, meta.nat_port_max), (20000, 29999));
    assert_eq!(meta.snat_count, 2, "both snat addresses");
    assert_eq!(
        &meta.snat_addrs[..2],
        &[
            addr_words("10.0.0.2".parse().unwrap()).0,
            addr_words("10.0.0.3".parse().unwrap()).0
        ]
    );
    assert_eq!(meta.snat_addrs[2], [0; 4], "unused slots stay zero");
    assert_eq!(
        (meta.source_interval_ns, meta.source_burst),
        (4_000_000, 500),
        "250 flows/s is one every 4 ms"
    );
    assert!(dp.tables[&0].iter().all(|&s| s == 1 || s == 2));
    for id in [1, 2] {
        assert_eq!(
            dp.backends[&id].flags,
            BACKEND_F_LIVE | BACKEND_F_SERVING,
            "an active backend is live and serving"
        );
    }
}

#[test]
fn a_tunnel_service_carries_its_mode_and_a_change_of_mode_rewrites_its_slot() {
    let dsr = DesiredService {
        nat: None,
        ..web(two_active())
    };
    let (mut dp, mut p) = applied(std::slice::from_ref(&dsr));
    let vip = vip_key(dsr.vip, IPPROTO_TCP);
    assert_eq!(dp.service(&vip).expect("published").flags, 0, "dsr");
    for (tunnel, flags) in [
        (Tunnel::Ipip, SERVICE_F_TUNNEL),
        (Tunnel::Gue, SERVICE_F_TUNNEL | SERVICE_F_GUE),
    ] {
        let svc = DesiredService {
            tunnel: Some(tunnel),
            ..dsr.clone()
        };
        let log = writes(&mut p, &mut dp, std::slice::from_ref(&svc));
        assert_eq!(
            log,
            vec![Write::Service(vip)],
            "{tunnel:?}: only the VIP slot"
        );
        let meta = dp.service(&vip).expect("published");
        assert_eq!(meta.flags, flags, "{tunnel:?}");
        assert_eq!(meta.snat_count, 0, "{tunnel:?}: no source translation");
    }
}

#[test]
fn unchanged_apply_writes_nothing() {
    let svc = web(vec![backend("10.0.1.1:80", 1, Role::Active)]);
    let (mut dp, mut p) = applied(std::slice::from_ref(&svc));
    let before = dp.log.len();
    let report = p.apply(std::slice::from_ref(&svc), &mut dp).unwrap();
    assert_eq!(
        dp.log.len(),
        before,
        "second identical apply wrote {report:?}"
    );
}

#[test]
fn sticky_backend_leaves_table_but_stays_live() {
    let (mut dp, mut p) = applied(&[web(two_active())]);
    p.apply(&[web(with_role(&two_active(), 1, Role::Sticky))], &mut dp)
        .unwrap();
    assert_eq!(
        slots_of(&dp, 0, 2),
        0,
        "sticky backend must leave the table"
    );
    assert_eq!(
        dp.backends[&2].flags, BACKEND_F_LIVE,
        "sticky: live (keeps its TCP connections), not serving"
    );
}

#[test]
fn live_slots_follow_the_published_table() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::default();
    let (a, b) = (
        "10.0.1.1:80".parse().unwrap(),
        "10.0.1.2:80".parse().unwrap(),
    );
    p.apply(
        &[web(vec![
            backend("10.0.1.1:80", 3, Role::Active),
            backend("10.0.1.2:80", 1, Role::Active),
        ])],
        &mut dp,
    )
    .unwrap();
    let (sa, sb) = (p.live_slots("web", &a), p.live_slots("web", &b));
    assert_eq!(sa as usize, slots_of(&dp, 0, 1));
    assert_eq!(sb as usize, slots_of(&dp, 0, 2));
    assert_eq!(sa as usize + sb as usize, dp.tables[&0].len());
    assert!(sa > 2 * sb, "weight 3 vs 1: {sa} vs {sb} slots");
    p.apply(
        &[web(vec![
            backend("10.0.1.1:80", 3, Role::Active),
            backend("10.0.1.2:80", 1, Role::Sticky),
        ])],
        &mut dp,
    )
    .unwrap();
    assert_eq!(p.live_slots("web", &a) as usize, dp.tables[&0].len());
    assert_eq!(p.live_slots("web", &b), 0);
    assert_eq!(p.live_slots("nope", &a), 0);
}

#[test]
fn table_size_follows_the_backend_count_unless_configured() {
    let many = |n: u8| -> Vec<DesiredBackend> {
        (1..=n)
            .map(|i| backend(&format!("10.0.1.{i}:80"), 1, Role::Active))
            .collect()
    };
    let (mut dp, mut p) = applied(&[web(many(2))]);
    assert_eq!(dp.tables[&0].len(), 4099, "2 servers: the smallest size");
    // 41 servers need more than 4,099 slots at 100 per server: a new table.
    p.apply(&[web(many(41))], &mut dp).unwrap();
    assert_eq!(dp.tables[&0].len(), 16411);
    assert!(slots_of(&dp, 0, 41) > 0, "the 41st server has slots");
    // Configured: that size whatever the count.
    let fixed = DesiredService {
        maglev_size: Some(262147),
        ..web(many(41))
    };
    p.apply(std::slice::from_ref(&fixed), &mut dp).unwrap();
    assert_eq!(dp.tables[&0].len(), 262147);
    let before = dp.log.len();
    p.apply(&[fixed], &mut dp).unwrap();
    assert_eq!(dp.log.len(), before, "unchanged: nothing rewritten");
}

#[test]
fn removed_backend_loses_live_flag_and_id_is_reused_last() {
    let (mut dp, mut p) = applied(&[web(two_active())]);
    p.apply(
        &[web(vec![backend("10.0.1.1:80", 1, Role::Active)])],
        &mut dp,
    )
    .unwrap();
    assert_eq!(dp.backends[&2].flags & BACKEND_F_LIVE, 0);
    assert_eq!(slots_of(&dp, 0, 1), dp.tables[&0].len());
    p.apply(
        &[web(vec![
            backend("10.0.1.1:80", 1, Role::Active),
            backend("10.0.1.3:80", 1, Role::Active),
        ])],
        &mut dp,
    )
    .unwrap();
    assert_eq!(
        p.backend_id("web", &"10.0.1.3:80".parse().unwrap()),
        Some(3),
        "a fresh id is preferred over a recently freed one"
    );
}

#[test]
fn unknown_mac_is_not_selectable() {
    let mut b = backend("10.0.1.1:80", 1, Role::Active);
    b.mac = None;
    let (dp, _) = applied(&[web(vec![b])]);
    assert!(dp.tables[&0].iter().all(|&s| s == NO_BACKEND));
    assert_eq!(dp.backends[&1].flags & BACKEND_F_LIVE, 0);
}

#[test]
fn removed_service_loses_vip_and_backends() {
    let svc = web(vec![backend("10.0.1.1:80", 1, Role::Active)]);
    let (mut dp, mut p) = applied(std::slice::from_ref(&svc));
    p.apply(&[], &mut dp).unwrap();
    assert!(dp.service(&vip_key(svc.vip, IPPROTO_TCP)).is_none());
    assert_eq!(dp.backends[&1].flags & BACKEND_F_LIVE, 0);
    assert_eq!(p.service_id("web"), None);
}

#[test]
fn a_health_change_moves_only_that_backends_slots() {
    let all: Vec<DesiredBackend> = (1..=10)
        .map(|i| backend(&format!("10.0.1.{i}:80"), 1, Role::Active))
        .collect();
    let (mut dp, mut p) = applied(&[web(all.clone())]);
    let before = dp.tables[&0].clone();
    p.apply(&[web(with_role(&all, 2, Role::Removed))], &mut dp)
        .unwrap();
    let after = dp.tables[&0].clone();
    let id = p.backend_id("web", &all[2].addr).unwrap();
    let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    let owned = before.iter().filter(|&&s| s == id).count();
    assert_eq!(moved, owned, "only the failed backend's slots may move");
    p.apply(&[web(all)], &mut dp).unwrap();
    assert_eq!(
        dp.tables[&0], before,
        "recovery restores the home table exactly"
    );
}

#[test]
fn adoption_keeps_ids_and_rewrites_nothing_that_is_unchanged() {
    let svc = web(with_role(&two_active(), 1, Role::Removed));
    let gone = DesiredService {
        name: "old".into(),
        vip: "10.0.0.101:80".parse().unwrap(),
        tunnel: None,
        nat: None,
        ..web(vec![backend("10.0.2.1:80", 1, Role::Active)])
    };
    let (mut dp, first) = applied(&[svc.clone(), gone.clone()]);
    let state = state_of(&dp);

    let mut second = Publisher::default();
    second.adopt(&state);
    assert_eq!(
        second.adopted_live(svc.vip, IPPROTO_TCP, "10.0.1.1:80".parse().unwrap()),
        Some(true)
    );
    assert_eq!(
        second.adopted_live(svc.vip, IPPROTO_TCP, "10.0.1.2:80".parse().unwrap()),
        Some(false)
    );
    dp.log.clear();
    second.apply(std::slice::from_ref(&svc), &mut dp).unwrap();
    for addr in ["10.0.1.1:80", "10.0.1.2:80"] {
        let addr = addr.parse().unwrap();
        assert_eq!(
            second.backend_id("web", &addr),
            first.backend_id("web", &addr)
        );
    }
    assert!(
        !dp.log
            .iter()
            .any(|w| matches!(w, Write::Backend(id) if *id <= 2)),
        "unchanged adopted backends must not be rewritten: {:?}",
        dp.log
    );
    assert!(
        dp.service(&vip_key(gone.vip, IPPROTO_TCP)).is_none(),
        "a service no longer configured is removed"
    );
    assert_eq!(dp.backends[&3].flags & BACKEND_F_LIVE, 0);
}

#[test]
fn liveness_is_taken_away_only_after_the_table_stops_pointing_at_it() {
    let all = two_active();
    let (mut dp, mut p) = applied(&[web(all.clone())]);
    assert_eq!(
        writes(&mut p, &mut dp, &[web(with_role(&all, 1, Role::Removed))]),
        vec![Write::Slots(0), Write::Backend(2)],
        "table first, then the backend loses LIVE"
    );
    writes(&mut p, &mut dp, &[web(all[..1].to_vec())]);
    let log = writes(&mut p, &mut dp, &[web(all)]);
    assert_eq!(
        log.first(),
        Some(&Write::Backend(3)),
        "a new backend is written before the table points at it: {log:?}"
    );
}

#[test]
fn roles_map_to_flags() {
    let mut no_mac = backend("10.0.1.4:80", 1, Role::Active);
    no_mac.mac = None;
    let (dp, _) = applied(&[web(vec![
        backend("10.0.1.1:80", 1, Role::Active),
        backend("10.0.1.2:80", 1, Role::Sticky),
        backend("10.0.1.3:80", 1, Role::Removed),
        no_mac,
    ])]);
    let flags: Vec<u8> = (1..=4).map(|id| dp.backends[&id].flags).collect();
    assert_eq!(
        flags,
        vec![BACKEND_F_LIVE | BACKEND_F_SERVING, BACKEND_F_LIVE, 0, 0],
        "Active = LIVE|SERVING, Sticky = LIVE, Removed and MAC unknown = none"
    );
}

#[test]
fn leaving_traffic_clears_serving_after_the_table_and_keeps_live() {
    let all = two_active();
    let (mut dp, mut p) = applied(&[web(all.clone())]);
    assert_eq!(
        writes(&mut p, &mut dp, &[web(with_role(&all, 1, Role::Sticky))]),
        vec![Write::Slots(0), Write::Backend(2)],
        "table first, then the backend loses SERVING"
    );
    assert_eq!(dp.backends[&2].flags, BACKEND_F_LIVE);
    assert_eq!(slots_of(&dp, 0, 2), 0);
    assert_eq!(
        writes(&mut p, &mut dp, &[web(all)]),
        vec![Write::Backend(2), Write::Slots(0)],
        "SERVING is given before the table points at the backend again"
    );
    assert_eq!(dp.backends[&2].flags, BACKEND_F_LIVE | BACKEND_F_SERVING);
}

#[test]
fn adoption_counts_only_serving_backends_as_up() {
    let svc = web(with_role(&two_active(), 1, Role::Sticky));
    let (dp, _) = applied(std::slice::from_ref(&svc));
    let state = state_of(&dp);
    let mut second = Publisher::default();
    second.adopt(&state);
    let up = |a: &str| second.adopted_live(svc.vip, IPPROTO_TCP, a.parse().unwrap());
    assert_eq!(up("10.0.1.1:80"), Some(true));
    assert_eq!(
        up("10.0.1.2:80"),
        Some(false),
        "a sticky backend (LIVE without SERVING) was not taking traffic"
    );
}

#[test]
fn adoption_of_maps_pinned_before_serving_existed_reads_live_as_in_traffic() {
    let svc = web(with_role(&two_active(), 1, Role::Removed));
    let (dp, _) = applied(std::slice::from_ref(&svc));
    // What the previous version pinned: LIVE alone for a backend in traffic.
    let mut state = state_of(&dp);
    for (_, b) in &mut state.backends {
        b.flags &= !BACKEND_F_SERVING;
    }
    let mut second = Publisher::default();
    second.adopt(&state);
    let up = |a: &str| second.adopted_live(svc.vip, IPPROTO_TCP, a.parse().unwrap());
    assert_eq!(
        (up("10.0.1.1:80"), up("10.0.1.2:80")),
        (Some(true), Some(false))
    );
}
