//! The root-only test library of lb: what the BPF fixtures (`tests/bpf_fixtures.rs`),
//! the network-namespace scenarios (`tests/netns_*.rs`) and the benchmark and demo
//! binaries (`src/bin/`) build on. Everything here drives the real kernel and the real
//! `lb-agent`; nothing is mocked.
//!
//! # Groups
//!
//! - [`util`]: the library's error ([`util::error::Error`]), setup commands, child
//!   processes in a namespace, temporary directories, JSON, the Ctrl-C flag.
//! - [`net`]: namespaces, links, the switch every bed plugs its hosts into
//!   ([`net::switch::Switch`]), and the network-only beds.
//! - [`traffic`]: clients, servers' peers, pacers, and hand-built frames on a wire.
//! - [`bpf`]: lb's XDP object loaded for BPF_PROG_TEST_RUN, its maps, the lab object with
//!   the programs peers run, and the parser fuzz target.
//! - [`agent`]: the real `lb-agent` started from a rendered config, its API, its tables
//!   read from outside, and operator helpers (systemd unit, container, upgrade).
//! - [`bench`]: CPU accounting, flood readings and the comparison balancer of the
//!   benchmarks.
//! - [`scenario`]: beds with servers, a service and a running agent, and the pieces each
//!   family of scenarios shares.
//!
//! # Which bed for what
//!
//! | bed | network | use it for |
//! |-----|---------|------------|
//! | [`net::topology::Topology`] | client, lb, `b1..bN` on one bridge | anything one-armed on one segment: balance, health, reload, restart, nat, dsr |
//! | [`net::routed_segment::RoutedSegment`] | a `Topology` plus a segment behind two routers | a backend whose route or gateway changes |
//! | [`net::tunnel_bed::TunnelBed`] | backends on subnets of their own behind a router | tunnel forwarding |
//! | [`net::pmtu::PmtuNet`] | client and backend behind routers with a small MTU | ICMP "fragmentation needed" and path MTU |
//! | [`net::multinode::MultiNode`] | two lb nodes, BIRD, an ECMP router | multi-node BGP, dead-man switch |
//! | [`scenario::balance::Testbed`] | a `Topology` with servers, a weighted service and the agent | balance shares, the demo |
//! | [`scenario::syn_bed::SynBed`] | a `Topology` with a nat service probed by SYN and connect | the SYN check |
//! | [`scenario::realistic::Bed`] | a `Topology` with HTTP backends and passive health | realistic traffic, `lb-soak`, chaos |
//!
//! A scenario takes the smallest bed that has what it asserts on; the network-only beds
//! leave the agent and servers to the scenario.

pub mod agent;
pub mod bench;
pub mod bpf;
pub mod net;
pub mod scenario;
pub mod traffic;
pub mod util;
