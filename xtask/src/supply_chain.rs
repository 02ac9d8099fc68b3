//! `cargo xtask supply-chain`: `cargo deny check licenses bans sources` against
//! `deny.toml`, with a pinned cargo-deny installed from crates.io on first use into
//! `$CARGO_HOME/lb-toolchain/cargo-deny-<version>/`, built unoptimised and without debug
//! info (about 45 s and 70 CPU-seconds, against two minutes and 200 optimised; a check
//! then takes about a second instead of half of one).
//! The advisories check is left out: its database is fetched from GitHub, which this
//! machine kind cannot reach.

use std::{path::Path, process::Command};

use anyhow::{Context, bail};

use crate::pins;

/// The cargo-deny release used.
const CARGO_DENY_VERSION: &str = "0.20.2";

pub fn run(root: &Path, userspace_channel: &str) -> anyhow::Result<()> {
    let prefix = pins::cargo_home()
        .join("lb-toolchain")
        .join(format!("cargo-deny-{CARGO_DENY_VERSION}"));
    let deny = prefix.join("bin/cargo-deny");
    if !deny.exists() {
        println!("supply-chain: building cargo-deny {CARGO_DENY_VERSION} (about a minute)");
        let status = Command::new("cargo")
            .arg(format!("+{userspace_channel}"))
            .args([
                "install",
                "cargo-deny",
                "--version",
                &format!("={CARGO_DENY_VERSION}"),
                "--locked",
                "--debug",
                "--root",
            ])
            .arg(&prefix)
            .env("CARGO_PROFILE_DEV_DEBUG", "0")
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .status()
            .context("running cargo install cargo-deny")?;
        if !status.success() {
            bail!("installing cargo-deny {CARGO_DENY_VERSION} failed: {status}");
        }
    }
    let status = Command::new(&deny)
        .args(["check", "licenses", "bans", "sources"])
        .current_dir(root)
        .status()
        .with_context(|| format!("running {}", deny.display()))?;
    if !status.success() {
        bail!("cargo deny check licenses bans sources failed ({status}); see deny.toml");
    }
    Ok(())
}
