//! Which build this is: the crate version, the commit it was built from and a hash of the
//! embedded XDP object, as `--version`, `lb-agent status`, the API and `lb_build_info`
//! show them. Two agents with the same three values run the same code on both sides.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// The crate version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit, as `build.rs` found it (`unknown` outside a git checkout without
/// `LB_BUILD_COMMIT`).
pub const COMMIT: &str = env!("LB_BUILD_COMMIT");

/// The three values, for status and the API.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildInfo {
    pub version: String,
    pub commit: String,
    /// `sha256:` and the first 16 hex digits of the embedded XDP object's SHA-256.
    pub bpf: String,
}

/// This binary's build.
pub fn current() -> BuildInfo {
    BuildInfo {
        version: VERSION.to_string(),
        commit: COMMIT.to_string(),
        bpf: bpf_hash().to_string(),
    }
}

/// `sha256:` and the first 16 hex digits of the SHA-256 of [`crate::EBPF_OBJECT`].
pub fn bpf_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        let digest = ring::digest::digest(&ring::digest::SHA256, crate::EBPF_OBJECT);
        let hex: String = digest.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("sha256:{hex}")
    })
}

/// What `lb-agent --version` prints after the program name.
pub fn long_version() -> String {
    format!("{VERSION} (commit {COMMIT}, bpf {})", bpf_hash())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_names_the_commit_and_the_objects_hash() {
        let v = long_version();
        assert!(v.starts_with(VERSION), "{v}");
        assert!(v.contains(&format!("commit {COMMIT}")), "{v}");
        let hash = bpf_hash();
        assert_eq!(hash.len(), "sha256:".len() + 16, "{hash}");
        assert!(
            hash["sha256:".len()..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit())
        );
        assert!(!COMMIT.is_empty());
        assert_eq!(current().bpf, hash);
    }
}
