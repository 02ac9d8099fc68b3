//! Errors of the data-plane owner.

use std::io;

/// Something the kernel or the object refused.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("loading the XDP object failed")]
    Load(#[source] aya::EbpfError),
    #[error("the XDP object has no program `{name}`")]
    MissingProgram { name: &'static str },
    #[error("the XDP object has no map `{name}`")]
    MissingMap { name: &'static str },
    #[error("program `{name}`")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("interface `{interface}` does not exist")]
    NoSuchInterface { interface: String },
    #[error(
        "attaching XDP to `{interface}` in {mode} mode failed (is that mode supported by its driver?)"
    )]
    Attach {
        interface: String,
        mode: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("map `{name}`")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("Maglev table for service {service_id} has {len} slots, expected {expected}")]
    TableSize {
        service_id: u32,
        len: usize,
        expected: u32,
    },
}
