//! `lb-agent detach`: removes lb's XDP program from the interface and the pins from
//! `agent.pin_path`, refusing while an agent owns them, and saying what it found.
//! Run it in the agent's network namespace (`ip netns exec NS lb-agent detach ...`).

use std::{path::Path, process::ExitCode};

use anyhow::Context;
use lb_agent::{
    config,
    dataplane::{
        self, DataplaneError,
        adopt::{self, owner, pin},
    },
};

pub fn detach(config_path: &Path, interface: Option<String>) -> anyhow::Result<ExitCode> {
    let cfg = match config::load(config_path) {
        Ok(cfg) => cfg,
        Err(err) => {
            eprintln!("lb-agent: {err}");
            return Ok(ExitCode::from(2));
        }
    };
    let interface = interface
        .or_else(|| cfg.agent.interface.clone())
        .context("no interface: set `agent.interface` in the config or pass --interface")?;
    let ifindex = dataplane::if_index(&interface).context(
        "run detach in the agent's network namespace (`ip netns exec NS lb-agent detach ...`)",
    )?;
    if let Some(owner) = owner::interface_owner(ifindex) {
        eprintln!(
            "lb-agent: refusing to detach: a running lb-agent owns `{interface}`: {owner}. Stop it \
             first (`kill -TERM {pid}`, or `systemctl stop lb-agent`; it leaves the program \
             attached), then run detach again.",
            pid = owner.pid
        );
        return Ok(ExitCode::FAILURE);
    }
    let pin_dir = cfg.agent.pin_path.as_deref();
    if let Some(owner) = pin_dir
        .filter(|d| d.is_dir())
        .and_then(owner::pin_dir_owner)
    {
        eprintln!(
            "lb-agent: refusing to detach: a running lb-agent holds the pin directory {}: {owner}. \
             Stop it first.",
            pin_dir.map(Path::display).expect("checked above")
        );
        return Ok(ExitCode::FAILURE);
    }
    let mut code = ExitCode::SUCCESS;
    match adopt::attached_program(ifindex, &interface)? {
        None => println!("`{interface}` runs no XDP program: nothing to detach"),
        Some(p) if !p.is_ours() => {
            eprintln!(
                "lb-agent: `{interface}` runs XDP program id {} `{}` ({}), which is not lb's: left \
                 in place",
                p.id,
                p.name,
                p.mode.name()
            );
            code = ExitCode::FAILURE;
        }
        Some(p) => match dataplane::detach(ifindex, &interface, &p) {
            Ok(()) => println!(
                "detached lb's XDP program (id {}, {}) from `{interface}`",
                p.id,
                p.mode.name()
            ),
            Err(DataplaneError::Netlink { source, .. })
                if source.errno() == Some(libc::EBUSY) && pin_dir.is_some() =>
            {
                // Held by a bpf_link an older agent pinned: removing the pins detaches it.
                println!(
                    "program id {} on `{interface}` is held by an older agent's pinned link; \
                     removing the pins detaches it",
                    p.id
                );
            }
            Err(err) => return Err(err.into()),
        },
    }
    if let Some(dir) = pin_dir {
        match pin::remove(dir).with_context(|| format!("removing {}", dir.display()))? {
            Some(n) => println!("removed {} ({n} pins)", dir.display()),
            None => println!("no pin directory at {}", dir.display()),
        }
    }
    Ok(code)
}
