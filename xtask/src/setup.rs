//! `cargo xtask setup`: make a fresh machine able to build and test lb, idempotently.
//!
//! - the userspace toolchain pinned in `rust-toolchain.userspace.toml` with its components,
//!   made the rustup directory override of the workspace (plain `cargo` there uses it);
//! - the dated nightly pinned in `lb-ebpf/rust-toolchain.toml` with `rust-src` (the eBPF
//!   crate builds `core` itself), the override of `lb-ebpf/` (a parent's override would
//!   otherwise win over that directory's toolchain file);
//! - bpf-linker built against that nightly's own libLLVM (no system LLVM of that version
//!   exists here), in a prefix named after the nightly (`pins::prefix`): the library is
//!   linked into the prefix and bpf-linker built with `LLVM_PREFIX` pointing at it
//!   (DESIGN.md §2, docs/internals/toolchain.md);
//! - the Debian packages the tests and benchmarks use: only for `cargo xtask test` and
//!   `bench` ([`test_packages`]), so that building and running the product needs none.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, bail};

use crate::pins::{self, Pin};

/// The bpf-linker release built for the pinned nightly (0.13 supports LLVM 21 to 23).
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages the tests and benchmarks need, with a command that proves each
/// (`chromium`: the status page's browser test; `bird2`: the multi-node scenarios run
/// BIRD in namespaces, docs/multi-node.md; `nftables`: the SYN-check scenarios make a
/// backend silent or forge its answers with `nft` rules, and the end-to-end benchmark's
/// baseline is an nftables DNAT host; `iputils-arping`: the neighbour scenarios announce a
/// moved backend with a gratuitous ARP, as keepalived does; `prometheus`: `promtool`
/// checks and unit-tests the contrib alert rules and the dashboard's queries;
/// `keepalived`: `lb-agent import` is tested on the sample configurations it ships;
/// `lintian`: the package test checks the .deb with it).
const PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip"),
    ("chromium", "chromium"),
    ("bird2", "bird"),
    ("nftables", "nft"),
    ("iputils-arping", "arping"),
    ("prometheus", "promtool"),
    ("keepalived", "keepalived"),
    ("lintian", "lintian"),
];
/// The Debian packages of the tests and benchmarks ([`PACKAGES`]); `cargo xtask test`
/// and `bench` install what is missing.
pub fn test_packages() -> anyhow::Result<()> {
    ensure_packages(PACKAGES, false)
}

/// What the demo (`cargo xtask run` without a config) runs besides lb: `ip`.
pub fn demo_packages() -> anyhow::Result<()> {
    ensure_packages(&PACKAGES[..1], false)
}

/// What only `cargo xtask bench` needs: the end-to-end benchmark's other baseline.
const BENCH_PACKAGES: &[(&str, &str)] = &[("haproxy", "haproxy")];

pub fn run(root: &Path, verbose: bool) -> anyhow::Result<()> {
    let userspace = Pin::read(root, pins::USERSPACE_FILE).map_err(anyhow::Error::msg)?;
    let ebpf = Pin::read(root, pins::EBPF_FILE).map_err(anyhow::Error::msg)?;
    ensure_toolchain(&userspace, verbose)?;
    ensure_toolchain(&ebpf, verbose)?;
    ensure_override(root, &userspace.channel, verbose)?;
    ensure_override(&root.join("lb-ebpf"), &ebpf.channel, verbose)?;
    ensure_bpf_linker(&ebpf.channel, verbose)?;
    if verbose {
        println!("setup: everything is in place");
    }
    Ok(())
}

/// `pin.channel` installed with every component of `pin.components`.
fn ensure_toolchain(pin: &Pin, verbose: bool) -> anyhow::Result<()> {
    let channel = pin.channel.as_str();
    let installed = output(
        "rustup",
        &["component", "list", "--toolchain", channel, "--installed"],
    );
    let Some(list) = installed else {
        println!("setup: installing the {channel} toolchain");
        let mut cmd = Command::new("rustup");
        cmd.args(["toolchain", "install", channel, "--profile", "minimal"]);
        for component in &pin.components {
            cmd.args(["--component", component]);
        }
        return run_cmd(&mut cmd);
    };
    // `rustup component list --installed` names most components with the host triple
    // (`clippy-x86_64-unknown-linux-gnu`) but `rust-src` without.
    let missing: Vec<&str> = pin
        .components
        .iter()
        .map(String::as_str)
        .filter(|c| {
            !list
                .lines()
                .any(|l| l == *c || l.strip_prefix(c).is_some_and(|t| t.starts_with('-')))
        })
        .collect();
    if missing.is_empty() {
        if verbose {
            println!(
                "setup: {channel} present with {}",
                pin.components.join(", ")
            );
        }
        return Ok(());
    }
    println!("setup: adding {} to {channel}", missing.join(", "));
    run_cmd(
        Command::new("rustup")
            .args(["component", "add", "--toolchain", channel])
            .args(&missing),
    )
}

