//! Optional pins of the maps (`agent.pin_path`), for inspection with `bpftool map
//! pinned` and as the scope of the pin-directory lock.
//!
//! Restarts do not depend on them (docs/restarts.md): the program is attached through
//! netlink and a restarted agent finds its maps through the interface. Pins made by an
//! older agent (maps and the `link_xdp_<interface>` bpf_link) are replaced at start;
//! `lb-agent detach` removes the directory.

use std::{
    ffi::CString,
    io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        Xdp,
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
    },
};

use crate::dataplane::DataplaneError;

/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// Where bpffs is normally mounted.
const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// A bpffs directory holding one agent's pins.
#[derive(Clone, Debug)]
pub struct PinDir {
    dir: PathBuf,
}

impl PinDir {
    /// Makes sure bpffs is mounted under `dir` (mounting it at `/sys/fs/bpf` when that
    /// is where `dir` lives and nothing is mounted yet) and creates `dir`. Earlier pins
    /// stay until [`PinDir::pin_all`] replaces them.
    pub fn prepare(dir: &Path) -> Result<Self, DataplaneError> {
        ensure_bpffs(dir)?;
        std::fs::create_dir_all(dir).map_err(|source| DataplaneError::Io {
            what: "creating the pin directory",
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Where map `name` is pinned.
    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Where an older lb-agent pinned the XDP bpf_link for `interface`.
    pub fn legacy_link(&self, interface: &str) -> PathBuf {
        self.dir.join(format!("link_xdp_{interface}"))
    }

    /// Pins the maps `names` of `ebpf` here, replacing earlier pins of the same name.
    pub fn pin_all(&self, ebpf: &Ebpf, names: &[&'static str]) -> Result<(), DataplaneError> {
        for &name in names {
            let map = ebpf.map(name).ok_or(DataplaneError::MissingMap { name })?;
            let path = self.map(name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(DataplaneError::Io {
                        what: "removing an earlier pin in pin_path",
                        source,
                    });
                }
            }
            map.pin(&path).map_err(|e| DataplaneError::Io {
                what: "pinning a map in pin_path",
                source: io::Error::other(e.to_string()),
            })?;
        }
        Ok(())
    }
}

/// Removes a pin directory and everything in it; returns how many pins there were, or
/// `None` when the directory did not exist. (Removing an older agent's link pin
/// detaches its program once no process holds the link.)
pub fn remove(dir: &Path) -> io::Result<Option<usize>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            let mut n = 0;
            for entry in entries {
                std::fs::remove_file(entry?.path())?;
                n += 1;
            }
            std::fs::remove_dir(dir)?;
            Ok(Some(n))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces the program of the bpf_link pinned at `path` (an older agent's) with `prog`,
/// atomically (`BPF_LINK_UPDATE`).
pub(in crate::dataplane) fn swap_into_legacy_link(
    prog: &mut Xdp,
    path: &Path,
) -> Result<(), DataplaneError> {
    let err = |e: String| DataplaneError::Io {
        what: "swapping the program into the older agent's pinned bpf_link",
        source: io::Error::other(e),
    };
    let pinned = PinnedLink::from_pin(path).map_err(|e| err(e.to_string()))?;
    let link = XdpLink::try_from(FdLink::from(pinned)).map_err(|e| err(e.to_string()))?;
    prog.attach_to_link(link).map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// Mounts a bpffs on `dir` (in this process's mount namespace).
pub(in crate::dataplane) fn mount_bpffs(dir: &Path) -> io::Result<()> {
    let target = CString::new(dir.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    let fstype = CString::new("bpf").expect("no NUL");
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn ensure_bpffs(dir: &Path) -> Result<(), DataplaneError> {
    let mut probe = dir.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    if is_bpffs(&probe) {
        return Ok(());
    }
    if dir.starts_with(BPFFS_ROOT)
        && Path::new(BPFFS_ROOT).exists()
        && !is_bpffs(Path::new(BPFFS_ROOT))
    {
        let mounted = mount_bpffs(Path::new(BPFFS_ROOT));
        if mounted.is_ok() {
            if private_mount_namespace() {
                tracing::info!(
                    "mounted bpffs at {BPFFS_ROOT} in this process's own mount namespace (as \
                     under `ip netns exec`): the pins vanish when the agent exits; restarts do \
                     not need them"
                );
            } else {
                tracing::info!("mounted bpffs at {BPFFS_ROOT}");
            }
            return Ok(());
        }
        return Err(DataplaneError::Io {
            what: "mounting bpffs at /sys/fs/bpf (needed for pin_path)",
            source: mounted.unwrap_err(),
        });
    }
    Err(DataplaneError::Io {
        what: "pin_path is not on a bpffs mount (mount -t bpf bpf DIR, or use /sys/fs/bpf/...)",
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })
}

pub(in crate::dataplane) fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    }
}

/// Whether this process has a mount namespace of its own (not init's): mounts it makes
/// vanish with it. A process that is PID 1 of its PID namespace is a container's init
/// (its /proc/1 is itself): its mount namespace is the container's, gone with it.
pub fn private_mount_namespace() -> bool {
    if std::process::id() == 1 {
        return true;
    }
    match (
        std::fs::read_link("/proc/self/ns/mnt"),
        std::fs::read_link("/proc/1/ns/mnt"),
    ) {
        (Ok(own), Ok(init)) => own != init,
        _ => false,
    }
}
