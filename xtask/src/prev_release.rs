//! The previous release the upgrade scenario runs against (`tests/tests/integration/netns_upgrade.rs`,
//! docs/upgrades.md): the commit named in `tests/previous-release`, exported with `git
//! archive` and built (debug `lb-agent`, as the scenarios' own) under
//! `<target>/prev-release/<commit>/`, reused while its binary is there.
//!
//! The export's target directory is seeded with this tree's dependency artifacts, copied:
//! the debug build's (`target/debug`: `.fingerprint/`, `build/`, the libraries in
//! `deps/`) and the XDP program's (`target/ebpf`, with its `core` built from source).
//! Cargo finds every dependency whose version, features and profile did not change
//! fresh and compiles only the rest, the release's own crates first of all.
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
    // `-m`: the files get the time of extraction, not the commit's. Cargo finds a
    // workspace crate by its path relative to the workspace, so a seeded artifact of
    // this tree's crate would otherwise look newer than the release's sources and be
    // taken as fresh: the release's own crates must always be rebuilt.
    status(
        Command::new("tar")
            .arg("-xmf")
            .arg(&tar)
            .arg("-C")
            .arg(&src),
    )?;
    std::fs::remove_file(&tar)?;

    let channel = pins::Pin::read(&src, pins::USERSPACE_FILE)
        .map_err(anyhow::Error::msg)?
        .channel;
    let seeded = seed_dependencies(&target.join("debug"), &dir.join("target/debug"))?
        + seed_xdp_build(&target.join("ebpf"), &dir.join("target/ebpf"))?;
    println!(
        "building the previous release {commit} with {channel} (once; kept in {}; \
         {seeded} dependency artifacts of this tree's build reused)",
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

/// Copies the dependency artifacts of the debug build in `from` (a cargo profile
/// directory) into `to`: `.fingerprint/` and `build/` whole, and of `deps/` every file
/// with an extension (libraries, metadata, dep-info; not the test executables). Copies,
/// not links: a unit cargo rebuilds in `to` must never write through to `from`. Returns
/// the number of files copied (0 when `from` holds no build).
fn seed_dependencies(from: &Path, to: &Path) -> anyhow::Result<usize> {
    let mut copied = 0;
    for sub in [".fingerprint", "build"] {
        let dir = from.join(sub);
        if dir.is_dir() {
            copied += copy_tree(&dir, &to.join(sub), &|_| true)?;
        }
    }
    let deps = from.join("deps");
    if deps.is_dir() {
        copied += copy_tree(&deps, &to.join("deps"), &|p: &Path| p.extension().is_some())?;
    }
    Ok(copied)
}

/// Copies this tree's XDP program build (`target/ebpf`, whose `core` and
/// `compiler_builtins` are built from source) into `to`; 0 when there is none.
fn seed_xdp_build(from: &Path, to: &Path) -> anyhow::Result<usize> {
    if !from.is_dir() {
        return Ok(0);
    }
    copy_tree(from, to, &|_| true)
}

/// Copies the files of `from` that `keep` accepts into `to`, subdirectories whole
/// (recursively), keeping modification times (cargo's freshness compares them).
fn copy_tree(from: &Path, to: &Path, keep: &dyn Fn(&Path) -> bool) -> anyhow::Result<usize> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    let mut copied = 0;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copied += copy_tree(&src, &dst, &|_| true)?;
        } else if kind.is_file() && keep(&src) {
            std::fs::copy(&src, &dst)
                .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
            let modified = entry.metadata()?.modified()?;
            std::fs::File::options()
                .write(true)
                .open(&dst)?
                .set_modified(modified)
                .with_context(|| format!("setting the time of {}", dst.display()))?;
            copied += 1;
        }
    }
    Ok(copied)
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
