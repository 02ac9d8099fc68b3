//! Shell completions (clap_complete) and man pages (clap_mangen) made from the command
//! line's own definition, so that they cannot drift from it; the package ships both.

use std::{io::Write, path::Path};

use anyhow::Context;
use clap::CommandFactory;

use super::Cli;

/// Writes the completion script for `shell` to `out` (a closed pipe is an error, not a
/// panic).
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "lb-agent", &mut script);
    out.write_all(&script)
        .and_then(|()| out.flush())
        .context("writing the completion script")
}

/// Writes `lb-agent.8` and `lb-agent-<command>.8` for every visible command into `dir`.
pub fn manpages(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cmd = Cli::command()
        .version(lb_agent::build_info::VERSION)
        .long_version(lb_agent::build_info::long_version());
    write_page(dir, "lb-agent", cmd.clone())?;
    for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
        let name = format!("lb-agent-{}", sub.get_name());
        write_page(dir, &name, sub.clone().name(name.clone()))?;
    }
    Ok(())
}

fn write_page(dir: &Path, name: &str, cmd: clap::Command) -> anyhow::Result<()> {
    let path = dir.join(format!("{name}.8"));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .section("8")
        .render(&mut page)
        .with_context(|| format!("rendering {name}.8"))?;
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))
}
