//! `lb-agent`: the command-line entry point (run, check-config).

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging();
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("lb-agent: error: {err:#}");
            ExitCode::from(1)
        }
    }
}
