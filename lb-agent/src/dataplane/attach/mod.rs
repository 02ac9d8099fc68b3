//! Putting the program on the interface and keeping it there: the netlink attach and
//! detach (`xdp`), the watch that it stays attached (`link_watch`), the second
//! program it jumps to ([`full_path`]), what tunnel forwarding needs from the interface
//! ([`tunnel`]), the capabilities attaching needs ([`caps`]), and lb's decapsulation
//! program for backends ([`decap`]).

pub mod caps;
pub mod decap;
pub mod full_path;
mod link_watch;
pub mod tunnel;
mod xdp;

pub use link_watch::LinkWatch;
pub(in crate::dataplane) use xdp::attach;
pub use xdp::{AttachMode, detach, if_index};
