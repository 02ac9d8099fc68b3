//! The pinned toolchains, read from their `rust-toolchain.toml` files (the single source
//! of truth), and where the XDP program's bpf-linker lives. Shared by `cargo xtask setup`
//! (which installs them) and the build scripts `lb-agent/build.rs` and `tests/build.rs`
//! (which build with them, via `#[path]`).

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

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask lives in the workspace")
            .to_path_buf()
    }

    #[test]
    fn the_repository_pins_a_stable_release_and_a_dated_nightly() {
        let userspace = Pin::read(&workspace(), USERSPACE_FILE).expect("userspace pin");
        assert!(
            userspace.channel.split('.').count() == 3
                && userspace
                    .channel
                    .split('.')
                    .all(|p| p.parse::<u32>().is_ok()),
            "a stable release like 1.99.1, got {:?}",
            userspace.channel
        );
        assert!(userspace.components.iter().any(|c| c == "rustfmt"));
        assert!(userspace.components.iter().any(|c| c == "clippy"));
        let ebpf = Pin::read(&workspace(), EBPF_FILE).expect("nightly pin");
        let date = ebpf.channel.strip_prefix("nightly-").unwrap_or_default();
        assert_eq!(
            date.len(),
            "2026-08-01".len(),
            "a dated nightly, got {:?}",
            ebpf.channel
        );
        assert!(ebpf.components.iter().any(|c| c == "rust-src"));
    }

    #[test]
    fn a_file_without_a_channel_is_an_error() {
        let dir = std::env::temp_dir().join(format!("lb-pins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(
            dir.join("t.toml"),
            "[toolchain]\ncomponents = [\"rust-src\"]\n",
        )
        .expect("writing");
        let read = Pin::read(&dir, "t.toml");
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert!(read.unwrap_err().contains("names no channel"));
    }

    #[test]
    fn the_bpf_linker_lives_in_a_prefix_named_after_the_nightly() {
        let linker = bpf_linker("nightly-2026-08-01");
        assert!(linker.ends_with("lb-toolchain/nightly-2026-08-01/bin/bpf-linker"));
    }
}
