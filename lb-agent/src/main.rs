//! `lb-agent`: the command-line entry point (run, check-config).

mod cli;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

fn main() -> ExitCode {
    // The long version names the commit and the XDP object's hash (computed at run time
    // from the embedded object).
    let matches = cli::Cli::command()
        .version(lb_agent::build_info::long_version())
        .get_matches();
    let args = match cli::Cli::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(err) => err.exit(),
    };
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("lb-agent: error: {err:#}");
            ExitCode::from(1)
        }
    }
}
