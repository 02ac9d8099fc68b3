//! Traffic the scenarios send and answer: clients that learn which backend answered
//! ([`clients`]), a long paced download ([`download`]), users' ordinary connections ([`ordinary`]) and paced ones with a
//! timeline ([`pacer`]), and frames no socket would send: built ([`packet`]), put on a
//! wire ([`inject`], [`frame_stream`]), forged ICMP errors ([`icmp_forge`]) and forged
//! SYN replies ([`syn_forge`]).

pub mod arrivals;
pub mod clients;
pub mod download;
pub mod frame_stream;
pub mod icmp_forge;
pub mod inject;
pub mod ordinary;
pub mod pacer;
pub mod packet;
pub mod spread;
pub mod syn_forge;
