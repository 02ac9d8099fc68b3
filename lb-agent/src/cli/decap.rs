//! `lb-agent decap attach|detach --interface IF`: lb's decapsulation program on a backend
//! of `ipip` / `gue` services (docs/tunnel.md), for hosts without the kernel's ipip /
//! fou modules. Run it in the backend's network namespace.

use std::{net::IpAddr, process::ExitCode};

use anyhow::Context;
use lb_agent::dataplane::{self, AttachMode, adopt, attach::decap};

/// Attaches `lb_decap` to `interface` for `addresses` (none: the interface's own),
/// replacing a `lb_decap` already there; refuses another program.
pub fn attach(
    interface: &str,
    addresses: Vec<IpAddr>,
    mode: AttachMode,
) -> anyhow::Result<ExitCode> {
    let ifindex = dataplane::if_index(interface)?;
    let addrs = if addresses.is_empty() {
        lb_agent::host::interface_addresses(interface)
            .with_context(|| format!("listing the addresses of `{interface}`"))?
    } else {
        addresses
    };
    if addrs.is_empty() {
        anyhow::bail!(
            "`{interface}` has no address: give the tunnel's outer destinations with --address"
        );
    }
    if addrs.len() > lb_common::DECAP_ADDRS_MAX as usize {
        anyhow::bail!(
            "{} addresses: at most {} (--address)",
            addrs.len(),
            lb_common::DECAP_ADDRS_MAX
        );
    }
    let there = adopt::attached_program(ifindex, interface)?;
    if let Some(p) = &there
        && !decap::is_decap(p)
    {
        return Err(p.in_the_way(interface).into());
    }
    let used = decap::attach_decap(ifindex, interface, &addrs, mode, there.as_ref())?;
    let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    println!(
        "lb_decap attached to `{interface}` ({}): tunnel packets to {} are decapsulated",
        used.name(),
        list.join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

/// Removes `lb_decap` from `interface`; leaves any other program in place.
pub fn detach(interface: &str) -> anyhow::Result<ExitCode> {
    let ifindex = dataplane::if_index(interface)?;
    match adopt::attached_program(ifindex, interface)? {
        None => {
            println!("`{interface}` runs no XDP program: nothing to detach");
            Ok(ExitCode::SUCCESS)
        }
        Some(p) if !decap::is_decap(&p) => {
            eprintln!(
                "lb-agent: `{interface}` runs XDP program id {} `{}`, not lb_decap: left in place",
                p.id, p.name
            );
            Ok(ExitCode::FAILURE)
        }
        Some(p) => {
            dataplane::detach(ifindex, interface, &p)?;
            println!("detached lb_decap (id {}) from `{interface}`", p.id);
            Ok(ExitCode::SUCCESS)
        }
    }
}
