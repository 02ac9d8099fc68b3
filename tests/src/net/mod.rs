//! Network namespaces, links, and the network-only test beds the scenarios run on.
//!
//! - [`netns`], [`link`], [`names`]: namespaces and links as RAII guards, with unique
//!   names and the sweep of what a dead test left behind; [`forward`] opens a port of a
//!   namespace to the host.
//! - [`switch::Switch`]: the bridge namespace a bed plugs its hosts into, with `lb_pass`
//!   on its ports (where a bed asks for it); [`topology::Topology`],
//!   [`tunnel_bed::TunnelBed`], [`pmtu::PmtuNet`] and [`multinode::MultiNode`] are built
//!   on it.
//! - [`topology::Topology`]: one bridge with `client`, `lb` and `b1..bN` on it; the
//!   default bed, and the base that [`routed_segment::RoutedSegment`] extends with a
//!   second segment behind two routers.
//! - [`tunnel_bed::TunnelBed`]: backends on subnets of their own behind a router (tunnel
//!   forwarding).
//! - [`pmtu::PmtuNet`]: client and backend behind routers with a small path MTU.
//! - [`multinode::MultiNode`]: two lb nodes announcing the VIP over BGP to an ECMP router.

pub mod forward;
pub mod link;
pub mod multinode;
pub mod names;
pub mod netns;
pub mod pmtu;
pub mod routed_segment;
pub mod switch;
pub mod topology;
pub mod tunnel_bed;
