//! `lb-agent doctor [--config F] [--interface I]`: the preflight's findings, one line
//! each, then a summary; exit status 1 on a blocker, 2 on a config the agent refuses.

use std::{path::Path, process::ExitCode};

use lb_agent::doctor::{self, Level, Options};

pub async fn doctor(config: Option<&Path>, interface: Option<String>) -> anyhow::Result<ExitCode> {
    let config = match config {
        Some(path) => match lb_agent::config::load(path) {
            Ok(cfg) => Some(cfg),
            Err(err) => {
                println!("blocker  config: {err}");
                return Ok(ExitCode::from(2));
            }
        },
        None => None,
    };
    let interface = interface.or_else(|| config.as_ref().and_then(|c| c.agent.interface.clone()));
    let findings = doctor::run(&Options { config, interface }).await;
    for f in &findings {
        println!("{f}");
    }
    println!("{}", doctor::summary(&findings));
    Ok(if doctor::worst(&findings) == Level::Blocker {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
