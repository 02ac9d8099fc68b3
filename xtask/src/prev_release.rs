//! The previous release the upgrade scenario runs against (`tests/tests/netns_upgrade.rs`,
//! docs/upgrades.md): the commit named in `tests/previous-release`, exported with `git
//! archive` and built (debug `lb-agent`, as the scenarios' own) under
//! `<target>/prev-release/<commit>/`, reused while its binary is there.
//!
//! The export builds with the toolchains its own files pin (the userspace one from its
//! `rust-toolchain.userspace.toml`; its `lb-agent/build.rs` finds its nightly and
//! bpf-linker as any build does), so they must be installed: `cargo xtask setup` installs
//! this tree's, which are the same as long as the pins have not moved since.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, bail};

use crate::pins;

/// The file naming the previous release's commit (full hash), relative to the root.
pub const COMMIT_FILE: &str = "tests/previous-release";

/// Builds the previous release's `lb-agent` unless it is already built; returns its path.
pub fn build(root: &Path, target: &Path) -> anyhow::Result<PathBuf> {
    let commit = read_commit(root)?;
    let dir = target.join("prev-release").join(&commit);
    let bin = dir.join("target/debug/lb-agent");
    let stamp = dir.join("built");
    if bin.is_file() && stamp.is_file() {
        println!(
            "previous release {commit}: {} (built before)",
            bin.display()
        );
        return Ok(bin);
    }
    reachable(root, &commit)?;
    let src = dir.join("src");
    if src.exists() {
        std::fs::remove_dir_all(&src).with_context(|| format!("removing {}", src.display()))?;
    }
    std::fs::create_dir_all(&src)?;
    let tar = dir.join("src.tar");
    status(
        Command::new("git")
            .args(["archive", "--format=tar", "-o"])
            .arg(&tar)
            .arg(&commit)
            .current_dir(root),
    )?;
    status(Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&src))?;
    std::fs::remove_file(&tar)?;

    let channel = pins::Pin::read(&src, pins::USERSPACE_FILE)
        .map_err(anyhow::Error::msg)?
        .channel;
    println!(
        "building the previous release {commit} with {channel} (once; kept in {})",
        dir.display()
    );
    let started = Instant::now();
    status(
        Command::new("cargo")
            .arg(format!("+{channel}"))
            .args(["build", "--locked", "-p", "lb-agent", "--bin", "lb-agent"])
            .current_dir(&src)
            .env("CARGO_TARGET_DIR", dir.join("target"))
            .env("LB_BUILD_COMMIT", &commit[..12])
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC"),
    )
    .with_context(|| {
        format!(
            "building the previous release {commit} (it needs the toolchains its \
             rust-toolchain files pin; `cargo xtask setup` installs this tree's)"
        )
    })?;
    if !bin.is_file() {
        bail!("the previous release's build left no {}", bin.display());
    }
    std::fs::write(&stamp, format!("{}\n", started.elapsed().as_secs()))?;
    println!(
        "built the previous release {commit} in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        bin.display()
    );
    Ok(bin)
}

fn read_commit(root: &Path) -> anyhow::Result<String> {
    let path = root.join(COMMIT_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let commit = text.trim().to_string();
    if commit.len() != 40 || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "{} must hold a full 40-digit commit hash, not {commit:?}",
            path.display()
        );
    }
    Ok(commit)
}

/// Makes sure `commit` is in the clone: a shallow clone is deepened (`git fetch
/// --unshallow`); a commit still missing is an error that says what to do.
fn reachable(root: &Path, commit: &str) -> anyhow::Result<()> {
    let present = |root: &Path| {
        Command::new("git")
            .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
            .current_dir(root)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if present(root) {
        return Ok(());
    }
    let shallow = Command::new("git")
        .args(["rev-parse", "--is-shallow-repository"])
        .current_dir(root)
        .output()
        .context("running git")?;
    if String::from_utf8_lossy(&shallow.stdout).trim() == "true" {
        println!(
            "the clone is shallow and lacks the previous release {commit}: git fetch --unshallow"
        );
        status(
            Command::new("git")
                .args(["fetch", "--unshallow"])
                .current_dir(root),
        )?;
        if present(root) {
            return Ok(());
        }
    }
    bail!(
        "the previous release {commit} ({COMMIT_FILE}) is not in this clone: the upgrade \
         scenario builds it. Fetch it (`git fetch origin {commit}`, or clone without \
         --depth), or name a reachable commit in {COMMIT_FILE}"
    )
}

fn status(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let st = cmd.status().with_context(|| format!("running {shown}"))?;
    if !st.success() {
        bail!("{shown} failed: {st}");
    }
    Ok(())
}
