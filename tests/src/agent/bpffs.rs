//! A private bpffs for an agent's pinned maps (`agent.pin_path`), unmounted with the
//! pins in it when dropped, also on panic or Ctrl-C; mounts of dead processes are swept.
//!
//! Not under /sys/fs/bpf: `ip netns exec` remounts /sys in a fresh mount namespace, so a
//! bpffs there is not what the agent in the lb namespace sees. A bpffs mounted under
//! /run, in the harness's (root) mount namespace, is seen by processes started with
//! `ip netns exec` too.

use std::path::{Path, PathBuf};

use crate::util::{cmd, error::Error};

/// Where the mount points go.
const RUN_DIR: &str = "/run";
/// Mount points are `/run/lbt-bpf-<pid>-<tag>`.
const MOUNT_PREFIX: &str = "lbt-bpf-";

/// A bpffs mounted at `/run/lbt-bpf-<pid>-<tag>`; pins go to its `lb` directory.
#[derive(Debug)]
pub struct PrivateBpffs {
    mount: PathBuf,
    pins: PathBuf,
}

impl PrivateBpffs {
    /// Mounts a fresh bpffs for this process and `tag`, after unmounting those that
    /// harness processes which no longer run left behind.
    pub fn mount(tag: &str) -> Result<PrivateBpffs, Error> {
        sweep_stale();
        let mount = PathBuf::from(format!(
            "{RUN_DIR}/{MOUNT_PREFIX}{}-{tag}",
            std::process::id()
        ));
        std::fs::create_dir_all(&mount).map_err(Error::io(format!(
            "creating the bpffs mount point {}",
            mount.display()
        )))?;
        let path = mount.display().to_string();
        if let Err(source) = cmd::run("mount", &["-t", "bpf", "bpf", &path]) {
            let _ = std::fs::remove_dir(&mount);
            return Err(source.context(format!("mounting a bpffs at {path}")));
        }
        Ok(PrivateBpffs {
            pins: mount.join("lb"),
            mount,
        })
    }

    /// The directory for `agent.pin_path` (created by the agent).
    pub fn pins(&self) -> &Path {
        &self.pins
    }
}

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        let _ = lb_agent::dataplane::adopt::pin::remove(&self.pins);
        let path = self.mount.display().to_string();
        if let Err(err) = cmd::run("umount", &[&path]) {
            eprintln!("lb-tests: could not unmount the bpffs at {path}: {err}");
        }
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// Unmounts and removes `/run/lbt-bpf-<pid>-*` of pids that no longer run (a harness
/// process killed by SIGKILL runs no `Drop`).
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(RUN_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(MOUNT_PREFIX)
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        eprintln!(
            "lb-tests: unmounting {} left by a dead process",
            path.display()
        );
        let _ = cmd::run("umount", &[&path.display().to_string()]);
        let _ = std::fs::remove_dir(&path);
    }
}
