//! Putting the program on the interface and keeping it there: the netlink attach and
//! detach (`xdp`), the watch that it stays attached (`link_watch`), the second
//! program it jumps to ([`full_path`]), what tunnel forwarding needs from the interface
//! ([`tunnel`]) and the tc program that sends out what generic mode merged
//! ([`tunnel_gso`]), the capabilities attaching needs ([`caps`]), and lb's
//! decapsulation program for backends ([`decap`]).

pub mod caps;
pub mod decap;
pub mod full_path;
mod link_watch;
pub mod tunnel;
pub mod tunnel_gso;
mod xdp;

pub use link_watch::LinkWatch;
pub(in crate::dataplane) use xdp::attach;
pub use xdp::{AttachMode, detach, if_index};

/// Program `name` of `ebpf`, as the program type `P`.
pub(in crate::dataplane) fn program<'a, P>(
    ebpf: &'a mut aya::Ebpf,
    name: &'static str,
) -> Result<&'a mut P, crate::dataplane::DataplaneError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(crate::dataplane::DataplaneError::MissingProgram { name })?
        .try_into()
        .map_err(|source| crate::dataplane::DataplaneError::Program { name, source })
}
