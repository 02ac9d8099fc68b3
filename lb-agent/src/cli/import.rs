//! `lb-agent import keepalived|angie FILE`: print the lb.toml converted from another
//! balancer's config (docs/migrating.md). The output is loaded as `check-config` loads a
//! file before it is printed, so what is printed is a config lb accepts.

use std::{io::Write, path::Path, process::ExitCode};

use lb_agent::{config, import};

pub fn import(format: import::Format, file: &Path) -> anyhow::Result<ExitCode> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return Ok(ExitCode::from(2));
        }
    };
    let converted = match import::convert(format, &text, &file.display().to_string()) {
        Ok(converted) => converted,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return Ok(ExitCode::from(2));
        }
    };
    if let Err(e) = config::parse(&converted, Path::new("converted lb.toml")) {
        eprintln!(
            "{}: the converted config does not load ({e}); it was:\n{converted}",
            file.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    let mut out = std::io::stdout().lock();
    match out
        .write_all(converted.as_bytes())
        .and_then(|()| out.flush())
    {
        Ok(()) => Ok(ExitCode::SUCCESS),
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e.into()),
    }
}
