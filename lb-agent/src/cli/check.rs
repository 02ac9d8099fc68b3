//! `lb-agent check-config`: validate a config and print every probe's bounds (TR7).

use std::{path::Path, process::ExitCode};

use lb_agent::config;

pub fn check(path: &Path) -> anyhow::Result<ExitCode> {
    let cfg = match config::load(path) {
        Ok(cfg) => cfg,
        Err(err) => {
            eprintln!("{err}");
            return Ok(ExitCode::from(2));
        }
    };
    println!(
        "{}: valid, {} service(s)",
        path.display(),
        cfg.services.len()
    );
    for svc in &cfg.services {
        println!(
            "service {} {} {:?} {:?}: {} server(s), {} probe(s)",
            svc.name,
            svc.vip,
            svc.protocol,
            svc.forwarding,
            svc.servers.len(),
            svc.probes.len()
        );
        for probe in &svc.probes {
            let b = config::detection_bounds(probe);
            println!(
                "  probe {} ({:?}): a dead server leaves traffic within {:?} (+ propagation < 1ms); \
                 recovery takes {:?} to {:?}",
                probe.name, probe.kind, b.detect_worst, b.recover_min, b.recover_max
            );
        }
    }
    if let Some(warning) = config::non_loopback_api(&cfg.agent) {
        println!("warning: {warning}");
    }
    if let Err(why) = lb_agent::host::check_snat_ips(&cfg) {
        println!("warning: {why} (lb-agent run refuses this config on this host)");
    }
    for warning in config::warnings(&cfg) {
        println!("warning: {warning}");
    }
    Ok(ExitCode::SUCCESS)
}