/// `dir`'s rustup directory override is `channel` (kept in rustup's settings, by path).
fn ensure_override(dir: &Path, channel: &str, verbose: bool) -> anyhow::Result<()> {
    let dir_str = dir.to_string_lossy();
    let current = output("rustup", &["override", "list"]).unwrap_or_default();
    let set = current.lines().any(|line| {
        let mut parts = line.split_whitespace();
        parts.next() == Some(&*dir_str)
            && parts
                .next()
                .is_some_and(|t| t == channel || t.starts_with(&format!("{channel}-")))
    });
    if set {
        if verbose {
            println!("setup: {} uses {channel}", dir.display());
        }
        return Ok(());
    }
    println!(
        "setup: {} now uses {channel} (rustup override)",
        dir.display()
    );
    run_cmd(
        Command::new("rustup")
            .args(["override", "set", channel, "--path"])
            .arg(dir),
    )
}

/// The bpf-linker in `pins::prefix(channel)`, built against `channel`'s libLLVM: kept when
/// it is the pinned release and its libLLVM resolves to that nightly's, rebuilt otherwise.
fn ensure_bpf_linker(channel: &str, verbose: bool) -> anyhow::Result<()> {
    let llvm = nightly_llvm(channel)?;
    let llvm_name = llvm
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a libLLVM file name")
        .to_owned();
    let linker = pins::bpf_linker(channel);
    match bpf_linker_state(&linker, &llvm_name) {
        LinkerState::Ready => {
            if verbose {
                println!("setup: bpf-linker {BPF_LINKER_VERSION} for {llvm_name} present");
            }
            return Ok(());
        }
        LinkerState::Missing => println!(
            "setup: building bpf-linker {BPF_LINKER_VERSION} against {channel}'s libLLVM \
             (one to a few minutes)"
        ),
        LinkerState::Stale(why) => println!(
            "setup: rebuilding {} ({why}) against {channel}'s libLLVM",
            linker.display()
        ),
    }
    let major = llvm_major(&llvm_name)?;
    let prefix = pins::prefix(channel);
    let prefix_lib = prefix.join("lib");
    std::fs::create_dir_all(&prefix_lib)?;
    for name in ["libLLVM.so", llvm_name.as_str()] {
        let link = prefix_lib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&llvm, &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    run_cmd(
        Command::new("cargo")
            .arg(format!("+{channel}"))
            .args([
                "install",
                "bpf-linker",
                "--version",
                &format!("={BPF_LINKER_VERSION}"),
                "--locked",
                "--force",
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
                "--root",
            ])
            .arg(&prefix)
            .env("LLVM_PREFIX", &prefix)
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC"),
    )?;
    match bpf_linker_state(&linker, &llvm_name) {
        LinkerState::Ready => Ok(()),
        LinkerState::Missing => bail!("{} was not installed", linker.display()),
        LinkerState::Stale(why) => bail!("the new {}: {why}", linker.display()),
    }
}

enum LinkerState {
    Ready,
    Missing,
    Stale(String),
}

/// Whether `linker` runs, is the pinned release and loads `llvm_name` (checked with
/// `ldd`, which names each needed library and where it resolved).
fn bpf_linker_state(linker: &Path, llvm_name: &str) -> LinkerState {
    if !linker.exists() {
        return LinkerState::Missing;
    }
    let version = output(&linker.to_string_lossy(), &["--version"]);
    let expected = format!("bpf-linker {BPF_LINKER_VERSION}");
    match version.as_deref().map(str::trim) {
        Some(v) if v == expected => {}
        Some(v) => return LinkerState::Stale(format!("{v}, not {BPF_LINKER_VERSION}")),
        None => return LinkerState::Stale("it does not run".into()),
    }
    let libs = output("ldd", &[&linker.to_string_lossy()]).unwrap_or_default();
    let llvm_line = libs
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("libLLVM"));
    match llvm_line {
        Some(line) if line.starts_with(llvm_name) && !line.contains("not found") => {
            LinkerState::Ready
        }
        Some(line) => LinkerState::Stale(format!("it loads {line}, not {llvm_name}")),
        None => LinkerState::Stale("it loads no libLLVM".into()),
    }
}

/// The nightly's own `libLLVM.so.<major>.<minor>-rust-<version>` in its sysroot.
fn nightly_llvm(channel: &str) -> anyhow::Result<PathBuf> {
    let sysroot = output("rustc", &[&format!("+{channel}"), "--print", "sysroot"])
        .with_context(|| format!("rustc +{channel} --print sysroot"))?;
    let lib_dir = PathBuf::from(sysroot.trim()).join("lib");
    std::fs::read_dir(&lib_dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        })
        .with_context(|| format!("no libLLVM.so.*-rust-* in {}", lib_dir.display()))
}

/// `libLLVM.so.23.1-rust-1.101.0-nightly` -> 23.
fn llvm_major(name: &str) -> anyhow::Result<u32> {
    name.strip_prefix("libLLVM.so.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("cannot read the LLVM version from {name}"))
}

/// Installs the benchmarks' extra Debian packages when they are missing.
pub fn bench_packages() -> anyhow::Result<()> {
    ensure_packages(BENCH_PACKAGES, false)
}

fn ensure_packages(packages: &[(&str, &str)], verbose: bool) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(_, probe)| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {probe}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        if verbose {
            println!("setup: Debian packages present");
        }
        return Ok(());
    }
    println!("setup: installing {}", missing.join(" "));
    run_cmd(Command::new("apt-get").arg("update").arg("-q"))?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("running {shown}"))?;
    if !status.success() {
        bail!("{shown} failed: {status}");
    }
    Ok(())
}
