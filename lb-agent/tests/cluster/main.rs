//! The cluster component over real QUIC on loopback, several nodes in one process:
//! records converge, a bulk resync carries many records, a restarted node catches up,
//! and wrong keys, foreign nodes, other member lists, replayed and forged datagrams are
//! refused, counted, and change nothing.

mod converge;
mod refusals;
mod util;
