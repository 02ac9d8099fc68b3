//! `agent.pin_path`: on a bpffs, or under /sys/fs/bpf where the agent mounts one.

use std::path::Path;

use crate::config::Config;

use super::Finding;

/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const BPFFS_ROOT: &str = "/sys/fs/bpf";

pub fn check(cfg: &Config) -> Vec<Finding> {
    let check = "bpffs";
    let Some(dir) = &cfg.agent.pin_path else {
        return vec![Finding::ok(
            check,
            "pin_path = \"\": no pins (restarts do not need them)",
        )];
    };
    let mut probe = dir.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    if is_bpffs(&probe) {
        return vec![Finding::ok(
            check,
            format!("pin_path {} is on a bpffs", dir.display()),
        )];
    }
    if dir.starts_with(BPFFS_ROOT) && Path::new(BPFFS_ROOT).exists() {
        return vec![Finding::warning(
            check,
            format!(
                "nothing mounted at {BPFFS_ROOT}: the agent mounts a bpffs there for pin_path \
                 {} (needs CAP_SYS_ADMIN; in a private mount namespace, as under `ip netns \
                 exec`, the pins vanish with the agent); `mount -t bpf bpf {BPFFS_ROOT}` to \
                 keep them",
                dir.display()
            ),
        )];
    }
    vec![Finding::blocker(
        check,
        format!(
            "pin_path {} is not on a bpffs (`run` refuses it): `mount -t bpf bpf DIR` for a \
             parent directory, put it under {BPFFS_ROOT}, or pin_path = \"\" (restarts do not \
             need pins)",
            dir.display()
        ),
    )]
}

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    }
}
