//! Unique names for the harness's namespaces and directories, and removal of those that a dead test process left behind.
//!
//! Every name starts with [`PREFIX`], then the pid of the process that made it and a
//! per-process counter: `lbt4242x3`. Names never clash between tests of one process or
//! between processes, and a name whose pid is gone marks leftovers of a test process
//! that was killed before its guards ran.

use std::{
    fs,
    path::Path,
    sync::{
        Once,
        atomic::{AtomicU32, Ordering},
    },
};

/// First letters of every namespace and directory the harness creates.
pub const PREFIX: &str = "lbt";
/// Where `ip netns add` keeps its namespace handles.
pub const NETNS_DIR: &str = "/run/netns";

static COUNTER: AtomicU32 = AtomicU32::new(1);
static SWEEP: Once = Once::new();

/// A fresh tag `lbt<pid>x<n>`, unique in this process and among live processes.
pub fn unique_tag() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{PREFIX}{}x{n}", std::process::id())
}

/// The pid encoded in a harness name, if `name` is one (`lbt<pid>x…`).
pub fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, _) = rest.split_once('x')?;
    pid.parse().ok()
}

/// Removes, once per process, the namespaces and temporary directories that harness
/// processes which no longer run left behind (a test killed by SIGKILL runs no `Drop`).
pub fn sweep_stale_once() {
    SWEEP.call_once(sweep_stale);
}

fn sweep_stale() {
    let dead = |name: &str| {
        owner_pid(name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    if let Ok(entries) = fs::read_dir(NETNS_DIR) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dead(&name) {
                eprintln!("lb-tests: removing namespace {name} left by a dead test process");
                let _ = crate::util::cmd::ip(&["netns", "del", &name]);
            }
        }
    }
    if let Ok(entries) = fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dead(&name) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_unique_and_carry_the_pid() {
        let a = unique_tag();
        let b = unique_tag();
        assert_ne!(a, b);
        assert_eq!(owner_pid(&a), Some(std::process::id()));
        assert_eq!(owner_pid(&format!("{b}-client")), Some(std::process::id()));
        assert_eq!(owner_pid("lbtx1"), None);
        assert_eq!(owner_pid("other"), None);
    }
}
