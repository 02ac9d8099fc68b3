//! `lb-agent doctor`: a preflight of this host for the balancer — kernel, privileges,
//! the interface and its driver, sysctls, addresses, bpffs, BIRD — one [`Finding`] per
//! check, each `ok`, `warning` or `blocker` with what to do (docs/doctor.md).
//!
//! Every check only reads: the one thing it creates is the embedded XDP object loaded
//! into the kernel without being attached (its maps and programs are freed when the
//! check returns), which proves the verifier accepts the program here.

mod addresses;
mod bird_socket;
mod bpffs;
mod cluster;
pub mod dsr_segment;
mod ethtool;
mod interface;
mod kernel;
pub mod native_xdp;
mod privileges;
mod sysctl;
mod veth_peer;

use std::fmt;

use crate::config::Config;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Fine as it is (the text may still carry advice).
    Ok,
    /// The balancer runs, but worse than it could or with a risk the text names.
    Warning,
    /// `lb-agent run` fails or the balancer cannot work as configured.
    Blocker,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warning => "warning",
            Level::Blocker => "blocker",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// What was checked, e.g. `kernel`, `rp_filter`, `interface eth0`.
    pub check: String,
    pub level: Level,
    /// What was found and, unless all is well, what to do.
    pub text: String,
}

impl Finding {
    pub fn new(check: impl Into<String>, level: Level, text: impl Into<String>) -> Self {
        Self {
            check: check.into(),
            level,
            text: text.into(),
        }
    }
    pub fn ok(check: impl Into<String>, text: impl Into<String>) -> Self {
        Self::new(check, Level::Ok, text)
    }
    pub fn warning(check: impl Into<String>, text: impl Into<String>) -> Self {
        Self::new(check, Level::Warning, text)
    }
    pub fn blocker(check: impl Into<String>, text: impl Into<String>) -> Self {
        Self::new(check, Level::Blocker, text)
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<8} {}: {}", self.level.name(), self.check, self.text)
    }
}

/// What to check.
#[derive(Debug, Default)]
pub struct Options {
    /// The config the agent will run with (checks that need it are skipped without).
    pub config: Option<Config>,
    /// The interface (`--interface`, else `agent.interface`).
    pub interface: Option<String>,
}

/// Runs every check; the findings in report order.
pub async fn run(opts: &Options) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(kernel::check());
    out.extend(privileges::check());
    let mode = opts
        .config
        .as_ref()
        .map(|c| c.agent.xdp_mode)
        .unwrap_or_default();
    match &opts.interface {
        Some(name) => {
            let found = interface::check(name, mode);
            let exists = found.iter().all(|f| f.check != interface::MISSING);
            out.extend(found);
            if exists {
                out.extend(sysctl::rp_filter(name, opts.config.as_ref()).await);
            }
        }
        None => out.push(Finding::blocker(
            "interface",
            "none given: set `agent.interface` in the config or pass --interface IF",
        )),
    }
    if let Some(cfg) = &opts.config {
        out.extend(sysctl::port_range(cfg));
        out.extend(addresses::snat(cfg, opts.interface.as_deref()));
        out.extend(addresses::dsr(cfg, opts.interface.as_deref()));
        out.extend(bpffs::check(cfg));
        out.extend(bird_socket::check(cfg).await);
        out.extend(cluster::check(cfg).await);
    } else {
        out.push(Finding::ok(
            "config",
            "none given: checks of services, addresses, bpffs and BIRD skipped (--config FILE)",
        ));
    }
    out
}

/// The worst level found.
pub fn worst(findings: &[Finding]) -> Level {
    findings.iter().map(|f| f.level).max().unwrap_or(Level::Ok)
}

/// The closing line: how many of each.
pub fn summary(findings: &[Finding]) -> String {
    let count = |l: Level| findings.iter().filter(|f| f.level == l).count();
    format!(
        "{} ok, {} warnings, {} blockers",
        count(Level::Ok),
        count(Level::Warning),
        count(Level::Blocker)
    )
}

/// Reads a sysctl of this network namespace (`net.ipv4.conf.all.rp_filter`).
fn read_sysctl(key: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/sys/{}", key.replace('.', "/")))
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_says_level_check_and_text_and_the_worst_level_wins() {
        let f = vec![
            Finding::ok("kernel", "6.1"),
            Finding::warning("mtu", "9000"),
            Finding::blocker("rp_filter", "strict"),
        ];
        assert_eq!(f[2].to_string(), "blocker  rp_filter: strict");
        assert_eq!(f[0].to_string(), "ok       kernel: 6.1");
        assert_eq!(worst(&f), Level::Blocker);
        assert_eq!(worst(&f[..2]), Level::Warning);
        assert_eq!(summary(&f), "1 ok, 1 warnings, 1 blockers");
    }
}
