//! What the operator scenarios (systemd unit, container) share: the agent's config as an
//! operator writes it (the built-in paths of the socket and the state file), waiting
//! for a confined process to end, and reading what the kernel says about it.

use std::{
    path::{Path, PathBuf},
    process::ExitStatus,
    thread,
    time::{Duration, Instant},
};

use crate::{
    agent::daemon::AgentConfig,
    util::{error::Error, process::NsProcess},
};

/// The line of an agent that took over the running program's maps.
pub const ADOPTED: &str = "adopted the previous state";
/// The line of an agent that found nothing to adopt.
pub const FRESH: &str = "starting fresh";
/// How long a stop may take (Docker's `stop` waits 10 s before SIGKILL).
pub const STOP_BOUND: Duration = Duration::from_secs(10);

/// `lb-agent`'s built binary, next to the test binaries (`cargo build --bins`).
pub fn agent_binary() -> PathBuf {
    crate::agent::daemon::locate_binary("lb-agent").expect("lb-agent binary (cargo build --bins)")
}

/// The repository's `contrib/` file `name`.
pub fn contrib(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("contrib")
        .join(name)
}

/// `config` as an operator writes it: no `api_socket`, `state_file` (the built-in
/// `/run/lb-agent/lb-agent.sock` and `/var/lib/lb-agent/admin-state.json`, which the
/// confinement maps to directories of the test).
pub fn operator_config_text(config: &AgentConfig) -> String {
    config
        .render()
        .lines()
        .filter(|l| !l.starts_with("api_socket =") && !l.starts_with("state_file ="))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Writes [`operator_config_text`] to `path`.
pub fn write_operator_config(path: &Path, config: &AgentConfig) {
    std::fs::write(path, operator_config_text(config))
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Waits up to `bound` for `process` to end without signalling it; `None` when it is
/// still running.
pub fn wait_exit(process: &mut NsProcess, bound: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + bound;
    loop {
        match process.try_status() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            Ok(None) => return None,
            Err(e) => panic!("waiting for {}: {e}", process.label()),
        }
    }
}

/// Runs `process` to its end (bounded by `bound`); its status and its whole output.
pub fn run_to_end(mut process: NsProcess, bound: Duration) -> (ExitStatus, String) {
    let status = wait_exit(&mut process, bound).unwrap_or_else(|| {
        panic!(
            "{} did not end within {bound:?}:\n{}",
            process.label(),
            process.tail(30)
        )
    });
    // The readers may still hold the last lines: a moment for them.
    thread::sleep(Duration::from_millis(100));
    (status, process.lines().join("\n"))
}

/// The line of `process`'s log containing `needle`, or a panic with its tail.
pub fn line_with(process: &NsProcess, needle: &str, what: &str) -> String {
    process
        .lines()
        .into_iter()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| {
            panic!(
                "{what}: no line with {needle:?}; last lines:\n{}",
                process.tail(30)
            )
        })
}

/// The adoption line names one service and three servers, every map kept.
pub fn assert_adopted(process: &NsProcess, what: &str) {
    let line = line_with(process, ADOPTED, what);
    assert!(
        line.contains("services=1") && line.contains("backends=3") && line.contains("maps_fresh=0"),
        "{what}: the adoption should name 1 service, 3 backends and keep every map: {line}"
    );
    println!("{what}: {line}");
}

/// Sends `signal` to `pid` (a process the test started, directly or as a child).
pub fn kill(pid: u32, signal: i32) -> Result<(), Error> {
    // SAFETY: kill(2) on a pid of a process this test started and has not reaped.
    if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
        return Err(Error::Io {
            what: format!("sending signal {signal} to pid {pid}"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The `/proc/PID/limits` row of `resource` (e.g. "Max open files"): soft and hard.
pub fn limit(pid: u32, resource: &str) -> Option<(String, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let row = text.lines().find(|l| l.starts_with(resource))?;
    let mut words = row[resource.len()..].split_whitespace();
    Some((words.next()?.to_owned(), words.next()?.to_owned()))
}

/// The state letter of `pid` (`R`, `S`, `Z`…) from `/proc/PID/stat`.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}
