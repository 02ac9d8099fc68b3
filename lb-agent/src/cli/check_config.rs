//! `lb-agent check-config`: validate a config and print what it means — every probe's
//! bounds (TR7), the passive checks, each service's combined bound, the warnings
//! (the text is `config::render`, docs/check-config.md).

use std::{path::Path, process::ExitCode};

use lb_agent::config::{self, HostFacts};

pub fn check(path: &Path) -> anyhow::Result<ExitCode> {
    let cfg = match config::load(path) {
        Ok(cfg) => cfg,
        Err(err) => {
            eprintln!("{err}");
            return Ok(ExitCode::from(2));
        }
    };
    let host = HostFacts {
        local_addresses: Some(lb_agent::host::local_addresses().map_err(|e| e.to_string())),
        ephemeral_ports: lb_agent::host::ephemeral_ports().ok(),
        raw_tcp_socket: Some(lb_agent::probe::syn::raw_socket_opens()),
        memory: lb_agent::dataplane::sizing::host_memory(),
    };
    for line in config::render(&cfg, path, &host) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
