//! Builds lb-ebpf's object with the nightly pinned in `lb-ebpf/rust-toolchain.toml` and
//! the bpf-linker built against its LLVM, for the build scripts that embed one: the
//! product object (`lb-agent/build.rs`) and the lab's (`tests/build.rs`, the `lab`
//! feature). Included by both through `#[path]`, next to [`crate::pins`].

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use crate::pins;

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

/// One object of lb-ebpf a build script embeds.
pub struct Object<'a> {
    /// The variable naming a prebuilt object to embed instead of building one.
    pub prebuilt_var: &'a str,
    /// The build's own directory under the workspace's target dir (`ebpf`, `ebpf-lab`).
    pub target_subdir: &'a str,
    /// lb-ebpf's cargo features (none for the product).
    pub features: &'a [&'a str],
    /// The object's file name in `OUT_DIR`.
    pub file: &'a str,
}

impl Object<'_> {
    /// Builds the object (or copies the prebuilt one) into `OUT_DIR` and returns its
    /// path there; tells cargo what to watch.
    pub fn build(&self, workspace: &Path) -> anyhow::Result<PathBuf> {
        let ebpf_dir = workspace.join("lb-ebpf");
        let out = PathBuf::from(env::var("OUT_DIR")?).join(self.file);

        println!("cargo:rerun-if-env-changed={}", self.prebuilt_var);
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

        if let Some(prebuilt) = env::var_os(self.prebuilt_var) {
            fs::copy(&prebuilt, &out).with_context(|| {
                format!(
                    "copying {}={}",
                    self.prebuilt_var,
                    Path::new(&prebuilt).display()
                )
            })?;
        } else {
            let target_dir = env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace.join("target"))
                .join(self.target_subdir);
            build_ebpf(workspace, &target_dir, self.features)?;
            let built = target_dir.join("bpfel-unknown-none/release/lb-ebpf");
            fs::copy(&built, &out).with_context(|| format!("copying {}", built.display()))?;
        }
        Ok(out)
    }
}

/// The nightly pinned in `lb-ebpf/rust-toolchain.toml`.
pub fn channel(workspace: &Path) -> anyhow::Result<String> {
    Ok(pins::Pin::read(workspace, pins::EBPF_FILE)
        .map_err(anyhow::Error::msg)?
        .channel)
}

/// `rustup run <channel> cargo` in lb-ebpf/, without the variables of the outer cargo
/// ([`SCRUBBED`] and its per-crate ones): lb-ebpf's own toolchain file and
/// `.cargo/config.toml` then pick its compiler, target and flags.
pub fn nightly_cargo(workspace: &Path, channel: &str) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", channel, "cargo"])
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
    cmd
}

/// Builds lb-ebpf with `features` into `target_dir` (`bpfel-unknown-none/release/lb-ebpf`).
pub fn build_ebpf(workspace: &Path, target_dir: &Path, features: &[&str]) -> anyhow::Result<()> {
    let channel = channel(workspace)?;
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
    let mut cmd = nightly_cargo(workspace, &channel);
    cmd.args(["build", "--release", "--target-dir"])
        .arg(target_dir)
        .env("PATH", env::join_paths(path)?);
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    let status = cmd
        .status()
        .with_context(|| format!("running `rustup run {channel} cargo build` for lb-ebpf"))?;
    if !status.success() {
        bail!(
            "building the XDP program (lb-ebpf{}) failed: {status}. \
             It needs {channel} with rust-src and its bpf-linker; \
             `cargo xtask setup` installs them.",
            if features.is_empty() {
                String::new()
            } else {
                format!(", features {}", features.join(","))
            }
        );
    }
    Ok(())
}
