//! `cargo xtask fuzz [--frames N] [--seed S]`: the packet-parser fuzz target for as
//! long as asked (see `lb_tests::bpf::fuzz`). Needs root. Exits non-zero on the first
//! disagreement, printing the frame in hex and both verdicts.

use std::time::Instant;

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let mut frames: usize = 1_000_000;
    let mut seed: u64 = 1;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--frames" => frames = value("--frames")?.parse().context("--frames")?,
            "--seed" => seed = value("--seed")?.parse().context("--seed")?,
            other => bail!("unknown argument `{other}` (use --frames N, --seed S)"),
        }
    }
    let start = Instant::now();
    let report = lb_tests::bpf::fuzz::run(frames, seed).map_err(|e| anyhow::anyhow!("{e}"))?;
    print!("{report}");
    println!(
        "seed {seed}: {frames} frames in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
