//! `cargo xtask clippy-ebpf`: clippy with `-D warnings` over lb-ebpf, which the
//! workspace's `cargo clippy` never reaches (it is outside the workspace, on its own
//! nightly and target), for both objects the build scripts embed.

use std::path::Path;

use crate::ebpf_build;

/// The objects' features and target subdirectories, as `lb-agent/build.rs` (the product)
/// and `tests/build.rs` (the lab's programs) build them: clippy then shares their
/// dependencies' check results.
const BUILDS: [(&[&str], &str); 2] = [(&[], "ebpf"), (&["lab"], "ebpf-lab")];

/// Runs clippy over each of [`BUILDS`], in the release profile the objects are built in.
pub fn run(root: &Path, target_dir: &Path) -> anyhow::Result<()> {
    let channel = ebpf_build::channel(root)?;
    for (features, subdir) in BUILDS {
        let mut cmd = ebpf_build::nightly_cargo(root, &channel);
        cmd.args(["clippy", "--release", "--target-dir"])
            .arg(target_dir.join(subdir));
        if !features.is_empty() {
            cmd.args(["--features", &features.join(",")]);
        }
        cmd.args(["--", "-D", "warnings"]);
        crate::status(&mut cmd)?;
    }
    Ok(())
}
