//! Reloading the configuration while the loop runs: read it from its source, warn about
//! `[agent]` keys that need a restart, apply it as a diff; a configuration that cannot
//! be read or applied leaves the running one in force.

use std::path::{Path, PathBuf};

use tracing::{info, warn};

use crate::{
    agent::{Agent, Neighbours},
    api::ReloadOutcome,
    config::{self, AgentConfig, Config},
    dataplane::Dataplane,
    probe::Prober,
};

/// Where a reload reads the configuration from.
pub trait ConfigSource {
    /// Names the source in the log.
    fn origin(&self) -> &Path;

    /// The configuration to apply; the error says why there is none.
    fn load(&self) -> Result<Config, String>;
}

/// The configuration file `lb-agent run` was started with: parsed and validated, its
/// `snat_ip`s checked against this host's addresses and its dsr backends against the
/// routes out of `interface`.
pub struct ConfigFile {
    path: PathBuf,
    interface: String,
}

impl ConfigFile {
    pub fn new(path: PathBuf, interface: String) -> Self {
        ConfigFile { path, interface }
    }
}

impl ConfigSource for ConfigFile {
    fn origin(&self) -> &Path {
        &self.path
    }

    fn load(&self) -> Result<Config, String> {
        let cfg = config::load(&self.path).map_err(|err| err.to_string())?;
        crate::host::check_snat_ips(&cfg)
            .and_then(|()| crate::doctor::dsr_segment::check(&cfg, &self.interface))
            .map_err(|why| format!("{}: {why}", self.path.display()))?;
        Ok(cfg)
    }
}

/// Reads `source` and applies it to `agent` as a diff. Logs `config reloaded` (with a
/// warning naming `[agent]` keys that need a restart) or `reload failed: …`. `running` is
/// the `[agent]` table in force.
pub async fn reload<D: Dataplane, P: Prober, N: Neighbours>(
    agent: &mut Agent<D, P, N>,
    source: &dyn ConfigSource,
    running: &AgentConfig,
) -> Result<ReloadOutcome, String> {
    let new_cfg = match source.load() {
        Ok(cfg) => cfg,
        Err(why) => {
            warn!(error = %why, "reload failed: the running config stays in force");
            return Err(why);
        }
    };
    let mut warnings = Vec::new();
    let restart_only = config::restart_only_changes(running, &new_cfg.agent);
    if !restart_only.is_empty() {
        warn!(keys = restart_only.0.join(", "), "{restart_only}");
        warnings.push(restart_only.to_string());
    }
    if agent.cluster().map(crate::cluster::Cluster::config) != new_cfg.cluster.as_ref() {
        let why = "[cluster] changed: it applies at the next restart (the running members, \
                   key and port slices stay in force)";
        warn!("{why}");
        warnings.push(why.to_string());
    }
    let path = source.origin().display();
    match agent.apply_config_reporting(&new_cfg).await {
        Ok(report) => {
            warnings.extend(
                report
                    .dropped
                    .iter()
                    .map(|d| format!("runtime admin state dropped: {d}")),
            );
            log_passive_gaps(&new_cfg);
            if warnings.is_empty() {
                info!(path = %path, "config reloaded");
            } else {
                info!(path = %path, warnings = warnings.len(), "config reloaded (with warnings)");
            }
            Ok(ReloadOutcome { warnings })
        }
        Err(err) => {
            warn!(error = %err, "reload failed while publishing");
            Err(format!("publishing the new config failed: {err}"))
        }
    }
}

/// Says, once per service, where `max_fails` is set but passive checks see little or
/// nothing (udp, dsr: docs/passive-signals.md), so that `max_fails = 1` is not taken for
/// protection.
pub fn log_passive_gaps(cfg: &Config) {
    for svc in &cfg.services {
        if let Some(gap) = config::passive_gap(svc) {
            warn!(service = %svc.name, "passive checks: {gap}");
        }
    }
}
