//! The pinned toolchains, read from their `rust-toolchain.toml` files (the single source
//! of truth), and where the XDP program's bpf-linker lives. Shared by `cargo xtask setup`
//! (which installs them) and `lb-agent/build.rs` (which builds with them, via `#[path]`).

use std::path::{Path, PathBuf};

/// The userspace toolchain's file, relative to the workspace root (not
/// `rust-toolchain.toml`, which rustup would read before setup could install it).
pub const USERSPACE_FILE: &str = "rust-toolchain.userspace.toml";
/// The XDP program's toolchain file (a dated nightly), relative to the workspace root.
pub const EBPF_FILE: &str = "lb-ebpf/rust-toolchain.toml";

/// A `[toolchain]` table: the channel and the components it must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub channel: String,
    pub components: Vec<String>,
}

impl Pin {
    /// Reads `file` (relative to `workspace`). Only the two keys used here are parsed,
    /// each on one line: `channel = "..."` and `components = ["...", ...]`.
    pub fn read(workspace: &Path, file: &str) -> Result<Pin, String> {
        let path = workspace.join(file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let value = |key: &str| {
            text.lines()
                .filter_map(|line| line.trim().strip_prefix(key))
                .find_map(|rest| rest.trim_start().strip_prefix('='))
                .map(str::trim)
        };
        let channel = value("channel")
            .map(|v| v.trim_matches('"').to_owned())
            .filter(|c| !c.is_empty())
            .ok_or_else(|| format!("{} names no channel", path.display()))?;
        let components = value("components")
            .map(|v| {
                v.trim_start_matches('[')
                    .trim_end_matches(']')
                    .split(',')
                    .map(|c| c.trim().trim_matches('"').to_owned())
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        Ok(Pin {
            channel,
            components,
        })
    }
}

/// `$CARGO_HOME/lb-toolchain/<channel>`: `lib/` links the nightly's libLLVM, `bin/`
/// holds the bpf-linker built against it. One prefix per nightly, so a bpf-linker built
/// for another nightly's LLVM (as `~/.cargo/bin/bpf-linker` may be) is never picked up.
pub fn prefix(channel: &str) -> PathBuf {
    cargo_home().join("lb-toolchain").join(channel)
}

/// The bpf-linker for the nightly `channel`.
pub fn bpf_linker(channel: &str) -> PathBuf {
    prefix(channel).join("bin/bpf-linker")
}

/// `$CARGO_HOME`, or `~/.cargo`.
pub fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
}
