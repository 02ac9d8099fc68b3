//! placeholder
pub mod agent;
pub mod api;
pub mod bpf;
pub mod bpffs;
pub mod cmd;
pub mod interrupt;
pub mod json;
pub mod link;
pub mod names;
pub mod netns;
pub mod packet;
pub mod pass_prog;
pub mod process;
pub mod redundancy;
pub mod scenario;
pub mod topology;
pub mod traffic;
