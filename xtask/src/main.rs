//! `cargo xtask`: the project's own commands — setup, supply-chain, clippy-ebpf,
//! build-ebpf, build, prev-release, dist, test, run, bench, fuzz.
//!
//! Every command first makes sure the toolchains are complete (`setup` is idempotent and
//! returns in well under a second when nothing is missing), so a fresh machine needs no
//! manual step.

mod clippy_ebpf;
mod dist;
mod pins;
mod prev_release;
mod setup;
mod supply_chain;
mod test_classes;
// The build scripts' object builder; xtask uses its build step and its nightly cargo.
#[allow(dead_code)]
mod ebpf_build;
mod test_runner;
mod test_schedule;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what a fresh machine lacks: the pinned toolchains and bpf-linker (`test`
    /// and `bench` add the Debian packages they use).
    Setup,
    /// `cargo deny check licenses bans sources` (deny.toml), installing a pinned
    /// cargo-deny on first use.
    SupplyChain,
    /// Clippy with `-D warnings` over the XDP program (lb-ebpf, outside the workspace):
    /// the product build and the `lab` feature.
    ClippyEbpf,
    /// Build the XDP object (lb-ebpf) with the pinned nightly + bpf-linker.
    BuildEbpf,
    /// Build the product (release): target/release/lb-agent, the one file to run.
    Build,
    /// Build the previous release's lb-agent (the commit in tests/previous-release) for
    /// the upgrade scenario, into target/prev-release/<commit>/ (once; `test` does it too).
    PrevRelease,
    /// Build and pack the product: a Debian package, a tarball and the split-off debug
    /// info in target/dist.
    Dist,
    /// Run every test: unit tests, BPF_PROG_TEST_RUN fixtures, network-namespace scenarios
    /// (the last two need root), the package, and in a whole run the supply-chain check.
    /// lb-tests' binaries run as separate processes, up to four at a time as their
    /// classes allow (xtask/src/test_classes.rs).
    Test {
        /// Extra arguments as `cargo test` takes them: cargo options (`--test NAME`
        /// picks the package that has it), a test name filter, `-- <binary args>`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build and run the balancer: with `--config`, `lb-agent run`; without, the
    /// self-contained demo on network namespaces.
    Run {
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Extra arguments for `lb-agent run` (e.g. `--interface eth0`).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Benchmarks next to their baselines; results printed and written to target/bench.
    Bench,
    /// The packet-parser fuzz target: mutated frames through BPF_PROG_TEST_RUN, every
    /// verdict checked against the reference classifier (root; the test suite runs a
    /// bounded 20,000 frames).
    Fuzz {
        /// Frames to feed.
        #[arg(long, default_value_t = 1_000_000)]
        frames: u64,
        /// Seed of the mutator (a failure names the seed and frame to replay).
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    match cli.command {
        Cmd::Setup => setup::run(&root, true),
        Cmd::SupplyChain => {
            setup::run(&root, false)?;
            let channel = pins::Pin::read(&root, pins::USERSPACE_FILE)
                .map_err(anyhow::Error::msg)?
                .channel;
            supply_chain::run(&root, &channel)
        }
        Cmd::ClippyEbpf => {
            setup::run(&root, false)?;
            clippy_ebpf::run(&root, &target_dir(&root))
        }
        Cmd::BuildEbpf => {
            setup::run(&root, false)?;
            build_ebpf(&root)
        }
        Cmd::Build => {
            setup::run(&root, false)?;
            cargo(&["build", "--release", "-p", "lb-agent"])
        }
        Cmd::PrevRelease => {
            setup::run(&root, false)?;
            prev_release::build(&root, &target_dir(&root)).map(|_| ())
        }
        Cmd::Dist => {
            setup::run(&root, false)?;
            dist::run(&root, &target_dir(&root))
        }
        Cmd::Test { args } => {
            setup::run(&root, false)?;
            setup::test_packages()?;
            test(&root, &args)
        }
        Cmd::Run { config, args } => {
            setup::run(&root, false)?;
            cargo(&["build", "--release", "--workspace", "--bins"])?;
            let bin = target_dir(&root).join("release");
            let mut cmd = match config {
                Some(config) => {
                    let mut c = Command::new(bin.join("lb-agent"));
                    c.arg("run").arg("--config").arg(config).args(&args);
                    c
                }
                None => {
                    require_root("the demo creates network namespaces")?;
                    setup::demo_packages()?;
                    let mut c = Command::new(bin.join("lb-demo"));
                    c.arg("--agent").arg(bin.join("lb-agent")).args(&args);
                    c
                }
            };
            status(&mut cmd)
        }
        Cmd::Bench => {
            setup::run(&root, false)?;
            setup::test_packages()?;
            setup::bench_packages()?;
            require_root("benchmarks load XDP programs")?;
            // The end-to-end benchmark runs lb-agent and lb-testserver from target/release.
            cargo(&["build", "--release", "--workspace", "--bins"])?;
            // XDP ns/packet next to the reflector floor, and verdict -> maps written;
            // end to end next to nftables and HAProxy (~1 min); saturation: a UDP flood
            // through one lb core next to nftables (~5 min); probe scale: agent CPU
            // and memory at thousands of tcp targets (~5 min); the ordinary-traffic soak,
            // 10 min per forwarding mode (~21 min).
            for bench in [
                "lb-bench",
                "lb-e2e-bench",
                "lb-flood-bench",
                "lb-probe-bench",
                "lb-soak",
            ] {
                cargo(&[
                    "run",
                    "--release",
                    "-p",
                    "lb-tests",
                    "--bin",
                    bench,
                    "--",
                    "--out",
                    "target/bench",
                ])?;
            }
            // The fast path's cost per step in reduced programs (BENCHMARKS.md §1),
            // with empty and with full tables (~2 min).
            for extra in [None, Some("--full-table")] {
                let mut args = vec![
                    "run",
                    "--release",
                    "-p",
                    "lb-tests",
                    "--bin",
                    "lb-components",
                ];
                if let Some(extra) = extra {
                    args.extend(["--", extra]);
                }
                cargo(&args)?;
            }
            // lb's flow table next to Katran's LRU_HASH at a million live flows (~2 min);
            // cluster sync between two nodes over loopback QUIC: lag into the peer tables,
            // records per core, bulk resync, kernel memory per replica (~2 min).
            for bench in ["lb-fill-bench", "lb-sync-bench"] {
                cargo(&["run", "--release", "-p", "lb-tests", "--bin", bench])?;
            }
            // The dsr ordinary-traffic soak for 60 s (the suite runs it for 20 s).
            cargo_env(&test_runner::BENCH_SOAK, &[test_runner::BENCH_SOAK_ENV])
        }
        Cmd::Fuzz { frames, seed } => {
            setup::run(&root, false)?;
            require_root("the fuzz target loads the XDP program")?;
            let (frames, seed) = (frames.to_string(), seed.to_string());
            cargo(&[
                "run",
                "--release",
                "-p",
                "lb-tests",
                "--bin",
                "lb-fuzz",
                "--",
                "--frames",
                &frames,
                "--seed",
                &seed,
            ])
        }
    }
}

/// Cargo's target directory (`CARGO_TARGET_DIR` or `target/`).
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

fn test(root: &Path, extra: &[String]) -> anyhow::Result<()> {
    let extra = test_runner::Extra::parse(extra).resolve_modules(root);
    let (root_side, unit_side) = extra.sides(root);
    let channel = pins::Pin::read(root, pins::USERSPACE_FILE)
        .map_err(anyhow::Error::msg)?
        .channel;
    // The other crates' tests are built here and run as a light job below.
    if let Some(args) = &unit_side {
        let mut unit = vec!["test", "--workspace", "--exclude", "lb-tests", "--no-run"];
        unit.extend(args.iter().map(String::as_str));
        cargo(&unit)?;
    }
    require_root("BPF fixtures and namespace scenarios need root")?;
    // Build the binaries the scenarios run (lb-agent, lb-testserver) before the tests.
    // The package the packaging test installs and the previous release the upgrade
    // scenario replaces are built beside the tests, at idle priority, and those two wait
    // for them (xtask/src/test_classes.rs, `BUILDS`).
    cargo(&["build", "--workspace", "--bins"])?;
    let bins = match &root_side {
        Some(args) => test_runner::split_modules(
            test_runner::build(Path::new("cargo"), &channel, args)?,
            &root.join("tests"),
        )?,
        None => Vec::new(),
    };
    let unit = unit_side.map(|args| {
        let mut cmd = Command::new("cargo");
        cmd.arg(format!("+{channel}"))
            .args([
                "test",
                "--workspace",
                "--exclude",
                "lb-tests",
                "--no-fail-fast",
            ])
            .args(extra.cargo_test_args(&args))
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .current_dir(root);
        cmd
    });
    // Each binary runs beside what its class allows (xtask/src/test_classes.rs).
    test_runner::run(test_runner::Plan {
        root,
        unit,
        bins,
        extra: &extra,
    })
}

fn build_ebpf(root: &Path) -> anyhow::Result<()> {
    let target_dir = root.join("target/ebpf");
    ebpf_build::build_ebpf(root, &target_dir, &[])?;
    println!(
        "built {}",
        target_dir
            .join("bpfel-unknown-none/release/lb-ebpf")
            .display()
    );
    Ok(())
}

fn require_root(why: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } != 0 {
        bail!("run as root: {why}");
    }
    Ok(())
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// `cargo +<pinned userspace toolchain> args`: through the rustup proxy, not `$CARGO`,
/// because on a fresh machine xtask itself runs on the preinstalled stable.
fn cargo(args: &[&str]) -> anyhow::Result<()> {
    cargo_env(args, &[])
}

/// [`cargo`] with `env` set for it (and the processes it starts).
fn cargo_env(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<()> {
    let channel = pins::Pin::read(&workspace_root(), pins::USERSPACE_FILE)
        .map_err(anyhow::Error::msg)?
        .channel;
    status(
        Command::new("cargo")
            .arg(format!("+{channel}"))
            .args(args)
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .envs(env.iter().copied()),
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

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Cmd};

    fn test_args(argv: &[&str]) -> Vec<String> {
        let mut full = vec!["cargo xtask", "test"];
        full.extend(argv);
        match Cli::try_parse_from(full).expect("parses").command {
            Cmd::Test { args } => args,
            _ => panic!("not test"),
        }
    }

    #[test]
    fn test_takes_cargo_options_a_filter_and_binary_args() {
        assert_eq!(
            test_args(&["--test", "netns_udp", "--", "--nocapture"]),
            ["--test", "netns_udp", "--", "--nocapture"]
        );
        assert_eq!(test_args(&["dsr_ipv6"]), ["dsr_ipv6"]);
        let filtered = test_args(&["--", "dsr_ipv6"]);
        assert_eq!(
            crate::test_runner::Extra::parse(&filtered).binary,
            ["dsr_ipv6"]
        );
    }
}
