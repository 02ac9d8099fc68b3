//! lb's agent: configuration, Maglev tables and the data-plane owner.
//!
//! Layout:
//! - [`config`]: the TOML configuration (DESIGN.md §7), validated with file/line/key errors;
//! - [`maglev`]: the pure weighted Maglev table builder;
//! - [`membership`]: per-service roles from health, admin, spares, backup levels, cap, fail-open;
//! - [`dataplane`]: the single owner of every BPF map handle (load, attach, publish, read).
pub mod config;
pub mod maglev;
pub mod membership;

/// The XDP object built by `build.rs`, embedded so the binary is one file to copy.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LB_EBPF_OBJ_PATH"));
