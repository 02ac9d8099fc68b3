//! Builds the XDP program (`lb-ebpf`) with the nightly pinned in
//! `lb-ebpf/rust-toolchain.toml` and the bpf-linker built against its LLVM, and tells the
//! crate where the object is (`LB_EBPF_OBJ_PATH`) so the binary embeds it.
//!
//! Set `LB_EBPF_OBJ=/path/to/object` to embed a prebuilt object instead.
//! `cargo xtask setup` installs what this needs (the nightly with rust-src, bpf-linker).

#[path = "../xtask/src/pins.rs"]
#[allow(dead_code)] // the userspace half is for xtask
mod pins;

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

/// Variables the outer (host, stable) cargo sets that must not leak into the nightly
/// BPF build: they would pick the wrong compiler, flags or target.
const SCRUBBED: &[&str] = &[
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTDOC",
    "RUSTFLAGS",
    "RUSTUP_TOOLCHAIN",
    "CARGO",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_BUILD_TARGET",
    "CARGO_TARGET_DIR",
    "CARGO_LLVM_COV",
    "LLVM_PROFILE_FILE",
    "TARGET",
    "HOST",
    "OUT_DIR",
    "PROFILE",
    "OPT_LEVEL",
    "DEBUG",
    "NUM_JOBS",
];

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir
        .parent()
        .context("lb-agent has no parent dir")?;
    let ebpf_dir = workspace.join("lb-ebpf");
    let out = PathBuf::from(env::var("OUT_DIR")?).join("lb-ebpf.o");

    println!("cargo:rerun-if-env-changed=LB_EBPF_OBJ");
    for watched in [
        ebpf_dir.join("src"),
        ebpf_dir.join("Cargo.toml"),
        // Its rustflags (e.g. a target CPU) change the object too.
        ebpf_dir.join(".cargo/config.toml"),
        workspace.join("lb-common/src"),
        workspace.join(pins::EBPF_FILE),
    ] {
        println!("cargo:rerun-if-changed={}", watched.display());
    }

    if let Some(prebuilt) = env::var_os("LB_EBPF_OBJ") {
        fs::copy(&prebuilt, &out)
            .with_context(|| format!("copying LB_EBPF_OBJ={}", Path::new(&prebuilt).display()))?;
    } else {
        let target_dir = env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"))
            .join("ebpf");
        build_ebpf(workspace, &target_dir)?;
        let built = target_dir.join("bpfel-unknown-none/release/lb-ebpf");
        fs::copy(&built, &out).with_context(|| format!("copying {}", built.display()))?;
    }
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

fn build_ebpf(workspace: &Path, target_dir: &Path) -> anyhow::Result<()> {
    let channel = pins::Pin::read(workspace, pins::EBPF_FILE)
        .map_err(anyhow::Error::msg)?
        .channel;
    let linker = pins::bpf_linker(&channel);
    if !linker.exists() {
        bail!(
            "{} is missing: the XDP program links with a bpf-linker built against \
             {channel}'s LLVM. `cargo xtask setup` builds it.",
            linker.display()
        );
    }
    // rustc runs the linker by name: the pinned nightly's bpf-linker goes first on PATH.
    let mut path = vec![linker.parent().expect("bin/bpf-linker").to_path_buf()];
    path.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    let mut cmd = Command::new("rustup");
    cmd.args([
        "run",
        &channel,
        "cargo",
        "build",
        "--release",
        "--target-dir",
    ])
    .arg(target_dir)
    .env("PATH", env::join_paths(path)?)
    .current_dir(workspace.join("lb-ebpf"));
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        if SCRUBBED.contains(&key.as_ref())
            || key.starts_with("CARGO_CFG_")
            || key.starts_with("CARGO_FEATURE_")
            || key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
        {
            cmd.env_remove(key.as_ref());
        }
    }
    let status = cmd
        .status()
        .with_context(|| format!("running `rustup run {channel} cargo build` for lb-ebpf"))?;
    if !status.success() {
        bail!(
            "building the XDP program (lb-ebpf) failed: {status}. \
             It needs {channel} with rust-src and its bpf-linker; \
             `cargo xtask setup` installs them."
        );
    }
    Ok(())
}
