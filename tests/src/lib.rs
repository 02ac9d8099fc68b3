//! placeholder
pub mod agent;
pub mod bpf;
pub mod cmd;
pub mod interrupt;
pub mod link;
pub mod names;
pub mod netns;
pub mod packet;
pub mod pass_prog;
pub mod process;
pub mod scenario;
pub mod topology;
pub mod traffic;
