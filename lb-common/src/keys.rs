//! The keys the hashes and tables work on: a virtual service's identity ([`VipKey`]) and a
//! 5-tuple ([`FlowKey`]); [`crate::maps`] re-exports both with the other map types.
//!
//! Addresses are `[u32; 4]` holding the bytes exactly as they appear on the wire
//! ("network order"); an IPv4 address uses word 0 and leaves words 1..3 zero.

use core::mem::size_of;

/// A virtual service's identity (VIP address, port, protocol, family): the key the
/// `LB_VIP_INDEX` slots hold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VipKey {
    /// VIP address, network order.
    pub addr: [u32; 4],
    /// VIP port, network order.
    pub port: u16,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
}
const _: () = assert!(size_of::<VipKey>() == 20);

/// `LB_FLOWS` and `LB_NAT` key: a 5-tuple as seen on the wire in one direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// Source address, network order.
    pub src: [u32; 4],
    /// Destination address, network order.
    pub dst: [u32; 4],
    /// Source port, network order.
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<FlowKey>() == 40);
