//! lb's agent library.
/// The XDP object built by `build.rs`, embedded so the binary is one file to copy.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LB_EBPF_OBJ_PATH"));
