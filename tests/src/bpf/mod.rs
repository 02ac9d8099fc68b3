//! lb's XDP object outside the agent: loaded for BPF_PROG_TEST_RUN fixtures
//! ([`object`], [`maps`]), its stack use ([`stack`]) and clock ([`clock`]); the lab object
//! ([`lab`]) with the programs that peers of a test bed run ([`pass_prog`],
//! [`drop_prog`], [`syn_responder`]); and the packet-parser fuzz target ([`fuzz`]) with
//! its mutations ([`mutate`]) and reference classifier ([`classify`]).

pub mod classify;
pub mod clock;
pub mod drop_prog;
pub mod fuzz;
pub mod lab;
pub mod maps;
pub mod mutate;
pub mod object;
pub mod pass_prog;
pub mod stack;
pub mod syn_responder;
