//! BPF_PROG_TEST_RUN fixtures for `lb_xdp` (Katran style): a description, the input
//! frame, the expected XDP action, the expected output frame and the expected counter
//! deltas (every counter not listed must not move; `rx` always moves by one).
//!
//! Needs root (BPF). Output checksums are verified twice, independently of
//! `lb_common::csum`: by byte comparison with frames built from scratch by
//! `lb_tests::traffic::packet` (its own RFC 1071 sum) and by `etherparse`.
//!
//! Layout: [`world`] the services every fixture starts from, [`fixture`] the runner
//! and comparisons; one module per concern: [`dsr`], [`nat`], [`malformed`],
//! [`nat_ports`], [`hostile`], [`flows`], [`partial_csum`] the checksums native mode completes, [`passive`], [`syn_resend`], [`icmp`], [`vips`], [`cache`], [`settled`], [`split`], [`stack`] the stack budget, [`tables`] the tables' load-time sizes and seeds, [`flood`] SYN floods against established flows, [`tunnel`] ipip/gue and `lb_decap`,
//! [`testbed`] the probe bench's SYN responder, [`cluster`] connections shared between nodes, and [`lab`] the lab object against the
//! product's (files under `bpf_fixtures/`).
//!
//! The object is verified once per process: `Lb::load` hands a dropped object out again
//! with every map reset ([`reuse`] checks that this is a fresh load's state).

#[path = "bpf_fixtures/cache.rs"]
mod cache;
#[path = "bpf_fixtures/cluster.rs"]
mod cluster;
#[path = "bpf_fixtures/dsr.rs"]
mod dsr;
#[path = "bpf_fixtures/fixture.rs"]
mod fixture;
#[path = "bpf_fixtures/flood.rs"]
mod flood;
#[path = "bpf_fixtures/flow_table.rs"]
mod flow_table;
#[path = "bpf_fixtures/flows.rs"]
mod flows;
#[path = "bpf_fixtures/hostile.rs"]
mod hostile;
#[path = "bpf_fixtures/icmp.rs"]
mod icmp;
#[path = "bpf_fixtures/lab.rs"]
mod lab;
#[path = "bpf_fixtures/maglev_pool.rs"]
mod maglev_pool;
#[path = "bpf_fixtures/malformed.rs"]
mod malformed;
#[path = "bpf_fixtures/nat.rs"]
mod nat;
#[path = "bpf_fixtures/nat_handshake.rs"]
mod nat_handshake;
#[path = "bpf_fixtures/nat_ports.rs"]
mod nat_ports;
#[path = "bpf_fixtures/nat_table.rs"]
mod nat_table;
#[path = "bpf_fixtures/partial_csum.rs"]
mod partial_csum;
#[path = "bpf_fixtures/passive.rs"]
mod passive;
#[path = "bpf_fixtures/reuse.rs"]
mod reuse;
#[path = "bpf_fixtures/settled.rs"]
mod settled;
#[path = "bpf_fixtures/split.rs"]
mod split;
#[path = "bpf_fixtures/stack.rs"]
mod stack;
#[path = "bpf_fixtures/syn_resend.rs"]
mod syn_resend;
#[path = "bpf_fixtures/tables.rs"]
mod tables;
#[path = "bpf_fixtures/testbed.rs"]
mod testbed;
#[path = "bpf_fixtures/tunnel.rs"]
mod tunnel;
#[path = "bpf_fixtures/vips.rs"]
mod vips;
#[path = "bpf_fixtures/world.rs"]
mod world;

/// Everything the fixture modules share.
mod prelude {
    pub use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    pub use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    pub use lb_common::{
        IPPROTO_TCP, IPPROTO_UDP, MAGLEV_RING_SIZE, MAX_BACKENDS, NO_BACKEND, counters,
        counters::*,
        events::{EVENT_ICMP_UNREACH, EVENT_RST_ON_SYN, EVENT_SYN_RETRANSMIT, event_name},
        maps::{
            BACKEND_F_LIVE, BACKEND_F_SERVING, Backend, FLOW_F_NAT_AWAIT, FLOW_F_REPORTED,
            FLOW_F_SYN_PENDING, FlowKey, NatValue, SERVICE_F_NAT, ServiceMeta,
        },
    };
    pub use lb_tests::{
        bpf::object::{
            Lb, Run, XDP_DROP, XDP_PASS, XDP_TX, action_name, addr_words, family, flow_key,
        },
        traffic::packet::*,
    };

    pub use super::{fixture::*, world::*};
}

use prelude::*;

#[test]
fn pass_program() {
    let mut lb = Lb::load();
    let f = to_vip(DSR4, CPORT, TCP_SYN);
    let run = lb.run_prog(lb_common::PASS_PROGRAM_NAME, &f.bytes());
    assert_eq!(run.action, XDP_PASS, "lb_pass passes");
    assert_frames_eq("lb_pass leaves the frame alone", &f.bytes(), &run.out);
}
