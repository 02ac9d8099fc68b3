//! Builds the lab's eBPF object (lb-ebpf with its `lab` feature: the product's programs
//! and maps plus the benchmarks' reflector and reduced programs and the test beds' SYN
//! responder) and tells the crate where it is (`LB_LAB_OBJ_PATH`), for
//! `lb_tests::bpf::lab::OBJECT`. The product object (`lb_agent::EBPF_OBJECT`) never has these.
//!
//! Its own target dir (`target/ebpf-lab`), so it never replaces the product's build.
//! Set `LB_LAB_OBJ=/path/to/object` to embed a prebuilt lab object instead.

#[path = "../xtask/src/pins.rs"]
#[allow(dead_code)] // the userspace half is for xtask
mod pins;

#[path = "../xtask/src/ebpf_build.rs"]
mod ebpf_build;

use std::{env, path::PathBuf};

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir.parent().context("tests has no parent dir")?;
    let out = ebpf_build::Object {
        prebuilt_var: "LB_LAB_OBJ",
        target_subdir: "ebpf-lab",
        features: &["lab"],
        file: "lb-ebpf-lab.o",
    }
    .build(workspace)?;
    println!("cargo:rustc-env=LB_LAB_OBJ_PATH={}", out.display());
    Ok(())
}
