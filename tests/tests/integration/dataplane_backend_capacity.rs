//! Backends past the compiled 16,383 (root): the backend maps sized at load
//! (`agent.max_backends`) take 20,000 backends published by the agent's publisher, and a
//! packet to a service whose backends have ids past 16,383 is steered to one of them
//! (BPF_PROG_TEST_RUN on the real maps); the compiled size refuses the same publish.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use aya::programs::{TestRun, TestRunOptions};
use lb_agent::{
    dataplane::{BpfDataplane, Dataplane, MapSizes},
    publish::{DesiredBackend, DesiredService, PublishError, Publisher, Role},
};
use lb_common::{IPPROTO_TCP, MAX_BACKENDS};
use lb_tests::traffic::packet::{Frame, TCP_SYN};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const BIG: usize = 20_000;
/// The second service's backends: their ids come after the first service's 20,000.
const SMALL: usize = 8;

fn mac_of(i: usize) -> [u8; 6] {
    let b = (i as u32).to_be_bytes();
    [0x02, 0xbb, b[0], b[1], b[2], b[3]]
}

fn dsr_service(name: &str, vip: [u8; 4], first: usize, count: usize) -> DesiredService {
    DesiredService {
        name: name.into(),
        vip: SocketAddr::new(IpAddr::V4(Ipv4Addr::from(vip)), 80),
        proto: IPPROTO_TCP,
        tunnel: None,
        nat: None,
        backends: (first..first + count)
            .map(|i| DesiredBackend {
                addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i as u32 + 1)), 80),
                weight: 1,
                mac: Some(mac_of(i)),
                role: Role::Active,
            })
            .collect(),
        maglev_size: None,
    }
}

fn wanted() -> Vec<DesiredService> {
    vec![
        dsr_service("big", [10, 9, 0, 1], 0, BIG),
        dsr_service("small", [10, 9, 0, 2], BIG, SMALL),
    ]
}

#[test]
fn twenty_thousand_backends_publish_and_a_packet_reaches_one_past_16383() {
    let sizes = MapSizes::for_backends(131_071).expect("in range");
    let mut dp = BpfDataplane::load_sized(None, None, sizes).expect("loading (root?)");
    assert_eq!(dp.max_backends(), 131_071);
    dp.set_interface_mac(LB_MAC).expect("LB_CONFIG");
    let mut publisher = Publisher::with_max_backends(dp.max_backends());
    publisher
        .apply(&wanted(), &mut dp)
        .expect("publishing 20,008 backends");

    let ids: Vec<u32> = wanted()[1]
        .backends
        .iter()
        .map(|b| publisher.backend_id("small", &b.addr).expect("published"))
        .collect();
    assert!(
        ids.iter().all(|&id| id >= MAX_BACKENDS),
        "the small service's ids are past the compiled size: {ids:?}"
    );
    let state = dp.published_state().expect("reading back");
    assert_eq!(
        state.backends.len(),
        BIG + SMALL,
        "every entry is in LB_BACKENDS"
    );

    // Several client ports: every SYN to the small service is sent (XDP_TX) to one of
    // its backends' MACs, and the backend's counters (LB_BACKEND_STATS) count it.
    let macs: Vec<[u8; 6]> = (BIG..BIG + SMALL).map(mac_of).collect();
    let client = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
    let vip = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 2));
    for port in 40_000..40_016u16 {
        let syn = Frame::tcp(client, port, vip, 80, TCP_SYN)
            .macs([0x02, 0, 0, 0, 0, 0x02], LB_MAC)
            .bytes();
        let mut out = vec![0u8; syn.len() + 256];
        let result = dp
            .program_mut()
            .expect("lb_xdp")
            .test_run(TestRunOptions {
                data_in: Some(&syn),
                data_out: Some(&mut out),
                ..TestRunOptions::default()
            })
            .expect("BPF_PROG_TEST_RUN");
        assert_eq!(result.return_value, 3, "XDP_TX (port {port})");
        let dst: [u8; 6] = out[..6].try_into().expect("a frame");
        assert!(
            macs.contains(&dst),
            "to a backend of the small service: {dst:02x?}"
        );
    }
    let forwarded: u64 = ids
        .iter()
        .map(|&id| dp.backend_stats(id).expect("stats").new_flows)
        .sum();
    assert_eq!(
        forwarded, 16,
        "LB_BACKEND_STATS counts them at ids past 16,383"
    );
}

#[test]
fn the_compiled_size_refuses_the_same_publish() {
    let mut dp = BpfDataplane::load().expect("loading (root?)");
    assert_eq!(dp.max_backends(), MAX_BACKENDS - 1);
    let mut publisher = Publisher::with_max_backends(dp.max_backends());
    match publisher.apply(&wanted(), &mut dp) {
        Err(PublishError::TooManyBackends { max }) => assert_eq!(max, MAX_BACKENDS - 1),
        other => panic!("expected TooManyBackends, got {other:?}"),
    }
}
