//! Builds the XDP program (`lb-ebpf`) with the nightly pinned in
//! `lb-ebpf/rust-toolchain.toml` and the bpf-linker built against its LLVM, and tells the
//! crate where the object is (`LB_EBPF_OBJ_PATH`) so the binary embeds it.
//!
//! Set `LB_EBPF_OBJ=/path/to/object` to embed a prebuilt object instead.
//! `cargo xtask setup` installs what this needs (the nightly with rust-src, bpf-linker).

#[path = "../xtask/src/pins.rs"]
#[allow(dead_code)] // the userspace half is for xtask
mod pins;

#[path = "../xtask/src/ebpf_build.rs"]
mod ebpf_build;

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir
        .parent()
        .context("lb-agent has no parent dir")?;
    // The product object: never the `lab` feature (its programs are lb-tests').
    let out = ebpf_build::Object {
        prebuilt_var: "LB_EBPF_OBJ",
        target_subdir: "ebpf",
        features: &[],
        file: "lb-ebpf.o",
    }
    .build(workspace)?;
    println!("cargo:rustc-env=LB_EBPF_OBJ_PATH={}", out.display());
    println!("cargo:rustc-env=LB_BUILD_COMMIT={}", commit(workspace));
    Ok(())
}

/// The commit the build comes from: `LB_BUILD_COMMIT` when set (a build from a source
/// tarball), else `git rev-parse --short=12 HEAD`, else `unknown`. Rebuilt when HEAD
/// moves.
fn commit(workspace: &Path) -> String {
    println!("cargo:rerun-if-env-changed=LB_BUILD_COMMIT");
    if let Ok(commit) = env::var("LB_BUILD_COMMIT") {
        return commit;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(workspace)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    // HEAD, the branch it names and packed refs: a commit or checkout changes one. Only
    // files that exist: cargo takes a missing one as changed at every build.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(p) = git(&["rev-parse", "--git-path", &name]) {
            let p = workspace.join(p);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
}
