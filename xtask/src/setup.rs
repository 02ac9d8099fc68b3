//! `cargo xtask setup`: make a fresh machine able to build and test lb, idempotently.
//!
//! - nightly toolchain with `rust-src` (the eBPF crate builds `core` itself);
//! - bpf-linker built against the nightly's own libLLVM (no system LLVM of that version
//!   exists here): the library is linked into a private prefix and bpf-linker is built
//!   with `LLVM_PREFIX` pointing at it (DESIGN.md §2);
//! - the Debian packages the tests and benchmarks use.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, bail};

/// Debian packages the tests and benchmarks need, with a command that proves each
/// (`chromium`: the status page's browser test; `bird2`: the multi-node scenarios run
/// BIRD in namespaces, docs/multi-node.md).
const PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip"),
    ("chromium", "chromium"),
    ("bird2", "bird"),
];
/// What only `cargo xtask bench` needs: the end-to-end benchmark's baselines.
const BENCH_PACKAGES: &[(&str, &str)] = &[("nftables", "nft"), ("haproxy", "haproxy")];

pub fn run(verbose: bool) -> anyhow::Result<()> {
    ensure_nightly_rust_src(verbose)?;
    ensure_bpf_linker(verbose)?;
    ensure_packages(PACKAGES, verbose)?;
    if verbose {
        println!("setup: everything is in place");
    }
    Ok(())
}

fn ensure_nightly_rust_src(verbose: bool) -> anyhow::Result<()> {
    let installed = output(
        "rustup",
        &["component", "list", "--toolchain", "nightly", "--installed"],
    );
    match installed {
        Some(list) if list.lines().any(|l| l.starts_with("rust-src")) => {
            if verbose {
                println!("setup: nightly rust-src present");
            }
            Ok(())
        }
        Some(_) => {
            println!("setup: adding rust-src to the nightly toolchain");
            run_cmd(Command::new("rustup").args([
                "component",
                "add",
                "rust-src",
                "--toolchain",
                "nightly",
            ]))
        }
        None => {
            println!("setup: installing the nightly toolchain with rust-src");
            run_cmd(Command::new("rustup").args([
                "toolchain",
                "install",
                "nightly",
                "--profile",
                "minimal",
                "--component",
                "rust-src",
            ]))
        }
    }
}

fn ensure_bpf_linker(verbose: bool) -> anyhow::Result<()> {
    if Command::new("bpf-linker")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        if verbose {
            println!("setup: bpf-linker present");
        }
        return Ok(());
    }
    println!("setup: building bpf-linker against the nightly toolchain's libLLVM (about a minute)");
    let sysroot = output("rustc", &["+nightly", "--print", "sysroot"])
        .context("rustc +nightly --print sysroot")?;
    let lib_dir = PathBuf::from(sysroot.trim()).join("lib");
    let llvm = std::fs::read_dir(&lib_dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        })
        .with_context(|| format!("no libLLVM.so.*-rust-* in {}", lib_dir.display()))?;
    let major = llvm_major(&llvm)?;
    let prefix = cargo_home().join("lb-llvm");
    let prefix_lib = prefix.join("lib");
    std::fs::create_dir_all(&prefix_lib)?;
    for name in [
        PathBuf::from("libLLVM.so"),
        PathBuf::from(llvm.file_name().expect("has a file name")),
    ] {
        let link = prefix_lib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&llvm, &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    run_cmd(
        Command::new("cargo")
            .args([
                "+nightly",
                "install",
                "bpf-linker",
                "--locked",
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ])
            .env("LLVM_PREFIX", &prefix)
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC"),
    )
}

/// `libLLVM.so.22.1-rust-1.97.0-nightly` -> 22.
fn llvm_major(lib: &Path) -> anyhow::Result<u32> {
    let name = lib.file_name().and_then(|n| n.to_str()).unwrap_or_default();
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

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
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
